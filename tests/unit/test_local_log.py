"""LocalLog specifics: files, recovery, corruption, group commit, fencing at flush, tools."""

from __future__ import annotations

import asyncio
import json
import os
import struct
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
from crc32c import crc32c

import conveyor.streams.log.local as local_mod
from conveyor.errors import ContractError
from conveyor.streams.log import tools
from conveyor.streams.log.api import LogCorruption, LogRecord, LogSealed, LogTrimmed
from conveyor.streams.log.fileio import FileIO
from conveyor.streams.log.local import FRAME_SEED, LocalLog, LogClosed, LogFailed

T = TypeVar("T")
PAYLOAD = 50  # bytes per test record, so a frame is 58 bytes
FRAME = 8 + PAYLOAD


def run(body: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await body()

    return asyncio.run(main())


def rec(i: int) -> bytes:
    return f"record-{i:06d}-".encode().ljust(PAYLOAD, b".")


def write(
    root: Path, n: int, *, partitions: int = 1, segment_bytes: int = 1 << 20, batch: int = 10
) -> None:
    """Append records ``rec(0..n-1)`` to every partition of a log at ``root`` and close it."""

    async def body() -> None:
        log = LocalLog(root, partitions, segment_bytes=segment_bytes)
        for p in range(partitions):
            for i in range(0, n, batch):
                await log.append(p, [rec(j) for j in range(i, min(n, i + batch))])
        await log.close()

    run(body)


def read_back(
    root: Path, *, partitions: int = 1, from_offset: int = 0, **kw: int
) -> list[LogRecord]:
    """Open the log at ``root`` (recovering it) and read partition 0 from ``from_offset``."""

    async def body() -> list[LogRecord]:
        log = LocalLog(root, partitions, **kw)
        try:
            out: list[LogRecord] = []
            async for batch in log.read(0, from_offset):
                out.extend(batch)
            return out
        finally:
            await log.close()

    return run(body)


def segments(root: Path, partition: int = 0) -> list[Path]:
    return sorted((root / f"p{partition:04d}").glob("*.log"))


def frame(payload: bytes, *, crc: int | None = None) -> bytes:
    value = crc32c(payload, FRAME_SEED) if crc is None else crc
    return struct.pack("<II", len(payload), value) + payload


# --- reopen, rolling, index ---------------------------------------------------------------------


def test_reopen_after_close_sees_all_records(tmp_path: Path) -> None:
    write(tmp_path, 250, partitions=2)

    async def body() -> None:
        log = LocalLog(tmp_path, 2)
        try:
            for p in range(2):
                assert log.end_offset(p) == 250
                got: list[LogRecord] = []
                async for batch in log.read(p, 0):
                    got.extend(batch)
                assert [r.data for r in got] == [rec(i) for i in range(250)]
            assert await log.append(1, [b"next"]) == [250]
        finally:
            await log.close()

    run(body)


def test_segments_roll_and_reads_cross_them(tmp_path: Path) -> None:
    write(tmp_path, 200, segment_bytes=300, batch=3)
    files = segments(tmp_path)
    assert len(files) > 20
    bases = [int(f.stem) for f in files]
    assert bases[0] == 0 and bases == sorted(bases)
    assert all(f.stat().st_size < 300 + 3 * FRAME for f in files)
    for start in (0, 1, bases[5], bases[5] - 1, bases[-1], 199):
        got = read_back(tmp_path, from_offset=start, segment_bytes=300)
        assert [r.offset for r in got] == list(range(start, 200))
        assert [r.data for r in got] == [rec(i) for i in range(start, 200)]


def test_deleted_or_truncated_index_is_rebuilt(tmp_path: Path) -> None:
    write(tmp_path, 3000, segment_bytes=64 * 1024, batch=50)
    indexes = sorted((tmp_path / "p0000").glob("*.idx"))
    assert len(indexes) >= 3
    original = {p.name: p.read_bytes() for p in indexes}
    entry = local_mod.INDEX_ENTRY.size
    assert all(len(data) > entry for data in original.values())  # sparse, but not empty
    indexes[0].unlink()
    indexes[-1].unlink()
    with indexes[1].open("r+b") as f:
        f.truncate(entry + 5)  # first entry plus a torn one
    got = read_back(tmp_path, from_offset=1234, segment_bytes=64 * 1024)
    assert [r.data for r in got] == [rec(i) for i in range(1234, 3000)]
    assert {p.name: p.read_bytes() for p in indexes} == original


def test_close_waits_for_queued_appends(tmp_path: Path) -> None:
    async def body() -> list[list[int]]:
        log = LocalLog(tmp_path, 1)
        tasks = [asyncio.create_task(log.append(0, [rec(i)])) for i in range(20)]
        await asyncio.create_task(log.close())  # runs after the appends have queued (FIFO)
        return [t.result() for t in tasks]

    offsets = run(body)
    assert sorted(o for offs in offsets for o in offs) == list(range(20))
    assert len(read_back(tmp_path)) == 20


def test_directory_is_locked_while_open(tmp_path: Path) -> None:
    async def body() -> None:
        log = LocalLog(tmp_path, 1)
        with pytest.raises(ContractError):
            LocalLog(tmp_path, 1)
        await log.close()
        again = LocalLog(tmp_path, 1)
        await again.close()

    run(body)


# --- torn tails and corruption ------------------------------------------------------------------


@pytest.mark.parametrize(
    "damage",
    ["cut_mid_frame", "half_frame_appended", "bad_crc_last_frame", "absurd_length", "zeros"],
)
def test_torn_tail_is_truncated_and_appends_continue(tmp_path: Path, damage: str) -> None:
    write(tmp_path, 40)
    seg = segments(tmp_path)[-1]
    size = seg.stat().st_size
    expected = 40
    with seg.open("r+b") as f:
        if damage == "cut_mid_frame":
            f.truncate(size - 5)
            expected = 39
        elif damage == "half_frame_appended":
            f.seek(size)
            f.write(frame(b"x" * 100)[:60])
        elif damage == "bad_crc_last_frame":
            f.seek(size)
            f.write(frame(b"y" * 20, crc=12345))
        elif damage == "absurd_length":
            f.seek(size)
            f.write(struct.pack("<II", 0xFFFF_FFF0, 0) + b"garbage")
        else:
            f.seek(size)
            f.write(bytes(4096))
    clean_size = size if expected == 40 else size - FRAME

    async def body() -> None:
        log = LocalLog(tmp_path, 1)
        try:
            assert seg.stat().st_size == clean_size
            assert log.end_offset(0) == expected
            assert await log.append(0, [b"after"]) == [expected]
        finally:
            await log.close()

    run(body)
    got = read_back(tmp_path)
    assert [r.data for r in got] == [rec(i) for i in range(expected)] + [b"after"]


def flip(path: Path, position: int) -> None:
    with path.open("r+b") as f:
        f.seek(position)
        byte = f.read(1)[0]
        f.seek(position)
        f.write(bytes([byte ^ 0x40]))


def open_and_read_everything(root: Path, **kw: int) -> list[LogRecord]:
    return read_back(root, **kw)


def open_halted(root: Path, **kw: int) -> LogCorruption:
    """Corruption found on open halts the partition (not the log): its error, as every use of
    the partition raises it."""
    log = LocalLog(root, 1, **kw)
    try:
        error = log.corruption(0)
        assert error is not None
        with pytest.raises(LogCorruption) as info:
            log.end_offset(0)
        assert info.value is error
        return error
    finally:
        asyncio.run(log.close())


@pytest.mark.parametrize("victim", [10, 85])  # before / after the last index entry (71)
def test_flipped_byte_followed_by_valid_frames_is_corruption(tmp_path: Path, victim: int) -> None:
    write(tmp_path, 100)
    seg = segments(tmp_path)[-1]
    flip(seg, victim * FRAME + 8 + 20)
    with pytest.raises(LogCorruption) as info:
        open_and_read_everything(tmp_path)
    assert info.value.path == str(seg)
    assert info.value.offset == victim
    assert "crc" in info.value.reason
    assert seg.stat().st_size == 100 * FRAME  # nothing was truncated


@pytest.mark.parametrize("field_byte", [0, 3])  # low and high byte of the length field
def test_corrupt_length_field_is_corruption_not_a_torn_tail(
    tmp_path: Path, field_byte: int
) -> None:
    write(tmp_path, 100)
    seg = segments(tmp_path)[-1]
    flip(seg, 90 * FRAME + field_byte)
    assert open_halted(tmp_path).offset == 90
    assert seg.stat().st_size == 100 * FRAME


def test_bad_frame_in_an_older_segment_is_corruption(tmp_path: Path) -> None:
    write(tmp_path, 200, segment_bytes=2048, batch=5)
    files = segments(tmp_path)
    victim_file = files[1]
    base = int(victim_file.stem)
    flip(victim_file, 2 * FRAME + 8 + 1)
    with pytest.raises(LogCorruption) as info:
        open_and_read_everything(tmp_path, segment_bytes=2048)
    assert info.value.path == str(victim_file)
    assert info.value.offset == base + 2


def test_truncated_older_segment_is_corruption(tmp_path: Path) -> None:
    write(tmp_path, 200, segment_bytes=2048, batch=5)
    victim = segments(tmp_path)[0]
    with victim.open("r+b") as f:
        f.truncate(victim.stat().st_size - FRAME)
    assert open_halted(tmp_path, segment_bytes=2048).path == str(victim)


# --- group commit and fencing at flush ----------------------------------------------------------


def test_group_commit_shares_fsyncs(tmp_path: Path) -> None:
    async def body() -> tuple[list[list[int]], int, int]:
        log = LocalLog(tmp_path, 1)
        try:
            results = await asyncio.gather(*(log.append(0, [rec(i)]) for i in range(200)))
            return results, log.fsync_count, log.records_written
        finally:
            await log.close()

    results, fsyncs, written = run(body)
    assert sorted(o for offs in results for o in offs) == list(range(200))
    assert written == 200
    assert 1 <= fsyncs <= 10
    assert len(read_back(tmp_path)) == 200


def test_append_queued_before_seal_and_flushed_after_fails(tmp_path: Path) -> None:
    async def body() -> None:
        log = LocalLog(tmp_path, 1)
        try:
            # The append passes the queue-time check (fence 0) and waits for the flusher, which
            # only runs after seal() has raised the fence.
            stale, sealed, fresh = await asyncio.gather(
                log.append(0, [b"stale"], epoch=1),
                log.seal(0, 2),
                log.append(0, [b"fresh"], epoch=2),
                return_exceptions=True,
            )
            assert isinstance(stale, LogSealed)
            assert sealed is None
            assert fresh == [0]
            assert log.end_offset(0) == 1
        finally:
            await log.close()

    run(body)
    assert [r.data for r in read_back(tmp_path)] == [b"fresh"]


def test_write_failure_poisons_the_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object) -> None:
        raise OSError(5, "Input/output error")

    async def body() -> None:
        log = LocalLog(tmp_path, 2)
        try:
            await log.append(0, [b"ok"])
            monkeypatch.setattr(local_mod, "_write_durably", broken)
            with pytest.raises(LogFailed):
                await log.append(0, [b"lost"])
            monkeypatch.undo()
            with pytest.raises(LogFailed):
                await log.append(0, [b"refused"])
            assert await log.append(1, [b"other partition"]) == [0]
        finally:
            await log.close()

    run(body)
    assert [r.data for r in read_back(tmp_path, partitions=2)] == [b"ok"]


