"""Offline inspection and verification of a LocalLog directory.

Both functions read the files directly and synchronously and never modify anything: no torn-tail
truncation, no index rebuild, no lock taken. They may run beside a live log, in which case a
frame being written at the tail of the last segment can show up as a torn tail.

Offsets and frame classification follow ``conveyor.streams.log.local`` exactly: a bad final frame
of the last segment with nothing valid after it is a torn tail (what a crash leaves, and what the
next open truncates); any other bad frame is corruption.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

from conveyor.frozen import frozen
from conveyor.streams.log.api import LogCorruption
from conveyor.streams.log.local import (
    ScanResult,
    decode_frame,
    find_valid_frame,
    list_partitions,
    list_segments,
    partition_dir,
    read_index,
    read_meta,
    scan_segment,
)


@frozen
class BadFrame:
    """Where a check failed: the file, the partition, the record offset and why."""

    path: str
    partition: int
    offset: int
    reason: str


@frozen
class PartitionReport:
    partition: int
    start_offset: int  # first retained offset (records below were trimmed)
    end_offset: int  # offset after the last valid frame
    records: int  # retained records: end_offset - start_offset
    frames: int  # frames checked, including trimmed ones whose segment still exists
    segments: int
    fence: int
    torn_tail: BadFrame | None  # a torn tail the next open would truncate (not an error)
    index_ok: bool  # every index entry points at the frame it claims


@frozen
class VerifyReport:
    ok: bool
    bad: BadFrame | None  # the first corruption found; checking stops there
    partitions: tuple[PartitionReport, ...]

    @property
    def records(self) -> int:
        return sum(p.records for p in self.partitions)

    def as_dict(self) -> dict[str, Any]:
        """Plain data for ``json.dumps``."""
        return {**asdict(self), "records": self.records}


def _log_root(root: str | Path) -> Path:
    path = Path(root)
    if not path.is_dir():
        raise FileNotFoundError(f"no log directory at {path}")
    return path


def verify(root: str | Path) -> VerifyReport:
    """Check every frame of every partition under ``root``; stop at the first bad one."""
    path = _log_root(root)
    reports: list[PartitionReport] = []
    for pid in list_partitions(path):
        try:
            reports.append(_verify_partition(path, pid))
        except LogCorruption as exc:
            bad = BadFrame(exc.path, pid, exc.offset, exc.reason)
            return VerifyReport(False, bad, tuple(reports))
    return VerifyReport(True, None, tuple(reports))


def _verify_partition(root: Path, pid: int) -> PartitionReport:
    pdir = partition_dir(root, pid)
    fence, start = read_meta(pdir)
    segments = list_segments(pdir)
    expected = segments[0][0] if segments else start
    if expected > start:
        raise LogCorruption(str(segments[0][1]), start, f"records {start}..{expected} missing")
    frames, torn, index_ok = 0, None, True
    for i, (base, path) in enumerate(segments):
        if base != expected:
            raise LogCorruption(
                str(path), expected, f"segment starts at offset {base}, expected {expected}"
            )
        result = scan_segment(path, 0, base, last=i == len(segments) - 1)
        if result.bad is not None:
            reason = f"torn tail at byte {result.position}: {result.bad}"
            torn = BadFrame(str(path), pid, result.offset, reason)
        index_ok = index_ok and _index_matches(path, base, result)
        frames += result.offset - base
        expected = result.offset
    return PartitionReport(
        partition=pid,
        start_offset=start,
        end_offset=expected,
        records=max(0, expected - start),
        frames=frames,
        segments=len(segments),
        fence=fence,
        torn_tail=torn,
        index_ok=index_ok,
    )


def _index_matches(path: Path, base: int, scan: ScanResult) -> bool:
    """The writer and the scanner place index entries by the same rule, so every entry on disk
    must be one the full scan found (the index may be shorter, never different)."""
    index, _ = read_index(path, base, path.stat().st_size)
    truth = {(base, 0), *scan.entries}
    return all(entry in truth for entry in zip(index.offsets, index.positions, strict=True))


def inspect(
    root: str | Path,
    partition: int | None = None,
    from_offset: int = 0,
    limit: int | None = None,
) -> Iterator[tuple[int, int, bytes]]:
    """Yield ``(partition, offset, payload)`` of retained records, partition by partition.

    Starts at ``from_offset`` (or the trim start, if later) in each partition; yields at most
    ``limit`` records in all. Stops quietly at a torn tail; raises ``LogCorruption`` at a bad
    frame anywhere else.
    """
    path = _log_root(root)
    remaining = limit
    pids = list_partitions(path) if partition is None else [partition]
    for pid in pids:
        for offset, payload in _partition_records(path, pid, from_offset):
            if remaining is not None:
                if remaining <= 0:
                    return
                remaining -= 1
            yield pid, offset, payload


def _partition_records(root: Path, pid: int, from_offset: int) -> Iterator[tuple[int, bytes]]:
    pdir = partition_dir(root, pid)
    _, start = read_meta(pdir)
    first = max(from_offset, start)
    segments = list_segments(pdir)
    for i, (base, path) in enumerate(segments):
        last = i == len(segments) - 1
        if not last and segments[i + 1][0] <= first:
            continue
        yield from _segment_records(path, base, max(first, base), last=last)


def _segment_records(
    path: Path, base: int, first: int, *, last: bool
) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as f:
        size = f.seek(0, 2)
        if size == 0:
            return
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        offset, position = read_index(path, base, size)[0].floor(first)
        while position < size:
            decoded = decode_frame(buf, position, size)
            if isinstance(decoded, str):
                if last and find_valid_frame(buf, position + 1, size) is None:
                    return  # torn tail: never acknowledged
                raise LogCorruption(str(path), offset, f"{decoded} (byte {position})")
            payload, position = decoded
            if offset >= first:
                yield offset, payload
            offset += 1
    finally:
        buf.close()
