"""The Log contract (rules 1-5 of conveyor.streams.log.api), run against every implementation.

Offsets are asserted strictly increasing, not dense: Kafka's commit markers take offsets.
The memory and local logs keep dense offsets, which ``test_memory_and_local_offsets_are_dense``
holds them to.
"""

from __future__ import annotations

import asyncio
import itertools
import uuid
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
    make: Callable[[], Awaitable[Log]]
    durable: bool

    def run(self, body: Callable[[Log], Awaitable[None]]) -> None:
        """Open a log, run ``body`` on it in a fresh event loop, close it."""

        async def main() -> None:
            log = await self.make()
            try:
                await body(log)
            finally:
                await log.close()

        asyncio.run(main())


def make_backend(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> Backend:
    if kind == "memory":

        async def memory() -> Log:
            return MemoryLog(PARTITIONS)

        return Backend("memory", memory, durable=False)
    if kind == "kafka":
        return kafka_backend(request.getfixturevalue("kafka_cluster").bootstrap)
    root = tmp_path / "log"

    async def local() -> Log:  # small segments so that the suite also crosses segment boundaries
        return LocalLog(root, PARTITIONS, segment_bytes=1024)

    return Backend("local", local, durable=True)


def kafka_backend(bootstrap: str) -> Backend:
    from conveyor.streams.log.kafka import KafkaLog

    topic = f"contract-{uuid.uuid4().hex[:12]}"  # one topic per test: no test sees another's

    async def kafka() -> Log:
        return await KafkaLog.open(bootstrap, PARTITIONS, topic=topic)

    return Backend("kafka", kafka, durable=True)


@pytest.fixture(params=["memory", "local", "kafka"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path, request)


@pytest.fixture(params=["local", "kafka"])  # the durable implementations
def durable_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path, request)


@pytest.fixture(params=["memory", "local"])
def dense_backend(request: pytest.FixtureRequest, tmp_path: Path) -> Backend:
    return make_backend(request.param, tmp_path, request)


def increasing(offsets: list[int]) -> bool:
    return all(a < b for a, b in itertools.pairwise(offsets))


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


def test_append_returns_increasing_offsets_in_batch_order(backend: Backend) -> None:
    async def body(log: Log) -> None:
        first = await log.append(0, [b"a", b"b", b"c"])
        second = await log.append(0, [b"d"])
        assert await log.append(0, []) == []
        third = await log.append(0, [b"e", b""])
        assert len(first) == 3 and len(second) == 1 and len(third) == 2
        assert increasing(first + second + third)
        assert first[0] >= 0
        assert await log.append(1, [b"x", b"y"]) == await offsets_of(log, 1)
        got = await read_all(log, 0, 0)
        assert [(r.offset, r.data) for r in got] == list(
            zip(first + second + third, [b"a", b"b", b"c", b"d", b"e", b""], strict=True)
        )

    backend.run(body)


def test_memory_and_local_offsets_are_dense(dense_backend: Backend) -> None:
    async def body(log: Log) -> None:
        assert await log.append(0, [b"a", b"b", b"c"]) == [0, 1, 2]
        assert await log.append(0, [b"d"], epoch=1) == [3]
        assert await log.append(1, [b"x", b"y"]) == [0, 1]

    dense_backend.run(body)


async def offsets_of(log: Log, partition: int) -> list[int]:
    return [r.offset for r in await read_all(log, partition, 0)]


def test_read_returns_appended_records_in_order_from_any_offset(backend: Backend) -> None:
    records = payloads(120)

    async def body(log: Log) -> None:
        offsets: list[int] = []
        for i in range(0, len(records), 7):
            offsets += await log.append(2, records[i : i + 7], epoch=1 if i % 2 else None)
        for i in [*range(0, 12), 50, 63, 64, 99, 119]:
            got = await read_all(log, 2, offsets[i])
            assert [r.offset for r in got] == offsets[i:]
            assert [r.data for r in got] == records[i:]
        small = await read_all(log, 2, offsets[5], max_batch=4)
        assert [r.data for r in small] == records[5:]
        assert await read_all(log, 2, log.end_offset(2)) == []
        assert await read_all(log, 2, log.end_offset(2) + 500) == []
        assert await read_all(log, 0, 0) == []

    backend.run(body)


def test_follow_wakes_on_a_later_append(backend: Backend) -> None:
    async def body(log: Log) -> None:
        appended = await log.append(1, [b"first"])
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
        appended += await log.append(1, [b"second", b"third"], epoch=1)
        await asyncio.wait_for(task, timeout=10)
        assert [(r.offset, r.data) for r in seen] == list(
            zip(appended, [b"first", b"second", b"third"], strict=True)
        )

    backend.run(body)


def test_seal_rejects_older_epochs_and_accepts_equal_newer_and_unepoched(backend: Backend) -> None:
    async def body(log: Log) -> None:
        assert log.fence(0) == 0
        (e1,) = await log.append(0, [b"e1"], epoch=1)
        await log.seal(0, 3)
        assert log.fence(0) == 3
        end = log.end_offset(0)
        with pytest.raises(LogSealed):
            await log.append(0, [b"e2"], epoch=2)
        assert log.end_offset(0) == end
        (e3,) = await log.append(0, [b"e3"], epoch=3)
        (e4,) = await log.append(0, [b"e4"], epoch=4)
        (client,) = await log.append(0, [b"client"])
        assert increasing([e1, e3, e4, client])
        await log.seal(0, 2)  # never lowers
        assert log.fence(0) == 3
        assert len(await log.append(1, [b"other partition"], epoch=1)) == 1
        assert [r.data for r in await read_all(log, 0, 0)] == [b"e1", b"e3", b"e4", b"client"]

    backend.run(body)


def test_fence_survives_reopen(durable_backend: Backend) -> None:
    backend = durable_backend
    before: list[int] = []

    async def seal(log: Log) -> None:
        before.extend(await log.append(0, [b"before"], epoch=4))
        await log.seal(0, 5)

    async def check(log: Log) -> None:
        assert log.fence(0) == 5
        assert log.fence(1) == 0
        assert log.end_offset(0) == before[0] + 1
        with pytest.raises(LogSealed):
            await log.append(0, [b"stale"], epoch=4)
        (fresh,) = await log.append(0, [b"fresh"], epoch=5)
        assert fresh > before[0]
        assert [r.data for r in await read_all(log, 0, 0)] == [b"before", b"fresh"]

    backend.run(seal)
    backend.run(check)


def test_records_survive_reopen(durable_backend: Backend) -> None:
    records = payloads(30)
    offsets: list[int] = []

    async def write(log: Log) -> None:
        offsets.extend(await log.append(1, records[:20]))
        offsets.extend(await log.append(1, records[20:], epoch=1))

    async def check(log: Log) -> None:
        got = await read_all(log, 1, 0)
        assert [(r.offset, r.data) for r in got] == list(zip(offsets, records, strict=True))
        assert log.end_offset(1) == offsets[-1] + 1

    durable_backend.run(write)
    durable_backend.run(check)


def test_trim(backend: Backend) -> None:
    records = payloads(100)

    async def body(log: Log) -> None:
        offsets: list[int] = []
        for i in range(0, 100, 10):
            offsets += await log.append(0, records[i : i + 10])
        assert log.start_offset(0) == 0
        await log.trim(0, offsets[50])
        assert log.start_offset(0) == offsets[50]
        assert log.end_offset(0) == offsets[-1] + 1
        assert [r.data for r in await read_all(log, 0, offsets[50])] == records[50:]
        with pytest.raises(LogTrimmed):
            await read_all(log, 0, offsets[10])
        await log.trim(0, offsets[30])  # never moves back
        assert log.start_offset(0) == offsets[50]
        await log.trim(0, offsets[-1] + 1000)  # clamped to the end
        assert log.start_offset(0) == log.end_offset(0)
        (after,) = await log.append(0, [b"after"])
        assert after >= log.start_offset(0)
        assert [r.data for r in await read_all(log, 0, log.start_offset(0))] == [b"after"]

    backend.run(body)


def test_end_offset_is_one_past_the_last_record(backend: Backend) -> None:
    async def body(log: Log) -> None:
        assert [log.end_offset(p) for p in range(PARTITIONS)] == [0, 0, 0]
        await log.append(1, payloads(5))
        ones = await log.append(1, payloads(2), epoch=1)
        twos = await log.append(2, payloads(1))
        assert [log.end_offset(p) for p in range(PARTITIONS)] == [0, ones[-1] + 1, twos[-1] + 1]
        assert log.partitions == PARTITIONS

    backend.run(body)


@pytest.mark.parametrize("epoch", [None, 1], ids=["client", "epoched"])
def test_concurrent_appends_get_distinct_increasing_offsets(
    backend: Backend, epoch: int | None
) -> None:
    async def body(log: Log) -> None:
        batches = [[f"{i}-{j}".encode() for j in range(i % 5 + 1)] for i in range(50)]
        results = await asyncio.gather(*(log.append(0, b, epoch=epoch) for b in batches))
        for batch, offsets in zip(batches, results, strict=True):
            assert len(offsets) == len(batch)
            assert increasing(offsets)
        flat = [o for offsets in results for o in offsets]
        assert len(set(flat)) == sum(map(len, batches))
        by_offset = {
            o: d
            for b, offs in zip(batches, results, strict=True)
            for o, d in zip(offs, b, strict=True)
        }
        got = await read_all(log, 0, 0)
        assert [(r.offset, r.data) for r in got] == sorted(by_offset.items())

    backend.run(body)
