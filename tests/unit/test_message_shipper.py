"""The message shipper (``processor/messages.py``): a message row the machine committed is
appended to its partition's log as a client record (epoch 0) stamped when it is shipped,
then deleted; rows for one partition keep their order; a failed append keeps the rows."""

from __future__ import annotations

import asyncio

import pytest

from conveyor.errors import TransientError
from conveyor.schemas import codec
from conveyor.schemas.types import CancelTasks
from conveyor.store import keys
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.processor.loop import PartitionProcessor
from conveyor.streams.processor.pool import WaitingPool


def cancel(n: int) -> CancelTasks:
    return CancelTasks(tenant="t", task_ids=[f"{n:032x}"], reason=f"message {n}")


def rows(kv: MemoryKV) -> list[bytes]:
    return [key for key, _ in kv.scan(keys.MESSAGES)]


def test_rows_are_appended_in_order_restamped_then_deleted() -> None:
    async def main() -> None:
        clock = FakeClock()
        log = MemoryLog(3)
        kv = MemoryKV()
        proc = PartitionProcessor(0, log, kv, clock=clock, pool=WaitingPool(clock))
        written_ms = clock.now_ms()
        batch = {}
        for seq, (target, n) in enumerate([(2, 1), (1, 2), (2, 3)]):
            data = codec.encode_record(cancel(n), epoch=0, ts_ms=written_ms, key="k")
            batch[keys.message(7, seq)] = keys.message_value(target, data)
        kv.write(batch)
        clock.advance(5_000)
        assert await proc.messages.ship_once()
        assert rows(kv) == [] and not await proc.messages.ship_once()
        for target, expected in ((1, [2]), (2, [1, 3])):
            got = [codec.decode_envelope(r.data) async for b in log.read(target, 0) for r in b]
            assert [e.epoch for e in got] == [0] * len(expected)  # client records: unfenced
            assert {e.ts_ms for e in got} == {written_ms + 5_000}  # "now" is the shipping
            assert [codec.decode_body(e) for e in got] == [cancel(n) for n in expected]
        assert log.end_offset(0) == 0  # nothing for its own partition

    asyncio.run(main())


def test_a_failed_append_keeps_the_rows_for_the_next_round() -> None:
    class FullLog(MemoryLog):
        full = True

        async def append(self, partition: int, records: list[bytes], epoch: int | None = None):  # type: ignore[no-untyped-def]
            if self.full:
                raise TransientError("disk full", retry_after_ms=10)
            return await super().append(partition, records, epoch)

    async def main() -> None:
        clock = FakeClock()
        log = FullLog(2)
        kv = MemoryKV()
        proc = PartitionProcessor(0, log, kv, clock=clock, pool=WaitingPool(clock))
        data = codec.encode_record(cancel(1), epoch=0, ts_ms=clock.now_ms(), key="k")
        kv.write({keys.message(3, 0): keys.message_value(1, data)})
        with pytest.raises(TransientError):
            await proc.messages.ship_once()
        assert rows(kv) == [keys.message(3, 0)]
        log.full = False
        assert await proc.messages.ship_once()
        assert rows(kv) == [] and log.end_offset(1) == 1

    asyncio.run(main())