def test_oversized_record_is_refused(tmp_path: Path) -> None:
    async def body() -> None:
        log = LocalLog(tmp_path, 1)
        try:
            with pytest.raises(ContractError):
                await log.append(0, [b"x" * (local_mod.MAX_RECORD_BYTES + 1)])
            assert log.end_offset(0) == 0
        finally:
            await log.close()

    run(body)


# --- trim ---------------------------------------------------------------------------------------


def test_trim_deletes_whole_segments_and_survives_reopen(tmp_path: Path) -> None:
    write(tmp_path, 200, segment_bytes=600, batch=5)
    before = segments(tmp_path)

    async def trim() -> None:
        log = LocalLog(tmp_path, 1, segment_bytes=600)
        try:
            await log.trim(0, 77)
        finally:
            await log.close()

    run(trim)
    after = segments(tmp_path)
    assert 0 < len(after) < len(before)
    assert int(after[0].stem) <= 77 < (int(after[1].stem) if len(after) > 1 else 200)
    assert all(not index_of(p).exists() for p in before if p not in after)

    async def check() -> None:
        log = LocalLog(tmp_path, 1, segment_bytes=600)
        try:
            assert log.start_offset(0) == 77
            with pytest.raises(LogTrimmed):
                async for _ in log.read(0, 76):
                    pass
            got = [r async for batch in log.read(0, 77) for r in batch]
            assert [r.data for r in got] == [rec(i) for i in range(77, 200)]
        finally:
            await log.close()

    run(check)


