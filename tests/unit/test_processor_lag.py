"""Processor lag in seconds (``conveyor_processor_lag_seconds``): the age of the oldest record
appended but not applied, 0 when caught up; an idle stretch before a record arrives does not
count as lag."""

from __future__ import annotations

import asyncio

from conveyor.schemas import codec
from conveyor.schemas.types import CancelTasks
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.node import Node
from conveyor.streams.processor.loop import PartitionProcessor
from conveyor.streams.processor.pool import WaitingPool
from conveyor.streams.sinks.metrics import Metrics

CANCEL = CancelTasks(tenant="t", task_ids=[], reason="nothing")


async def apply_all(proc: PartitionProcessor, log: MemoryLog) -> None:
    """What the apply loop does with each batch, up to the end of the log."""
    async for batch in log.read(0, proc.applied + 1, follow=False):
        proc._apply_batch(batch)
        proc._note_progress()


def test_lag_is_the_age_of_the_oldest_unapplied_record() -> None:
    async def main() -> None:
        clock = FakeClock()
        log = MemoryLog(1)
        proc = PartitionProcessor(0, log, MemoryKV(), clock=clock, pool=WaitingPool(clock))
        assert (proc.lag_records(), proc.lag_s()) == (0, 0.0)
        clock.advance(60_000)  # idle: no lag
        # ``submit`` appends and waits for the apply; the loop is not running, so it waits.
        first = asyncio.create_task(proc.submit(CANCEL, "k1"))
        await asyncio.sleep(0.01)
        clock.advance(2_000)
        second = asyncio.create_task(proc.submit(CANCEL, "k2"))
        await asyncio.sleep(0.01)
        clock.advance(1_500)
        assert proc.lag_records() == 2
        assert proc.lag_s() == 3.5  # the first record's age, not the idle minute before it
        await apply_all(proc, log)
        await asyncio.gather(first, second)
        assert (proc.lag_records(), proc.lag_s()) == (0, 0.0)

    asyncio.run(main())


def test_a_record_appended_elsewhere_is_bounded_by_the_last_catch_up() -> None:
    async def main() -> None:
        clock = FakeClock()
        log = MemoryLog(1)
        proc = PartitionProcessor(0, log, MemoryKV(), clock=clock, pool=WaitingPool(clock))
        stamp = clock.now_ms()
        await log.append(0, [codec.encode_record(CANCEL, epoch=0, ts_ms=stamp, key="k")])
        await apply_all(proc, log)
        clock.advance(5_000)
        await log.append(0, [codec.encode_record(CANCEL, epoch=0, ts_ms=stamp, key="k")])
        clock.advance(1_000)
        assert proc.lag_s() == 6.0  # caught up 6 s ago: an upper bound

    asyncio.run(main())


def test_the_metric_is_exposed_per_partition() -> None:
    node = Node.in_memory(2)
    metrics = Metrics()
    metrics.watch(node)
    text = metrics.exposition().decode()
    assert 'conveyor_processor_lag_seconds{partition="0"} 0.0' in text
    assert 'conveyor_processor_lag_seconds{partition="1"} 0.0' in text
