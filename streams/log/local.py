"""LocalLog: the embedded, default durable Log -- one directory of segment files per partition.

Layout::

    root/
      LOCK                              flock'd while a LocalLog has ``root`` open
      p0000/
        meta.json                       {"fence": E, "start": S}, replaced atomically
        00000000000000000000.log        segment whose first record has offset 0
        00000000000000000000.idx        its sparse offset index (derived data)
        00000000000000052113.log        next segment; its first record has offset 52113
        ...

Frame (one per record; integers little-endian)::

    byte 0          4          8                     8 + length
         +----------+----------+---------------------+
         |  length  |   crc    |  payload            |
         |   u32    |   u32    |  (length bytes)     |
         +----------+----------+---------------------+

    crc = crc32c(payload, value=FRAME_SEED)  i.e. crc32c of a fixed tag followed by the payload

Offsets are not stored in frames: record k of a segment has offset ``base + k``, so the index
is what maps offsets to bytes, and a wrong entry would silently shift offsets. Hence each index
entry carries its own checksum (20 bytes, little-endian)::

    +-------------+---------------+----------------------------+
    | offset u64  | position u64  | crc32c(first 16 bytes) u32 |
    +-------------+---------------+----------------------------+

One entry is written for the first frame at or after every ``INDEX_INTERVAL`` bytes (the same
rule when writing and when rebuilding, so a rebuilt index is byte-identical), and the first
entry is always ``(base, 0)``.

The rules, and why:

1. Durable before acknowledged. ``append`` resolves only after its frames were written and the
   segment fdatasync'd. Group commit: appenders queue their batch and await a future; one
   flusher task per partition takes everything queued, writes it with one ``pwrite`` and runs
   one ``fdatasync`` in a worker thread, so the loop keeps queueing the next group meanwhile.
2. Fencing is checked when an append is queued and again when its group is taken for writing.
   The flusher holds the partition lock from taking a group until its futures are resolved, and
   ``seal`` raises the in-memory fence first and then takes the same lock before persisting it,
   so once ``seal`` returns no record with an older epoch can still become durable.
3. The CRC is seeded with a tag so that a zero-filled tail (what a crash can leave after an
   un-synced extend) never decodes as valid empty records.
4. A torn tail is expected after a crash: bad final frame(s) of the LAST segment (partial, bad
   crc, or a length field over ``MAX_RECORD_BYTES``) with no valid frame anywhere after them are
   truncated on open (ftruncate + fsync) and logged. Anything else -- a bad frame followed by a
   valid one, a bad frame in an older segment, records missing between segments, a bad frame met
   by a read -- is ``LogCorruption`` naming the file and record offset: acknowledged data is
   never dropped silently. A false alarm (e.g. a crash that persisted a group's pages out of
   order) is safe; silent truncation is not. A length field is never trusted for an allocation
   beyond ``MAX_RECORD_BYTES``. Corruption found on open halts only that partition: the log
   opens, and every use of the partition raises the error (``corruption(p)`` says why).
5. The index is derived data and is never fsync'd on the hot path (only when its segment rolls).
   Entries are written only after the frames they point at are durable; on open an index that
   is missing, short or implausible is cut to its valid prefix and rebuilt from the segment.
6. ``meta.json`` (fence and trim start) is replaced atomically: write tmp, fsync, rename, fsync
   the directory. ``trim`` persists the new start before deleting segments, so a crash between
   the two only leaves segments that the next open deletes.
7. Every new file (segment, index, partition directory) is followed by an fsync of its
   directory so that a durable record can never live in a file whose name was lost.
8. An I/O error while writing or syncing poisons the partition (``LogFailed``): after a failed
   fdatasync the page cache state is unknown (fsyncgate: the kernel may have dropped the dirty
   pages, so a retried fdatasync would "succeed" without them), so the only safe recovery is to
   reopen the log. The one exception is ENOSPC from the write itself, before any sync: the
   partial group is cut off again, its appends fail with ``LogFull`` (retryable), and the
   partition keeps working once space is freed.
9. Reads see only durable records (``end_offset`` advances after the fdatasync) and check the
   crc of every record they return. They ``pread`` on the loop thread, about 1 MiB per batch at
   most: page-cache hits cost less than a hop to a thread.
10. Every change to files goes through a ``FileIO`` (``fileio.py``); tests substitute one
    that loses unsynced writes at a power cut and injects EIO and ENOSPC.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import fcntl
import json
import logging
import mmap
import os
import queue
import re
import struct
import threading
from array import array
from bisect import bisect_left, bisect_right
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate, pairwise, repeat
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

from crc32c import crc32c

from conveyor.errors import ContractError, ConveyorError, InvariantError, TransientError
from conveyor.streams.log.api import LogCorruption, LogRecord, LogSealed, LogTrimmed
from conveyor.streams.log.fileio import OS_IO, FileIO

logger = logging.getLogger(__name__)

MiB = 1 << 20
MAX_RECORD_BYTES = 16 * MiB
DEFAULT_SEGMENT_BYTES = 64 * MiB
INDEX_INTERVAL = 4096
MAX_GROUP_BYTES = 8 * MiB
READ_BATCH_BYTES = 1 * MiB
INDEX_CACHE_SEGMENTS = 256

FRAME = struct.Struct("<II")
HEADER_BYTES = FRAME.size
INDEX_ENTRY = struct.Struct("<QQI")  # offset, position, crc32c of the first 16 bytes
_INDEX_KEY = struct.Struct("<QQ")
FRAME_SEED = crc32c(b"conveyor.log.v1")
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".idx"
META_NAME = "meta.json"
META_TMP_NAME = "meta.json.tmp"
LOCK_NAME = "LOCK"

_NONZERO = re.compile(rb"[^\x00]")
_PARTITION_DIR = re.compile(r"p(\d{4})")

Buffer: TypeAlias = "bytes | mmap.mmap"
_T = TypeVar("_T")


class LogClosed(ConveyorError):
    """The log was closed; reopen it to use it again."""

    code = "log_closed"


class LogFailed(ConveyorError):
    """A write or fdatasync failed; the partition refuses appends until the log is reopened."""

    code = "log_failed"


class LogFull(TransientError):
    """The disk is full: the append wrote nothing (its partial bytes were cut off again) and the
    partition stays usable; retry once space is freed."""

    code = "log_full"

    def __init__(self, message: str) -> None:
        super().__init__(message, retry_after_ms=1_000)


# --- on-disk format helpers (shared with tools.py) -------------------------------------------


def partition_dir(root: Path, partition: int) -> Path:
    return root / f"p{partition:04d}"


def list_partitions(root: Path) -> list[int]:
    """Partition numbers that have a directory under ``root``, ascending."""
    if not root.is_dir():
        return []
    found = (_PARTITION_DIR.fullmatch(entry.name) for entry in root.iterdir())
    return sorted(int(m.group(1)) for m in found if m is not None)


def segment_path(pdir: Path, base: int) -> Path:
    return pdir / f"{base:020d}{LOG_SUFFIX}"


def index_path(log_path: Path) -> Path:
    return log_path.with_suffix(INDEX_SUFFIX)


def list_segments(pdir: Path) -> list[tuple[int, Path]]:
    """``(base offset, path)`` of every segment file in ``pdir``, ascending."""
    found = []
    for path in pdir.glob(f"*{LOG_SUFFIX}"):
        if len(path.stem) == 20 and path.stem.isdigit():
            found.append((int(path.stem), path))
    return sorted(found)


def read_meta(pdir: Path) -> tuple[int, int]:
    """``(fence, start offset)`` of a partition; ``(0, 0)`` if it has no meta file yet."""
    path = pdir / META_NAME
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return 0, 0
    try:
        meta = json.loads(raw)
        fence, start = meta["fence"], meta["start"]
    except (ValueError, KeyError, TypeError) as exc:
        raise LogCorruption(str(path), 0, f"unreadable meta file: {exc}") from exc
    if not (isinstance(fence, int) and isinstance(start, int) and fence >= 0 and start >= 0):
        raise LogCorruption(str(path), 0, f"invalid meta file contents: {meta!r}")
    return fence, start


class Index:
    """The sparse offset -> byte position index of one segment."""

    __slots__ = ("offsets", "positions")

    def __init__(self, base: int) -> None:
        self.offsets = array("Q", [base])
        self.positions = array("Q", [0])

    def add(self, offset: int, position: int) -> None:
        self.offsets.append(offset)
        self.positions.append(position)

    def floor(self, offset: int) -> tuple[int, int]:
        """The last entry at or before ``offset``."""
        i = bisect_right(self.offsets, offset) - 1
        return self.offsets[i], self.positions[i]

    def last(self) -> tuple[int, int]:
        return self.offsets[-1], self.positions[-1]

    def __len__(self) -> int:
        return len(self.offsets)

    def encode(self, start: int = 0) -> bytes:
        pairs = zip(self.offsets[start:], self.positions[start:], strict=True)
        return b"".join(pack_index_entry(o, p) for o, p in pairs)


def pack_index_entry(offset: int, position: int) -> bytes:
    return INDEX_ENTRY.pack(offset, position, crc32c(_INDEX_KEY.pack(offset, position)))


def unpack_index_entry(raw: bytes, at: int = 0) -> tuple[int, int] | None:
    """The ``(offset, position)`` of the entry at ``raw[at:]``, or None if its crc is wrong."""
    offset, position, crc = INDEX_ENTRY.unpack_from(raw, at)
    if crc32c(memoryview(raw)[at : at + _INDEX_KEY.size]) != crc:
        return None
    return offset, position


def read_index(log_path: Path, base: int, size: int) -> tuple[Index, bool]:
    """Load the valid prefix of a segment's index. Returns ``(index, file_is_exactly_that)``.

    An entry is valid if its crc matches and it continues a plausible chain: offsets and
    positions strictly rising, positions inside the segment, at least one header's worth of
    bytes per record. The first entry must be ``(base, 0)``.
    """
    try:
        raw = index_path(log_path).read_bytes()
    except FileNotFoundError:
        raw = b""
    index = Index(base)
    step = INDEX_ENTRY.size
    if len(raw) < step or unpack_index_entry(raw) != (base, 0):
        return index, False
    prev_o, prev_p = base, 0
    for at in range(step, len(raw) - len(raw) % step, step):
        entry = unpack_index_entry(raw, at)
        if entry is None:
            return index, False
        o, p = entry
        if not (o > prev_o and size > p >= prev_p + HEADER_BYTES * (o - prev_o)):
            return index, False
        index.add(o, p)
        prev_o, prev_p = o, p
    return index, len(raw) % step == 0


def decode_frame(buf: Buffer, position: int, end: int) -> tuple[bytes, int] | str:
    """The frame at ``position``: ``(payload, next position)``, or why it is bad."""
    if end - position < HEADER_BYTES:
        return f"partial frame header ({end - position} of {HEADER_BYTES} bytes)"
    length, crc = FRAME.unpack_from(buf, position)
    if length > MAX_RECORD_BYTES:
        return f"length field {length} exceeds the {MAX_RECORD_BYTES} byte record limit"
    stop = position + HEADER_BYTES + length
    if stop > end:
        return (
            f"frame of {length} bytes runs past the end ({end - position - HEADER_BYTES} present)"
        )
    payload = buf[position + HEADER_BYTES : stop]
    if crc32c(payload, FRAME_SEED) != crc:
        return "crc mismatch"
    return payload, stop


@dataclass(slots=True)
class ScanResult:
    """Where a frame walk stopped, the index entries it passed, and the bad frame, if any."""

    offset: int
    position: int
    entries: list[tuple[int, int]] = field(default_factory=list)
    bad: str | None = None


def scan_frames(buf: Buffer, position: int, offset: int, end: int, next_index: int) -> ScanResult:
    """Check every frame in ``buf[position:end]``; stop at the first bad one."""
    result = ScanResult(offset, position)
    while result.position < end:
        decoded = decode_frame(buf, result.position, end)
        if isinstance(decoded, str):
            result.bad = decoded
            break
        if result.position >= next_index:
            result.entries.append((result.offset, result.position))
            next_index = result.position + INDEX_INTERVAL
        result.position = decoded[1]
        result.offset += 1
    return result


def find_valid_frame(buf: Buffer, position: int, end: int) -> int | None:
    """The first byte position >= ``position`` where a valid frame starts, or None.

    Used to tell a torn tail (garbage to end of file) from corruption (valid data after it).
    A valid header always has a non-zero byte (the seed makes an empty payload's crc non-zero),
    so runs of zeros are skipped with a regex search instead of byte by byte.
    """
    while position + HEADER_BYTES <= end:
        if buf[position] == 0:
            match = _NONZERO.search(buf, position, end)
            if match is None:
                return None
            position = max(position, match.start() - HEADER_BYTES + 1)
        if not isinstance(decode_frame(buf, position, end), str):
            return position
        position += 1
    return None


def _map_file(path: Path) -> mmap.mmap | bytes:
    with path.open("rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return b""
        return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)


def scan_segment(path: Path, position: int, offset: int, *, last: bool) -> ScanResult:
    """Scan a segment file from ``position`` (the frame with ``offset``) to its end.

    A bad frame in the last segment with nothing valid after it is reported as a torn tail
    (``bad`` is set, the caller decides); any other bad frame raises ``LogCorruption``.
    """
    buf = _map_file(path)
    try:
        end = len(buf)
        result = scan_frames(buf, position, offset, end, position + INDEX_INTERVAL)
        if result.bad is not None:
            after = find_valid_frame(buf, result.position + 1, end)
            if not last or after is not None:
                where = f"byte {result.position}"
                if after is not None:
                    where += f", followed by a valid frame at byte {after}"
                raise LogCorruption(str(path), result.offset, f"{result.bad} ({where})")
        return result
    finally:
        if isinstance(buf, mmap.mmap):
            buf.close()


# --- recovery (synchronous; runs in the constructor) ------------------------------------------


@dataclass(slots=True, eq=False)
class _Segment:
    base: int
    path: Path
    size: int  # bytes of durable frames
    end: int  # offset after the last durable frame
    index: Index | None = None
    read_fd: int = -1

    def close_reader(self) -> None:
        if self.read_fd >= 0:
            os.close(self.read_fd)
            self.read_fd = -1


def _write_index_file(
    fs: FileIO, log_path: Path, index: Index, start: int, *, append: bool
) -> None:
    flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
    fd = fs.open(index_path(log_path), flags, 0o644)
    try:
        fs.write(fd, index.encode(start))
    finally:
        fs.close(fd)


def _index_tail(path: Path, base: int, next_base: int, size: int) -> tuple[int, int]:
    """The last index entry of an older segment if it looks plausible, else ``(base, 0)``."""
    try:
        with index_path(path).open("rb") as f:
            length = os.fstat(f.fileno()).st_size
            if length < INDEX_ENTRY.size or length % INDEX_ENTRY.size:
                return base, 0
            f.seek(length - INDEX_ENTRY.size)
            entry = unpack_index_entry(f.read(INDEX_ENTRY.size))
    except FileNotFoundError:
        return base, 0
    if entry is None:
        return base, 0
    offset, position = entry
    if base < offset < next_base and 0 < position < size:
        return offset, position
    return base, 0


def _check_sealed_segment(fs: FileIO, path: Path, base: int, next_base: int) -> _Segment:
    """Verify the tail of an older segment and that it ends exactly where the next one begins.

    Normally only the bytes after the last index entry are scanned (and their entries appended
    to the index); if the index is missing or its tail does not add up, the whole segment is
    scanned and the index rewritten.
    """
    size = path.stat().st_size
    offset, position = _index_tail(path, base, next_base, size)
    if position > 0:
        with contextlib.suppress(LogCorruption):  # maybe the index lied: rescan in full
            result = scan_segment(path, position, offset, last=False)
            if result.offset == next_base and result.position == size:
                if result.entries:
                    tail = Index(base)
                    for o, p in result.entries:
                        tail.add(o, p)
                    _write_index_file(fs, path, tail, 1, append=True)
                return _Segment(base, path, size, next_base)
    result = scan_segment(path, 0, base, last=False)
    if result.offset != next_base:
        raise LogCorruption(
            str(path),
            result.offset,
            f"segment ends at offset {result.offset} but the next segment starts at "
            f"{next_base}: records are missing or extra",
        )
    index = Index(base)
    for o, p in result.entries:
        index.add(o, p)
    _write_index_file(fs, path, index, 0, append=False)
    return _Segment(base, path, size, next_base)


def _recover_active(fs: FileIO, path: Path, base: int) -> _Segment:
    """Load the last segment: index, tail scan, torn-tail truncation."""
    size = path.stat().st_size
    index, index_exact = read_index(path, base, size)
    known = len(index)
    offset, position = index.last()
    result = scan_segment(path, position, offset, last=True)
    if result.bad is not None:
        logger.warning(
            "log %s: torn tail at byte %d (offset %d): %s; truncating %d bytes",
            path,
            result.position,
            result.offset,
            result.bad,
            size - result.position,
        )
        fd = fs.open(path, os.O_WRONLY)
        try:
            fs.ftruncate(fd, result.position)
            fs.fsync(fd)
        finally:
            fs.close(fd)
    for o, p in result.entries:
        index.add(o, p)
    if not index_exact:
        _write_index_file(fs, path, index, 0, append=False)
    elif len(index) > known:
        _write_index_file(fs, path, index, known, append=True)
    return _Segment(base, path, result.position, result.offset, index)


def _create_segment(fs: FileIO, pdir: Path, base: int) -> tuple[int, int]:
    """Create an empty segment and its index; return ``(write fd, index append fd)``."""
    path = segment_path(pdir, base)
    fd = fs.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        idx_fd = fs.open(index_path(path), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND)
        fs.write(idx_fd, pack_index_entry(base, 0))
        fs.fsync_dir(pdir)
    except BaseException:
        fs.close(fd)
        raise
    return fd, idx_fd


def _drop_trimmed(fs: FileIO, pdir: Path, segments: list[tuple[int, Path]], start: int) -> None:
    """Delete segments entirely below ``start`` (left over by a crash during ``trim``)."""
    dropped = False
    while len(segments) > 1 and segments[1][0] <= start:
        _, path = segments.pop(0)
        fs.unlink(path)
        fs.unlink(index_path(path))
        dropped = True
    if dropped:
        fs.fsync_dir(pdir)


def _write_meta(fs: FileIO, pdir: Path, fence: int, start: int) -> None:
    tmp = pdir / META_TMP_NAME
    fd = fs.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        fs.write(fd, json.dumps({"fence": fence, "start": start}).encode())
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.replace(tmp, pdir / META_NAME)
    fs.fsync_dir(pdir)


def _delete_files(fs: FileIO, pdir: Path, paths: list[Path]) -> None:
    for path in paths:
        fs.unlink(path)
        fs.unlink(index_path(path))
    fs.fsync_dir(pdir)


def _write_durably(
    fs: FileIO, fd: int, data: bytes, position: int, idx_fd: int, idx_data: bytes
) -> None:
    """One group: write, fdatasync, then (best effort, derived data) the new index entries.

    ENOSPC while writing (nothing was synced, no dirty page was dropped) cuts the partial
    group off again and raises ``LogFull``; any other error propagates and poisons (rule 8).
    """
    view = memoryview(data)
    start = position
    try:
        while view:
            written = fs.pwrite(fd, view, position)
            view = view[written:]
            position += written
    except OSError as exc:
        if exc.errno != errno.ENOSPC:
            raise
        fs.ftruncate(fd, start)  # if this fails too, the partition is poisoned
        raise LogFull(f"no space left on device for {len(data)} bytes of records") from exc
    fs.fdatasync(fd)
    if idx_data:
        try:
            fs.write(idx_fd, idx_data)
        except OSError as exc:  # the index is rebuilt on open; the records are durable
            logger.warning("log index write failed (fd %d): %s", idx_fd, exc)


def _roll_files(fs: FileIO, pdir: Path, base: int, old_fd: int, old_idx_fd: int) -> tuple[int, int]:
    """Create the next segment, then make the old index durable and close the old files."""
    fds = _create_segment(fs, pdir, base)
    with contextlib.suppress(OSError):
        fs.fsync(old_idx_fd)
    fs.close(old_idx_fd)
    fs.close(old_fd)
    return fds


# --- the partition and the log ----------------------------------------------------------------

_Then: TypeAlias = "Callable[[], None] | None"
_Job: TypeAlias = tuple[
    asyncio.AbstractEventLoop, "asyncio.Future[Any]", Callable[..., Any], tuple[object, ...], _Then
]


def _settle(
    future: asyncio.Future[Any], result: object, error: BaseException | None, then: _Then
) -> None:
    if future.cancelled():
        return
    if error is None and then is not None:
        try:
            then()
        except BaseException as exc:  # the waiter sees it, as if the job had failed
            error = exc
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


def _io_worker(jobs: queue.SimpleQueue[_Job | None]) -> None:
    while (job := jobs.get()) is not None:
        loop, future, fn, args, then = job
        result: object = None
        error: BaseException | None = None
        try:
            result = fn(*args)
        except BaseException as exc:
            error = exc
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody is waiting
            loop.call_soon_threadsafe(_settle, future, result, error, then)


class _IOThreads:
    """A minimal thread pool for blocking file I/O (the fdatasync above all).

    Every flushed group costs one round trip to a thread, so this keeps the round trip light:
    one ``SimpleQueue.put`` in, one ``call_soon_threadsafe`` out, no concurrent.futures.Future
    and callback chain in between (measurably faster than ``run_in_executor`` here). Threads are
    daemons so that a log that was never closed does not hang interpreter exit; an interrupted
    write is only an unacknowledged torn tail.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []

    def run(self, fn: Callable[..., _T], *args: object, then: _Then = None) -> asyncio.Future[_T]:
        """``fn(*args)`` in a thread; ``then()``, if given, runs on the loop as soon as it
        succeeded, in the same callback that resolves the future (one loop step earlier than
        its awaiter would)."""
        if not self._threads:
            for i in range(self._size):
                name = f"conveyor-log-io-{i}"
                thread = threading.Thread(target=_io_worker, args=(self._jobs,), name=name)
                thread.daemon = True
                thread.start()
                self._threads.append(thread)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[_T] = loop.create_future()
        self._jobs.put((loop, future, fn, args, then))
        return future

    def shutdown(self) -> None:
        for _ in self._threads:
            self._jobs.put(None)
        self._threads.clear()


_Pending: TypeAlias = "tuple[list[bytes], int | None, asyncio.Future[list[int]], int]"


class _Partition:
    def __init__(
        self,
        fs: FileIO,
        pid: int,
        pdir: Path,
        fence: int,
        start: int,
        segments: list[_Segment],
        corrupt: LogCorruption | None = None,
    ):
        self.fs = fs
        self.corrupt = corrupt  # set: found corrupt on open, every use raises it
        self.pid = pid
        self.dir = pdir
        self.fence = fence
        self.start = start
        self.durable_fence = fence
        self.segments = segments
        self.bases = [s.base for s in segments]
        active = segments[-1]
        if active.index is None:
            raise InvariantError(f"the active segment at {active.base} has no index")
        self.next_index = active.index.last()[1] + INDEX_INTERVAL
        self.write_fd = self.idx_fd = -1
        if corrupt is None:
            self.write_fd = fs.open(active.path, os.O_WRONLY)
            self.idx_fd = fs.open(index_path(active.path), os.O_WRONLY | os.O_APPEND)
        self.pending: list[_Pending] = []
        self.inflight: list[_Pending] = []
        self.flusher: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()
        self.changed = asyncio.Event()
        self.failed: BaseException | None = None
        self.fsyncs = 0
        self.records = 0

    @property
    def active(self) -> _Segment:
        return self.segments[-1]

    def wake_readers(self) -> None:
        event, self.changed = self.changed, asyncio.Event()
        event.set()

    def close_files(self) -> None:
        for fd in (self.write_fd, self.idx_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    self.fs.close(fd)
        for seg in self.segments:
            seg.close_reader()


def _open_partition(fs: FileIO, root: Path, pid: int) -> _Partition:
    """Recover one partition. Corruption halts only this partition: the log still opens, and
    every use of the partition raises the ``LogCorruption`` (file and offset) found here."""
    pdir = partition_dir(root, pid)
    try:
        return _recover_partition(fs, root, pdir, pid)
    except LogCorruption as exc:
        logger.error("log partition %d halted: %s", pid, exc)
        halted = _Segment(0, segment_path(pdir, 0), 0, 0, Index(0))
        return _Partition(fs, pid, pdir, 0, 0, [halted], corrupt=exc)


def _recover_partition(fs: FileIO, root: Path, pdir: Path, pid: int) -> _Partition:
    if not pdir.exists():
        fs.mkdir(pdir)
        fs.fsync_dir(root)
    fs.unlink(pdir / META_TMP_NAME)
    fence, start = read_meta(pdir)
    found = list_segments(pdir)
    if not found:
        if start > 0:
            raise LogCorruption(str(pdir), start, "no segment files but records were trimmed")
        for fd in _create_segment(fs, pdir, 0):
            fs.close(fd)
        found = [(0, segment_path(pdir, 0))]
    _drop_trimmed(fs, pdir, found, start)
    if found[0][0] > start:
        raise LogCorruption(str(found[0][1]), start, f"records {start}..{found[0][0]} missing")
    segments = [
        _check_sealed_segment(fs, path, base, nxt) for (base, path), (nxt, _) in pairwise(found)
    ]
    segments.append(_recover_active(fs, found[-1][1], found[-1][0]))
    if start > segments[-1].end:
        raise LogCorruption(
            str(found[-1][1]), segments[-1].end, f"trim start {start} is past the end"
        )
    return _Partition(fs, pid, pdir, fence, start, segments)


def _lock_root(root: Path) -> int:
    fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        os.close(fd)
        raise ContractError(
            f"log directory {root} is already open elsewhere (another node on this home, "
            "running or paused): stop it, or give this one another --home"
        ) from exc
    return fd


class LocalLog:
    """A durable ``Log`` in a local directory (see the module docstring for format and rules).

    The constructor recovers synchronously (it may block on I/O for a while); from async code
    prefer ``await LocalLog.open(...)``, which recovers in a worker thread. Use one event loop
    for the lifetime of an instance. ``fs`` is the file-I/O seam (``fileio.py``); tests pass a
    fault-injecting one.
    """

    def __init__(
        self,
        root: str | Path,
        partitions: int,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fs: FileIO = OS_IO,
    ) -> None:
        if partitions < 1:
            raise ContractError("a log needs at least one partition", field="partitions")
        if segment_bytes < 1:
            raise ContractError("segment_bytes must be positive", field="segment_bytes")
        self._root = Path(root)
        self._fs = fs
        if not self._root.is_dir():
            self._root.parent.mkdir(parents=True, exist_ok=True)
            fs.mkdir(self._root)
            fs.fsync_dir(self._root.parent)
        self._segment_bytes = segment_bytes
        self._closed = False
        self._lock_fd = _lock_root(self._root)
        self._parts: list[_Partition] = []
        try:
            extra = [pid for pid in list_partitions(self._root) if pid >= partitions]
            if extra:
                raise ContractError(
                    f"log {root} has partition {extra[-1]}, more than the {partitions} asked for",
                    field="partitions",
                )
            for pid in range(partitions):
                self._parts.append(_open_partition(fs, self._root, pid))
        except BaseException:
            self._release()
            raise
        self._io = _IOThreads(min(partitions, 16) + 1)
        self._index_cache: OrderedDict[_Segment, None] = OrderedDict()

    @classmethod
    async def open(
        cls,
        root: str | Path,
        partitions: int,
        *,
        segment_bytes: int = DEFAULT_SEGMENT_BYTES,
        fs: FileIO = OS_IO,
    ) -> LocalLog:
        """Open (and recover) the log in a worker thread, keeping the event loop responsive."""
        return await asyncio.to_thread(cls, root, partitions, segment_bytes=segment_bytes, fs=fs)

    def _release(self) -> None:
        for part in self._parts:
            part.close_files()
        with contextlib.suppress(OSError):
            os.close(self._lock_fd)

    @property
    def partitions(self) -> int:
        return len(self._parts)

    @property
    def ends_known(self) -> bool:
        return True  # one process writes the log

    @property
    def root(self) -> Path:
        return self._root

    @property
    def fsync_count(self) -> int:
        """Group-commit fdatasyncs so far (one per flushed group)."""
        return sum(p.fsyncs for p in self._parts)

    @property
    def records_written(self) -> int:
        return sum(p.records for p in self._parts)

    def _part(self, partition: int) -> _Partition:
        if not 0 <= partition < len(self._parts):
            raise ContractError(f"no partition {partition}", field="partition")
        if self._closed:
            raise LogClosed(f"log {self._root} is closed")
        return self._live(partition)

    def _live(self, partition: int) -> _Partition:
        """The partition, unless recovery found it corrupt: then its ``LogCorruption``."""
        p = self._parts[partition]
        if p.corrupt is not None:
            raise p.corrupt
        return p

    def corruption(self, partition: int) -> LogCorruption | None:
        """Why a partition is halted (found corrupt when the log was opened), or None."""
        return self._parts[partition].corrupt

    def _run(self, fn: Callable[..., _T], *args: object) -> asyncio.Future[_T]:
        return self._io.run(fn, *args)

    @staticmethod
    def _sealed(p: _Partition, epoch: int) -> LogSealed:
        return LogSealed(
            f"partition {p.pid} is sealed at epoch {p.fence}; append carried epoch {epoch}"
        )

    # --- append and group commit ------------------------------------------------------------

    async def append(
        self, partition: int, records: Sequence[bytes], epoch: int | None = None
    ) -> list[int]:
        """Queue ``records`` for the partition's next group and wait until they are durable.

        Cancelling an append that is still queued writes nothing; once its group is being
        written the records may land anyway (the caller just does not learn their offsets).
        """
        p = self._part(partition)
        if p.failed is not None:
            raise LogFailed(f"partition {partition} failed: {p.failed!r}; reopen the log")
        if epoch is not None and epoch < p.fence:
            raise self._sealed(p, epoch)
        batch = list(records)
        if not batch:
            return []
        size = sum(map(len, batch))
        if size > MAX_RECORD_BYTES and max(map(len, batch)) > MAX_RECORD_BYTES:
            raise ContractError(f"a record exceeds {MAX_RECORD_BYTES} bytes", field="records")
        future: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        p.pending.append((batch, epoch, future, size + HEADER_BYTES * len(batch)))
        if p.flusher is None:
            p.flusher = asyncio.get_running_loop().create_task(self._flush_loop(p))
        return await future

    async def _flush_loop(self, p: _Partition) -> None:
        try:
            while p.pending:
                async with p.lock:
                    await self._flush_group(p)
        except asyncio.CancelledError as exc:
            self._fail(p, exc)
            raise
        except Exception as exc:
            self._fail(p, exc)
        finally:
            p.flusher = None

    def _fail(self, p: _Partition, exc: BaseException) -> None:
        """Poison the partition: fail every queued append; later appends raise LogFailed."""
        logger.error("log partition %d failed: %r", p.pid, exc)
        p.failed = exc
        pending, p.pending, p.inflight = p.inflight + p.pending, [], []
        for _, _, future, _ in pending:
            if not future.done():
                error = LogFailed(f"partition {p.pid} failed: {exc!r}")
                error.__cause__ = exc
                future.set_exception(error)

    def _take(self, p: _Partition) -> list[_Pending]:
        """Queued appends that fit the active segment (at least one), fence-checked."""
        room = min(self._segment_bytes - p.active.size, MAX_GROUP_BYTES)
        pending = p.pending
        taken = count = 0
        while count < len(pending) and (count == 0 or taken + pending[count][3] <= room):
            taken += pending[count][3]
            count += 1
        group = pending[:count]
        del pending[:count]
        accepted = []
        for item in group:
            _, epoch, future, _ = item
            if future.done():  # cancelled while queued: write nothing
                continue
            if epoch is not None and epoch < p.fence:
                future.set_exception(self._sealed(p, epoch))
            else:
                accepted.append(item)
        return accepted

    def _encode(self, p: _Partition, group: list[_Pending]) -> tuple[bytes, list[tuple[int, int]]]:
        """Frames of the whole group as one buffer, plus the sparse index entries it crosses."""
        records: list[bytes] = []
        for item in group:
            records.extend(item[0])
        lengths = list(map(len, records))
        headers = list(map(FRAME.pack, lengths, map(crc32c, records, repeat(FRAME_SEED))))
        parts: list[bytes] = [b""] * (2 * len(records))
        parts[::2] = headers
        parts[1::2] = records
        data = b"".join(parts)
        entries: list[tuple[int, int]] = []
        first, position = p.active.end, p.active.size
        if position + len(data) > p.next_index:
            starts = list(accumulate(map(HEADER_BYTES.__add__, lengths), initial=position))
            while (k := bisect_left(starts, p.next_index, hi=len(records))) < len(records):
                entries.append((first + k, starts[k]))
                p.next_index = starts[k] + INDEX_INTERVAL
        return data, entries

    async def _flush_group(self, p: _Partition) -> None:
        if p.active.size >= self._segment_bytes:
            await self._roll(p)
        group = self._take(p)
        if not group:
            return
        next_index = p.next_index
        data, entries = self._encode(p, group)
        idx_data = b"".join(pack_index_entry(o, pos) for o, pos in entries)
        seg = p.active
        p.inflight = group
        try:
            # The appenders are answered from the thread's completion callback itself: on a
            # busy loop, waiting for this task to resume first would cost a whole loop round.
            await self._io.run(
                _write_durably,
                self._fs,
                p.write_fd,
                data,
                seg.size,
                p.idx_fd,
                idx_data,
                then=lambda: self._committed(p, seg, group, data, entries),
            )
        except LogFull as exc:  # nothing of the group is on disk: refuse it, stay usable
            p.inflight, p.next_index = [], next_index
            for _, _, future, _ in group:
                if not future.done():
                    future.set_exception(LogFull(str(exc)))

    @staticmethod
    def _committed(
        p: _Partition,
        seg: _Segment,
        group: list[_Pending],
        data: bytes,
        entries: list[tuple[int, int]],
    ) -> None:
        """A group is durable: advance the segment, answer its appenders, wake readers."""
        p.inflight = []
        if seg.index is None:
            raise InvariantError(f"a group was made durable in sealed segment {seg.base}")
        for o, pos in entries:
            seg.index.add(o, pos)
        first = seg.end
        count = sum(len(item[0]) for item in group)
        seg.size += len(data)
        seg.end += count
        p.fsyncs += 1
        p.records += count
        # Readers first: a processor that applies the group before its submitters resume
        # has their replies ready when they look, instead of waking them once more.
        p.wake_readers()
        offset = first
        for records, _, future, _ in group:
            if not future.done():
                future.set_result(list(range(offset, offset + len(records))))
            offset += len(records)

    async def _roll(self, p: _Partition) -> None:
        old = p.active
        base = old.end
        p.write_fd, p.idx_fd = await self._run(
            _roll_files, self._fs, p.dir, base, p.write_fd, p.idx_fd
        )
        path = segment_path(p.dir, base)
        p.segments.append(_Segment(base, path, 0, base, Index(base)))
        p.bases.append(base)
        p.next_index = INDEX_INTERVAL
        self._cache_index(old)

    # --- fencing and trimming ---------------------------------------------------------------

    async def seal(self, partition: int, epoch: int) -> None:
        p = self._part(partition)
        p.fence = max(p.fence, epoch)  # groups taken from now on are rejected
        async with p.lock:  # waits out a group taken before the seal
            if p.durable_fence < p.fence:
                fence = p.fence
                await self._run(_write_meta, self._fs, p.dir, fence, p.start)
                p.durable_fence = max(p.durable_fence, fence)

    async def trim(self, partition: int, up_to: int) -> None:
        p = self._part(partition)
        async with p.lock:
            up_to = min(up_to, p.active.end)
            if up_to <= p.start:
                return
            p.start = up_to
            fence = p.fence
            await self._run(_write_meta, self._fs, p.dir, fence, up_to)
            p.durable_fence = max(p.durable_fence, fence)
            doomed: list[_Segment] = []
            while len(p.segments) > 1 and p.segments[1].base <= up_to:
                seg = p.segments.pop(0)
                p.bases.pop(0)
                seg.close_reader()
                self._index_cache.pop(seg, None)
                doomed.append(seg)
            if doomed:
                await self._run(_delete_files, self._fs, p.dir, [s.path for s in doomed])

    def end_offset(self, partition: int) -> int:
        """The offset after the last durable record (what the next append gets if none is
        queued)."""
        return self._live(partition).active.end

    def start_offset(self, partition: int) -> int:
        return self._live(partition).start

    def fence(self, partition: int) -> int:
        return self._live(partition).fence

    # --- reading ----------------------------------------------------------------------------

    async def read(
        self, partition: int, from_offset: int, *, follow: bool = False, max_batch: int = 1024
    ) -> AsyncIterator[list[LogRecord]]:
        """Durable records from ``from_offset``. Raises ``LogClosed`` once the log closes
        (which also ends a follower waiting at the tail)."""
        p = self._part(partition)
        offset = from_offset
        cursor: tuple[_Segment, int, int] | None = None
        while True:
            if self._closed:
                raise LogClosed(f"log {self._root} is closed")
            if offset < p.start:
                raise LogTrimmed(f"offset {offset} of partition {partition} was trimmed")
            waiter = p.changed
            end = p.active.end
            if offset < end:
                batch, cursor = self._read_batch(
                    p, offset, min(end, offset + max(1, max_batch)), cursor
                )
                yield batch
                offset = batch[-1].offset + 1
                continue
            if not follow:
                return
            await waiter.wait()

    def _index(self, seg: _Segment) -> Index:
        if seg.index is None:
            seg.index, _ = read_index(seg.path, seg.base, seg.size)
            self._cache_index(seg)
        elif seg in self._index_cache:
            self._index_cache.move_to_end(seg)
        return seg.index

    def _cache_index(self, seg: _Segment) -> None:
        """Track a loaded index of a non-active segment; drop the least recently used ones."""
        self._index_cache[seg] = None
        while len(self._index_cache) > INDEX_CACHE_SEGMENTS:
            evicted, _ = self._index_cache.popitem(last=False)
            evicted.index = None

    def _read_batch(
        self, p: _Partition, offset: int, stop: int, cursor: tuple[_Segment, int, int] | None
    ) -> tuple[list[LogRecord], tuple[_Segment, int, int]]:
        """Records ``offset..stop`` (or fewer: one segment, about READ_BATCH_BYTES)."""
        seg = p.segments[bisect_right(p.bases, offset) - 1]
        stop = min(stop, seg.end)
        if cursor is not None and cursor[0] is seg and cursor[1] == offset:
            current, position = offset, cursor[2]
        else:
            current, position = self._index(seg).floor(offset)
        if seg.read_fd < 0:
            seg.read_fd = os.open(seg.path, os.O_RDONLY)
        out: list[LogRecord] = []
        path = str(seg.path)
        avg = seg.size // max(1, seg.end - seg.base) + 1
        consumed = need = 0
        while current < stop and (not out or consumed < READ_BATCH_BYTES):
            guess = min(max(avg * (stop - current) + HEADER_BYTES, 4096), READ_BATCH_BYTES)
            want = min(max(need, guess), seg.size - position)
            if want <= 0:
                raise LogCorruption(path, current, f"durable data ends at byte {position}")
            chunk = os.pread(seg.read_fd, want, position)
            if len(chunk) < want:
                raise LogCorruption(path, current, f"file is shorter than {position + want} bytes")
            current, used = _decode_chunk(chunk, current, offset, stop, out, path, position)
            if used == 0:  # the next frame is larger than the chunk: read exactly that frame
                need = HEADER_BYTES + FRAME.unpack_from(chunk)[0] if want >= HEADER_BYTES else 0
                if need <= want or position + need > seg.size:
                    raise LogCorruption(
                        path, current, f"frame at byte {position} runs past the end"
                    )
                continue
            need = 0
            position += used
            consumed += used
        return out, (seg, current, position)

    # --- closing ----------------------------------------------------------------------------

    async def close(self) -> None:
        """Finish queued appends, then close every file. Idempotent."""
        if self._closed:
            return
        self._closed = True
        for p in self._parts:
            if p.flusher is not None:
                await asyncio.wait({p.flusher})  # not cancelled if close() is
            async with p.lock:  # a seal or trim in progress
                pass
            p.wake_readers()
        self._release()
        self._io.shutdown()


def _decode_chunk(
    chunk: bytes, current: int, wanted: int, stop: int, out: list[LogRecord], path: str, at: int
) -> tuple[int, int]:
    """Decode whole frames of ``chunk`` (read at byte ``at``) into ``out``, skipping offsets
    below ``wanted``. Returns ``(next offset, bytes consumed)``."""
    unpack = FRAME.unpack_from
    size = len(chunk)
    rel = 0
    while current < stop and rel + HEADER_BYTES <= size:
        length, crc = unpack(chunk, rel)
        if length > MAX_RECORD_BYTES:
            raise LogCorruption(path, current, f"length field {length} at byte {at + rel}")
        end = rel + HEADER_BYTES + length
        if end > size:
            break
        if current >= wanted:
            payload = chunk[rel + HEADER_BYTES : end]
            if crc32c(payload, FRAME_SEED) != crc:
                raise LogCorruption(path, current, f"crc mismatch at byte {at + rel}")
            out.append(LogRecord(current, payload))
        rel = end
        current += 1
    return current, rel