def index_of(path: Path) -> Path:
    return path.with_suffix(".idx")


# --- tools --------------------------------------------------------------------------------------


def test_verify_reports_ok_with_counts(tmp_path: Path) -> None:
    write(tmp_path, 300, partitions=2, segment_bytes=4096)
    report = tools.verify(tmp_path)
    assert report.ok and report.bad is None
    assert [p.records for p in report.partitions] == [300, 300]
    assert report.records == 600
    assert all(p.index_ok and p.torn_tail is None for p in report.partitions)
    assert json.loads(json.dumps(report.as_dict()))["records"] == 600
    with pytest.raises(FileNotFoundError):
        tools.verify(tmp_path / "missing")


def test_verify_reports_the_first_bad_frame_without_touching_files(tmp_path: Path) -> None:
    write(tmp_path, 300, partitions=2, segment_bytes=4096)
    victim = segments(tmp_path, 1)[1]
    base = int(victim.stem)
    flip(victim, 3 * FRAME + 8 + 7)
    flip(victim, 5 * FRAME + 8 + 7)
    report = tools.verify(tmp_path)
    assert not report.ok
    assert report.bad is not None
    assert (report.bad.path, report.bad.partition, report.bad.offset) == (str(victim), 1, base + 3)
    assert [p.partition for p in report.partitions] == [0]


