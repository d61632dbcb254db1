"""The Log contract (rules 1-5 of conveyor.streams.log.api), run against every implementation."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from conveyor.streams.log.api import Log, LogRecord, LogSealed, LogTrimmed
from conveyor.streams.log.local import LocalLog
from conveyor.streams.log.memory import MemoryLog

PARTITIONS = 3


@dataclass
class Backend:
    name: str
    make: Callable[[], Log]
    durable: bool

    def run(self, body: Callable[[Log], Awaitable[None]]) -> None:
        """Open a log, run ``body`` on it in a fresh event loop, close it."""

        async def main() -> None:
            log = self.make()
            try:
                await body(log)
            finally:
                await log.close()

        asyncio.run(main())


def make_backend(kind: str, tmp_path: Path) -> Backend:
    if kind == "memory":
        return Backend("memory", lambda: MemoryLog(PARTITIONS), durable=False)
    # small segments so that the suite also crosses segment boundaries
    root = tmp_path / "log"
    return Backend("local", lambda: LocalLog(root, PARTITIONS, segment_bytes=1024), durable=True)


@pytest.fixture(params=["memory", "local"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path)


@pytest.fixture(params=["local"])  # the durable implementations (Kafka joins here)
def durable_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path)


def payloads(n: int, tag: str = "r") -> list[bytes]:
    return [f"{tag}-{i:05d}".encode() * 3 for i in range(n)]


async def read_all(
    log: Log, partition: int, from_offset: int, max_batch: int = 1024
) -> list[LogRecord]:
    out: list[LogRecord] = []
    async for batch in log.read(partition, from_offset, max_batch=max_batch):
        assert 0 < len(batch) <= max_batch
        out.extend(batch)
    return out


def test_append_returns_consecutive_offsets(backend: Backend) -> None:
    async def body(log: Log) -> None:
        assert await log.append(0, [b"a", b"b", b"c"]) == [0, 1, 2]
        assert await log.append(0, [b"d"]) == [3]
        assert await log.append(0, []) == []
        assert await log.append(1, [b"x", b"y"]) == [0, 1]
        assert await log.append(0, [b"e", b""]) == [4, 5]

    backend.run(body)


def test_read_returns_appended_records_in_order_from_any_offset(backend: Backend) -> None:
    records = payloads(120)

    async def body(log: Log) -> None:
        for i in range(0, len(records), 7):
            await log.append(2, records[i : i + 7])
        for start in [*range(0, 12), 50, 63, 64, 99, 119, 120]:
            got = await read_all(log, 2, start)
            assert [r.offset for r in got] == list(range(start, len(records)))
            assert [r.data for r in got] == records[start:]
        small = await read_all(log, 2, 5, max_batch=4)
        assert [r.data for r in small] == records[5:]
        assert await read_all(log, 2, 500) == []
        assert await read_all(log, 0, 0) == []

    backend.run(body)


def test_follow_wakes_on_a_later_append(backend: Backend) -> None:
    async def body(log: Log) -> None:
        await log.append(1, [b"first"])
        caught_up = asyncio.Event()
        seen: list[LogRecord] = []

        async def follower() -> None:
            async for batch in log.read(1, 0, follow=True):
                seen.extend(batch)
                caught_up.set()  # the follower goes on to wait at the tail in this same step
                if len(seen) >= 3:
                    return

        task = asyncio.create_task(follower())
        await caught_up.wait()
        assert not task.done()
        await log.append(1, [b"second", b"third"])
        await asyncio.wait_for(task, timeout=10)
        assert [(r.offset, r.data) for r in seen] == [(0, b"first"), (1, b"second"), (2, b"third")]

    backend.run(body)


def test_seal_rejects_older_epochs_and_accepts_equal_newer_and_unepoched(backend: Backend) -> None:
    async def body(log: Log) -> None:
        assert log.fence(0) == 0
        assert await log.append(0, [b"e1"], epoch=1) == [0]
        await log.seal(0, 3)
        assert log.fence(0) == 3
        with pytest.raises(LogSealed):
            await log.append(0, [b"e2"], epoch=2)
        assert log.end_offset(0) == 1
        assert await log.append(0, [b"e3"], epoch=3) == [1]
        assert await log.append(0, [b"e4"], epoch=4) == [2]
        assert await log.append(0, [b"client"]) == [3]
        await log.seal(0, 2)  # never lowers
        assert log.fence(0) == 3
        assert await log.append(1, [b"other partition"], epoch=1) == [0]
        assert [r.data for r in await read_all(log, 0, 0)] == [b"e1", b"e3", b"e4", b"client"]

    backend.run(body)


def test_fence_survives_reopen(durable_backend: Backend) -> None:
    backend = durable_backend

    async def seal(log: Log) -> None:
        await log.append(0, [b"before"], epoch=4)
        await log.seal(0, 5)

    async def check(log: Log) -> None:
        assert log.fence(0) == 5
        assert log.fence(1) == 0
        with pytest.raises(LogSealed):
            await log.append(0, [b"stale"], epoch=4)
        assert await log.append(0, [b"fresh"], epoch=5) == [1]

    backend.run(seal)
    backend.run(check)


def test_trim(backend: Backend) -> None:
    records = payloads(100)

    async def body(log: Log) -> None:
        for i in range(0, 100, 10):
            await log.append(0, records[i : i + 10])
        assert log.start_offset(0) == 0
        await log.trim(0, 50)
        assert log.start_offset(0) == 50
        assert log.end_offset(0) == 100
        assert [r.data for r in await read_all(log, 0, 50)] == records[50:]
        with pytest.raises(LogTrimmed):
            await read_all(log, 0, 10)
        await log.trim(0, 30)  # never moves back
        assert log.start_offset(0) == 50
        await log.trim(0, 1000)  # clamped to the end
        assert log.start_offset(0) == 100
        assert await log.append(0, [b"after"]) == [100]
        assert [r.data for r in await read_all(log, 0, 100)] == [b"after"]

    backend.run(body)


def test_end_offset(backend: Backend) -> None:
    async def body(log: Log) -> None:
        assert [log.end_offset(p) for p in range(PARTITIONS)] == [0, 0, 0]
        await log.append(1, payloads(5))
        await log.append(1, payloads(2))
        await log.append(2, payloads(1))
        assert [log.end_offset(p) for p in range(PARTITIONS)] == [0, 7, 1]
        assert log.partitions == PARTITIONS

    backend.run(body)


def test_concurrent_appends_get_distinct_consecutive_offsets(backend: Backend) -> None:
    async def body(log: Log) -> None:
        batches = [[f"{i}-{j}".encode() for j in range(i % 5 + 1)] for i in range(50)]
        results = await asyncio.gather(*(log.append(0, b) for b in batches))
        for batch, offsets in zip(batches, results, strict=True):
            assert len(offsets) == len(batch)
            assert offsets == list(range(offsets[0], offsets[0] + len(batch)))
        flat = sorted(o for offsets in results for o in offsets)
        assert flat == list(range(sum(map(len, batches))))
        by_offset = {
            o: d
            for b, offs in zip(batches, results, strict=True)
            for o, d in zip(offs, b, strict=True)
        }
        got = await read_all(log, 0, 0)
        assert [(r.offset, r.data) for r in got] == sorted(by_offset.items())

    backend.run(body)
