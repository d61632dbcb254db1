"""The crash states of tests/PLAN.md: every crash state of a small log workload, enumerated.

The workload runs once on a recording ``FaultyFileIO``: it creates the log, appends groups
that roll segments (so a sealed segment's index is written and synced), seals the partition
(``meta.json`` written to a temp file, fsync'd, renamed, directory fsync'd) and trims it
(meta again, then segment files deleted). Then, for each prefix of the recorded file
operations (a crash point), every state the persistence model of ``disk.py`` allows is written
to a scratch directory: each file keeps a prefix of its unsynced writes, the next one maybe
torn (or followed by zeros), each directory a prefix of its unsynced creates, renames and
deletes (so a rename without its directory fsync may be lost), all combined freely (sampled
above a bound). Recovery runs on each state, and must:

- not report corruption (every state here is one a real crash can leave);
- keep every acknowledged append at its offset, in order, with no record that was never
  written and none past a gap (the records are a prefix of what the workload wrote);
- keep an acknowledged seal's fence and never lose records at or above the trim start;
- accept the next append at the next offset, and give the same result when run twice.

The test prints ``workloads, crash points, crash states, violations`` (always 0 on a pass).
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from conveyor.streams.log import local
from conveyor.streams.log.fileio import FileIO
from conveyor.streams.log.local import LocalLog
from conveyor_devtools.chaos.disk import FaultyFileIO
from conveyor_devtools.chaos.fsmodel import CrashChoice, FsModel, Tear, crash_choices, replay

pytestmark = pytest.mark.timeout(120)

STATES_PER_POINT_MAX = 128
WORKLOADS = [  # segment bytes, records per appended group, record bytes
    (200, (2, 2, 2, 2, 2, 2), 60),
    (6000, (2, 3, 2, 3, 2, 3, 2, 3), 1000),  # segments pass INDEX_INTERVAL: sparse entries
]


async def workload(
    fs: FaultyFileIO, segment_bytes: int, groups: tuple[int, ...], size: int
) -> list[bytes]:
    """Append the groups one after another, seal at epoch 3, trim below the second segment."""
    log = await LocalLog.open(fs.root, 1, segment_bytes=segment_bytes, fs=fs)
    written: list[bytes] = []
    for g, group in enumerate(groups):
        batch = [bytes([65 + g]) * size + f"/{g}.{k}".encode() for k in range(group)]
        written += batch
        offsets = await log.append(0, batch)
        fs.mark("ack", offsets[-1])
    await log.seal(0, 3)
    fs.mark("sealed", 3)
    segments = sorted(fs.root.glob("p0000/*.log"))
    assert len(segments) >= 3, "the workload must roll segments"
    trim_to = int(segments[1].stem)
    fs.mark("trim", trim_to)
    await log.trim(0, trim_to)
    fs.mark("trimmed", trim_to)
    await log.close()
    return written


async def recover(
    root: Path, segment_bytes: int, *, then_append: bool = False
) -> tuple[list[tuple[int, bytes]], int, int]:
    """Open (recover), read everything; with ``then_append``, check the next append lands at
    the next offset."""
    log = LocalLog(root, 1, segment_bytes=segment_bytes)  # no thread hop: ~1,000 opens here
    try:
        start = log.start_offset(0)
        records: list[tuple[int, bytes]] = []
        async for batch in log.read(0, start):
            records += [(r.offset, r.data) for r in batch]
        if then_append:
            assert await log.append(0, [b"next"]) == [start + len(records)]
        return records, start, log.fence(0)
    finally:
        await log.close()


async def check_state(
    root: Path, segment_bytes: int, written: list[bytes], markers: dict[str, int]
) -> None:
    records, start, fence = await recover(root, segment_bytes)
    acked_end = markers.get("ack", -1) + 1
    assert start in (0, markers.get("trim", 0)), f"trim start {start} from nowhere"
    if "trimmed" in markers:
        assert start == markers["trimmed"], "an acknowledged trim was undone"
    assert [o for o, _ in records] == list(range(start, start + len(records))), "offsets"
    assert start + len(records) >= acked_end, f"acked records lost: {start + len(records)}"
    for offset, data in records:
        assert data == written[offset], f"record {offset} is not what was written there"
    if "sealed" in markers:
        assert fence >= markers["sealed"], "an acknowledged seal was lost"
    again = await recover(root, segment_bytes, then_append=True)
    assert again == (records, start, fence), "recovery is not idempotent"


def enumerate_crash_states(
    tmp_path: Path, segment_bytes: int, groups: tuple[int, ...], size: int
) -> Counter[str]:
    """Record the workload, then check every crash state; raises at the first violation."""
    fs = FaultyFileIO(tmp_path / "recorded", record=True)
    written = asyncio.run(workload(fs, segment_bytes, groups, size))
    assert fs.ops is not None and fs.initial is not None
    rng = random.Random(segment_bytes)
    # Crash states are written and recovered about 1,300 times: on tmpfs when there is one,
    # fsync is free there and the run is bounded by Python, not by the shared disk.
    shm = Path("/dev/shm")
    scratch_root = Path(tempfile.mkdtemp(dir=shm)) if os.access(shm, os.W_OK) else tmp_path
    scratch = scratch_root / "crash"
    stats: Counter[str] = Counter()
    markers: dict[str, int] = {}
    marked_upto = 0

    async def check_all() -> None:
        nonlocal marked_upto
        assert fs.ops is not None and fs.initial is not None
        for applied, model in replay(fs.initial, fs.ops):
            for kind, value in fs.ops[marked_upto:applied]:
                if kind in ("ack", "sealed", "trim", "trimmed"):
                    markers[kind] = value
            marked_upto = applied
            stats["crash points"] += 1
            choices = crash_choices(model, rng, STATES_PER_POINT_MAX)
            stats["sampled crash points"] += len(choices) == STATES_PER_POINT_MAX
            for choice in choices:
                stats["crash states"] += 1
                stats["renames lost"] += _loses_a_rename(model, choice)
                stats["torn writes"] += any(t.torn_bytes is not None for t in choice.values())

                def choose(kind: str, key: Path | int, choice: CrashChoice = choice) -> Tear:
                    return choice.get((kind, key), Tear(0))

                model.materialize(fs.root, scratch, choose)
                try:
                    await check_state(scratch, segment_bytes, written, dict(markers))
                except Exception as exc:
                    stats["violations"] += 1
                    raise AssertionError(
                        f"crash point {applied} ({fs.ops[applied - 1][0]}), choice {choice}: "
                        f"{exc!r}"
                    ) from exc

    try:
        asyncio.run(check_all())
    finally:
        shutil.rmtree(scratch_root if scratch_root != tmp_path else scratch, ignore_errors=True)
    return stats


@pytest.mark.parametrize(("segment_bytes", "groups", "size"), WORKLOADS)
def test_every_crash_state_of_a_small_workload_recovers(
    tmp_path: Path, segment_bytes: int, groups: tuple[int, ...], size: int
) -> None:
    stats = enumerate_crash_states(tmp_path, segment_bytes, groups, size)
    print(
        f"\ncrash states: workloads=1 (segment {segment_bytes} B) crash points="
        f"{stats['crash points']} crash states={stats['crash states']} torn writes="
        f"{stats['torn writes']} renames lost={stats['renames lost']} sampled crash points="
        f"{stats['sampled crash points']} violations="
        f"{stats['violations']}"
    )
    assert stats["violations"] == 0
    assert stats["crash states"] > 200 and stats["torn writes"] > 0 and stats["renames lost"] > 0


def test_the_enumeration_catches_a_log_that_acks_before_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Anti-vacuity: the same enumeration fails a log whose group commit skips the fdatasync
    (the NATS 2.12.1 bug). Skipping the directory fsync after a segment is created, or the
    fsync of ``meta.json`` before its rename, is caught the same way (tried by hand)."""
    write_durably = local._write_durably

    def no_fdatasync(fs: FileIO, *args: Any) -> None:
        write_durably(_NoSync(fs), *args)

    monkeypatch.setattr(local, "_write_durably", no_fdatasync)
    with pytest.raises(AssertionError, match="acked records lost"):
        enumerate_crash_states(tmp_path, *WORKLOADS[0])


class _NoSync:
    def __init__(self, fs: FileIO) -> None:
        self._fs = fs

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fs, name)

    def fdatasync(self, fd: int) -> None:
        pass


def _loses_a_rename(model: FsModel, choice: CrashChoice) -> bool:
    """A state where a rename was done but its directory fsync not, and the rename is lost."""
    for (kind, key), tear in choice.items():
        if kind == "dir":
            assert isinstance(key, Path)
            if any(op[0] == "rename" for op in model.dirs[key].pending[tear.ops :]):
                return True
    return False