def test_verify_reports_a_torn_tail_but_does_not_truncate(tmp_path: Path) -> None:
    write(tmp_path, 50)
    seg = segments(tmp_path)[-1]
    with seg.open("ab") as f:
        f.write(frame(b"z" * 30)[:20])
    size = seg.stat().st_size
    report = tools.verify(tmp_path)
    assert report.ok
    torn = report.partitions[0].torn_tail
    assert torn is not None and torn.offset == 50
    assert seg.stat().st_size == size


def test_inspect_yields_records(tmp_path: Path) -> None:
    write(tmp_path, 120, partitions=2, segment_bytes=1024)
    everything = list(tools.inspect(tmp_path))
    assert everything == [(p, i, rec(i)) for p in range(2) for i in range(120)]
    assert list(tools.inspect(tmp_path, partition=1, from_offset=100, limit=5)) == [
        (1, i, rec(i)) for i in range(100, 105)
    ]
    assert len(list(tools.inspect(tmp_path, limit=130))) == 130


def test_inspect_raises_on_corruption(tmp_path: Path) -> None:
    write(tmp_path, 100)
    flip(segments(tmp_path)[0], 40 * FRAME + 12)
    with pytest.raises(LogCorruption) as info:
        list(tools.inspect(tmp_path))
    assert info.value.offset == 40


