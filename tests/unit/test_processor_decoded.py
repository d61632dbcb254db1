"""Rule 5 of ``processor/loop.py``: a record the processor appends is applied from the objects it
encoded, not decoded back from the log, and that leaves the state a replay from the log's bytes
builds."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from conveyor.schemas import codec
from conveyor.schemas.types import CancelTasks, EnqueueTasks, TaskSpec
from conveyor.store import keys
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.processor.loop import QUARANTINE, PartitionProcessor
from conveyor.streams.processor.pool import WaitingPool
from conveyor.streams.routing import mint_task_id


def _processor(log: MemoryLog, kv: MemoryKV, clock: FakeClock) -> PartitionProcessor:
    return PartitionProcessor(0, log, kv, clock=clock, pool=WaitingPool(clock))


async def _apply_all(proc: PartitionProcessor, log: MemoryLog) -> None:
    async for batch in log.read(0, proc.applied + 1, follow=False):
        proc._apply_batch(batch)


def _specs(n: int) -> list[TaskSpec]:
    return [
        TaskSpec(
            task_id=mint_task_id(0),
            tenant="t",
            app="a",
            task_type="work",
            priority=i % 3,
            payload=b'{"i": %d}' % i,
            idempotency_key=f"key-{i}" if i % 2 else None,
            schedule_to_start_ms=60_000 if i == 1 else None,
        )
        for i in range(n)
    ]


def test_appended_records_apply_without_decoding_and_as_a_replay_of_their_bytes_does(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    decoded: list[Any] = []
    decode_body = codec.decode_body

    def counting(envelope: Any) -> Any:
        decoded.append(envelope.kind)
        return decode_body(envelope)

    monkeypatch.setattr(codec, "decode_body", counting)

    async def main() -> None:
        clock = FakeClock()
        log = MemoryLog(1)
        live_kv = MemoryKV()
        live = _processor(log, live_kv, clock)
        specs = _specs(6)
        raws = [codec.TASK_SPEC.encode(s) for s in specs]
        submitted = [
            asyncio.create_task(live.submit(EnqueueTasks(tasks=raws), "k", specs=specs)),
            asyncio.create_task(
                live.submit(CancelTasks(tenant="t", task_ids=[specs[2].task_id]), "k")
            ),
        ]
        await asyncio.sleep(0.01)  # both appended, neither applied
        await _apply_all(live, log)
        enqueued, canceled = await asyncio.gather(*submitted)
        assert [r.created for r in enqueued] == [True] * 6
        assert canceled[0].ok
        assert decoded == []  # applied from what was encoded

        replayed_kv = MemoryKV()
        await _apply_all(_processor(log, replayed_kv, clock), log)
        assert decoded == ["EnqueueTasks", "CancelTasks"]
        assert dict(replayed_kv.data) == dict(live_kv.data)

    asyncio.run(main())


def test_a_failed_append_keeps_nothing_decoded() -> None:
    class Refusing(MemoryLog):
        async def append(self, partition: int, records: Any, epoch: int | None = None) -> Any:
            raise OSError("disk full")

    async def main() -> None:
        clock = FakeClock()
        proc = _processor(Refusing(1), MemoryKV(), clock)
        with pytest.raises(OSError):
            await proc.submit(CancelTasks(tenant="t", task_ids=["x"]), "k")
        assert proc._appended == {}

    asyncio.run(main())


def test_a_record_stamped_past_any_real_time_is_quarantined_live_as_in_a_replay() -> None:
    """Decoding refuses a stamp at or after year 10000, so keeping the objects must not let
    the live processor apply what a replay would quarantine."""

    async def main() -> None:
        clock = FakeClock(start_ms=codec.TS_MS_END)
        log = MemoryLog(1)
        proc = _processor(log, MemoryKV(), clock)
        submitted = asyncio.create_task(proc.submit(CancelTasks(tenant="t", task_ids=["x"]), "k"))
        await asyncio.sleep(0.01)
        await _apply_all(proc, log)
        assert await submitted == []  # quarantined: no replies
        assert proc.kv.get(QUARANTINE + keys.u64(0)) is not None

    asyncio.run(main())
