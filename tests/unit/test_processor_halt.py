"""A partition that halts (its log unreadable) fails every submit waiting on it, including one
whose append was still in flight when it halted: the caller gets a clear error, never a hang.
(Found by the power-cut chaos test: the cut removed a segment the apply loop was about to read
while clients' appends were under way.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest
from test_fencing import poll

from conveyor.errors import TransientError
from conveyor.schemas import codec
from conveyor.schemas.types import CancelTasks, EnqueueTasks, TaskSpec
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.api import LogRecord
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.processor.leases import CONTINUE, LOST
from conveyor.streams.processor.loop import PartitionProcessor
from conveyor.streams.processor.pool import WaitingPool
from conveyor.streams.routing import mint_task_id


class BreakingLog(MemoryLog):
    """Appends wait for ``appends``; reads fail once ``broken`` is set."""

    def __init__(self) -> None:
        super().__init__(1)
        self.appends = asyncio.Event()
        self.broken = asyncio.Event()

    async def append(
        self, partition: int, records: Sequence[bytes], epoch: int | None = None
    ) -> list[int]:
        await self.appends.wait()
        return await super().append(partition, records, epoch)

    async def read(
        self, partition: int, from_offset: int, *, follow: bool = False, max_batch: int = 1024
    ) -> AsyncIterator[list[LogRecord]]:
        await self.broken.wait()
        raise FileNotFoundError("segment gone")
        yield []  # an async generator, like the real reads


def test_a_submit_appended_while_the_partition_halted_fails_instead_of_waiting_forever() -> None:
    async def main() -> None:
        clock = FakeClock()
        log = BreakingLog()
        log.appends.set()  # nothing to replay: start() reads nothing
        proc = PartitionProcessor(0, log, MemoryKV(), clock=clock, pool=WaitingPool(clock))
        await proc.start(lead=False)
        log.appends.clear()
        spec = TaskSpec(task_id=mint_task_id(0), tenant="t", app="a", task_type="work")
        record = EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec)])
        submit = asyncio.create_task(proc.submit(record, "k", specs=[spec]))
        await asyncio.sleep(0.01)  # the append is in flight
        log.broken.set()
        await asyncio.sleep(0.01)
        assert isinstance(proc.halted, FileNotFoundError)
        log.appends.set()  # the append completes after the halt
        with pytest.raises(TransientError, match="partition 0 halted"):
            await asyncio.wait_for(submit, 2)
        await proc.stop()

    asyncio.run(main())


class FailingLaterLog(MemoryLog):
    """Reads of partition ``failing`` fail from the first record appended after ``broken``
    is set (the disk under that partition went bad)."""

    def __init__(self, partitions: int = 1, failing: int = 0) -> None:
        super().__init__(partitions)
        self.failing = failing
        self.broken = False

    async def read(
        self, partition: int, from_offset: int, *, follow: bool = False, max_batch: int = 1024
    ) -> AsyncIterator[list[LogRecord]]:
        async for batch in super().read(partition, from_offset, follow=follow, max_batch=max_batch):
            if self.broken and partition == self.failing:
                raise OSError(5, "Input/output error")
            yield batch


def test_a_halted_partition_steps_down_its_leases_are_lost_and_it_proposes_nothing_more() -> None:
    async def main() -> None:
        clock = FakeClock()
        log = FailingLaterLog()
        proc = PartitionProcessor(0, log, MemoryKV(), clock=clock, pool=WaitingPool(clock))
        await proc.start()
        try:
            spec = TaskSpec(task_id=mint_task_id(0), tenant="t", app="a", task_type="work")
            await proc.submit(EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec)]), "k", specs=[spec])
            (lease,) = await poll(proc.pool, app="a")
            assert proc.leases.heartbeat(lease.task_id, lease.lease_id) == CONTINUE
            log.broken = True
            cancel = CancelTasks(tenant="t", task_ids=[spec.task_id])
            with pytest.raises(TransientError, match="partition 0 halted"):
                await proc.submit(cancel, "k")
            assert isinstance(proc.halted, OSError)
            assert proc.leader is False
            assert proc.leases.heartbeat(lease.task_id, lease.lease_id) == LOST
            end = log.end_offset(0)
            for _ in range(10):  # the lease's expiry, timers and grants would be due by now
                clock.advance(60_000)
                await asyncio.sleep(0.01)
            assert log.end_offset(0) == end, "a halted partition went on proposing records"
        finally:
            await proc.stop()

    asyncio.run(main())