def test_tools_never_modify_files(tmp_path: Path) -> None:
    write(tmp_path, 100)
    (tmp_path / "p0000" / "00000000000000000000.idx").unlink()
    seg = segments(tmp_path)[0]
    with seg.open("ab") as f:
        f.write(b"\x07\x00")
    listing = sorted(os.listdir(tmp_path / "p0000"))
    size = seg.stat().st_size
    tools.verify(tmp_path)
    list(tools.inspect(tmp_path))
    assert sorted(os.listdir(tmp_path / "p0000")) == listing
    assert seg.stat().st_size == size


def test_seal_waits_for_a_group_already_being_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A group taken before the seal may still land, but only before seal() persists the fence
    and returns: no older-epoch record becomes durable after the seal."""
    write_durably, run_io = local_mod._write_durably, LocalLog._run
    started, gate = threading.Event(), threading.Event()
    order: list[str] = []

    def slow(fs: FileIO, fd: int, data: bytes, position: int, idx_fd: int, idx: bytes) -> None:
        started.set()
        gate.wait(30)
        write_durably(fs, fd, data, position, idx_fd, idx)
        order.append("durable")

    def spy(self: LocalLog, fn: Callable[..., T], *args: object) -> asyncio.Future[T]:
        if fn is local_mod._write_meta:
            order.append("fence written")
        return run_io(self, fn, *args)

    async def body() -> None:
        log = await LocalLog.open(tmp_path, 1)
        try:
            monkeypatch.setattr(local_mod, "_write_durably", slow)
            monkeypatch.setattr(LocalLog, "_run", spy)
            old = asyncio.create_task(log.append(0, [b"old"], epoch=1))
            await asyncio.to_thread(started.wait, 30)  # the group is in flight
            sealing = asyncio.create_task(log.seal(0, 2))
            sealing.add_done_callback(lambda _: order.append("sealed"))
            asyncio.get_running_loop().call_soon(gate.set)  # after seal() ran its first step
            assert await old == [0]
            await sealing
            assert order == ["durable", "fence written", "sealed"]
            with pytest.raises(LogSealed):
                await log.append(0, [b"older"], epoch=1)
        finally:
            await log.close()

    run(body)


def test_follower_ends_with_log_closed(tmp_path: Path) -> None:
    async def body() -> None:
        log = LocalLog(tmp_path, 1)
        waiting = asyncio.Event()

        async def follow() -> None:
            await log.append(0, [b"one"])
            async for _ in log.read(0, 0, follow=True):
                waiting.set()

        task = asyncio.create_task(follow())
        await waiting.wait()
        await log.close()
        with pytest.raises(LogClosed):
            await asyncio.wait_for(task, timeout=10)

    run(body)


def test_crash_during_trim_is_finished_on_open(tmp_path: Path) -> None:
    write(tmp_path, 200, segment_bytes=600, batch=5)
    before = segments(tmp_path)
    # trim() persists the new start first and deletes segments after: simulate a crash between
    (tmp_path / "p0000" / "meta.json").write_text('{"fence": 7, "start": 120}')
    got = read_back(tmp_path, from_offset=120, segment_bytes=600)
    assert [r.data for r in got] == [rec(i) for i in range(120, 200)]
    after = segments(tmp_path)
    assert len(after) < len(before)
    assert int(after[0].stem) <= 120
    assert tools.verify(tmp_path).partitions[0].fence == 7


def test_reopening_with_fewer_partitions_is_refused(tmp_path: Path) -> None:
    write(tmp_path, 1, partitions=3)
    with pytest.raises(ContractError):
        LocalLog(tmp_path, 2)
    read_back(tmp_path, partitions=4)  # growing is allowed
