"""A partition that halts (its log unreadable) fails every submit waiting on it, including one
whose append was still in flight when it halted: the caller gets a clear error, never a hang.
(Found by the power-cut chaos test: the cut removed a segment the apply loop was about to read
while clients' appends were under way.)"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

import pytest

from conveyor.errors import TransientError
from conveyor.schemas import codec
from conveyor.schemas.types import EnqueueTasks, TaskSpec
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.api import LogRecord
from conveyor.streams.log.memory import MemoryLog
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
