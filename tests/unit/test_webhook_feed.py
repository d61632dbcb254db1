"""The webhook deliverer's feed (``streams/webhooks/deliver.py``) over the memory log and a real
SQLite store: which events become deliveries, that the cursor is committed with them, and that
feeding again from the stored cursor makes no second delivery."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from standardwebhooks import Webhook as Verifier

from conveyor.schemas.codec import EVENT_BATCH
from conveyor.schemas.types import EventBatch, EventKind, TaskEvent
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.webhooks.deliver import Webhooks, sign
from conveyor.streams.webhooks.store import Store


def event(
    version: int, kind: EventKind, tenant: str, ts_ms: int, task_type: str = "x"
) -> TaskEvent:
    return TaskEvent(
        kind=kind,
        task_id=f"task{version}",
        tenant=tenant,
        app="a",
        task_type=task_type,
        queue="q",
        status="FAILED",
        attempt=1,
        ts_ms=ts_ms,
        version=version,
    )


async def feed_until_idle(service: Webhooks) -> None:
    task = asyncio.create_task(service.feed())
    await asyncio.sleep(0.5)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def test_deliveries_follow_tenant_type_and_registration_time(tmp_path: Path) -> None:
    async def run() -> None:
        now = int(time.time() * 1000)  # signatures are checked against the real time
        clock = FakeClock(start_ms=now)
        log = MemoryLog(1)
        store = Store(tmp_path / "webhooks.sqlite3")
        service = Webhooks(store, log, clock=clock)
        await feed_until_idle(service)  # the first start commits the tail as its cursor
        failed = frozenset({"task.failed"})
        mine = await service.create("t", "http://93.184.215.14/", failed, None)
        typed = await service.create("t", "http://93.184.215.14/", failed, frozenset({"y"}))
        other = await service.create("u", "http://93.184.215.14/", failed, None)
        events = [
            event(0, EventKind.TaskFailed, "t", ts_ms=now - 1),  # before the registrations
            event(1, EventKind.TaskFailed, "t", ts_ms=now),
            event(2, EventKind.TaskEnqueued, "t", ts_ms=now),  # a type nobody asked for
            event(3, EventKind.TaskFailed, "u", ts_ms=now),
            event(4, EventKind.TaskFailed, "t", ts_ms=now, task_type="y"),
        ]
        await log.append(0, [EVENT_BATCH.encode(EventBatch(partition=0, offset=4, events=events))])
        await feed_until_idle(service)
        got = {
            hook.id: sorted(d.event_id for d in await store.deliveries(hook.id, None, 10))
            for hook in (mine, typed, other)
        }
        assert got == {
            mine.id: ["evt_0_1_0", "evt_0_4_0"],
            typed.id: ["evt_0_4_0"],
            other.id: ["evt_0_3_0"],
        }
        cursor = await store.cursor()
        await feed_until_idle(service)  # again from the stored cursor: nothing new
        assert await store.cursor() == cursor
        assert len(await store.deliveries(mine.id, None, 10)) == 2
        (d,) = await store.deliveries(other.id, None, 10)
        headers = sign(other.secret, d.event_id, clock.now_ms() // 1000, d.body)
        body = Verifier(other.secret).verify(d.body, headers)
        assert body["type"] == "task.failed" and body["data"]["task_id"] == "task3"
        store.close()

    asyncio.run(run())
