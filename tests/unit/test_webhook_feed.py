"""The webhook deliverer's feed (``streams/webhooks/deliver.py``) over the memory log and a real
SQLite store: which events become deliveries, that the cursor is committed with them, and that
feeding again from the stored cursor makes no second delivery."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from standardwebhooks import Webhook as Verifier

from conveyor.schemas.codec import EVENT_BATCH
from conveyor.schemas.types import EventBatch, EventKind, TaskEvent
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.webhooks import deliver
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


def test_with_no_webhook_the_events_are_skipped_and_a_new_one_gets_what_follows(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tails: list[object] = []

    class CountedTail(deliver.Tail):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            tails.append(self)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(deliver, "Tail", CountedTail)

    async def until(check: Callable[[], Awaitable[bool]]) -> None:
        deadline = time.monotonic() + 10
        while not await check():
            assert time.monotonic() < deadline, "timed out"
            await asyncio.sleep(0.02)

    async def run() -> None:
        clock = FakeClock(start_ms=int(time.time() * 1000))
        log = MemoryLog(2)
        store = Store(tmp_path / "webhooks.sqlite3")
        service = Webhooks(store, log, clock=clock)
        feeding = asyncio.create_task(service.feed())
        failed = frozenset({"task.failed"})

        async def append(version: int) -> None:
            batch = EventBatch(
                partition=0,
                offset=version,
                events=[event(version, EventKind.TaskFailed, "t", ts_ms=clock.now_ms())],
            )
            await log.append(0, [EVENT_BATCH.encode(batch)])

        async def skipped_to_the_end() -> bool:
            return service.needed == {0: log.end_offset(0), 1: log.end_offset(1)}

        for version in range(3):  # no webhook: nothing reads them, the cursor moves past them
            await append(version)
        await until(skipped_to_the_end)
        assert tails == [] and service.needed[0] == 3
        clock.advance(1)
        hook = await service.create("t", "http://93.184.215.14/", failed, None)
        await append(3)  # after the registration: delivered

        async def delivered() -> bool:
            return len(await store.deliveries(hook.id, None, 10)) == 1

        await until(delivered)
        assert len(tails) == 1  # read from the skipped-to position, once a webhook was there
        (d,) = await store.deliveries(hook.id, None, 10)
        assert d.event_id == "evt_0_3_0"
        await service.delete("t", hook.id)  # none left: skipping again
        for version in range(4, 6):
            await append(version)
        await until(skipped_to_the_end)
        assert len(tails) == 1 and service.needed[0] == 6
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        store.close()

    asyncio.run(run())


def test_a_registration_under_way_keeps_the_feed_from_skipping(tmp_path: Path) -> None:
    """The ends of the log are taken only when no registration began meanwhile: a webhook
    whose row is still being written must get the events after its created_ms."""

    async def run() -> None:
        clock = FakeClock(start_ms=int(time.time() * 1000))
        service = Webhooks(Store(tmp_path / "webhooks.sqlite3"), MemoryLog(1), clock=clock)
        assert not service._any()
        release = asyncio.Event()
        add = service.store.add_webhook

        async def slow_add(hook: Any) -> None:
            await release.wait()
            await add(hook)

        service.store.add_webhook = slow_add  # type: ignore[method-assign]
        creating = asyncio.create_task(
            service.create("t", "http://93.184.215.14/", frozenset({"task.failed"}), None)
        )
        await asyncio.sleep(0.05)
        assert service._any() and service.hooks == {}  # under way: counts as registered
        positions = [deliver.Position(next=0, skip=0, seen=-1)]
        assert await service._skip(positions) is positions  # returns at once, moving nothing
        release.set()
        await creating
        assert service._any() and len(service.hooks) == 1
        service.store.close()

    asyncio.run(run())


def test_where_other_processes_append_the_feed_keeps_reading_without_webhooks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On Kafka the end this node knows of a partition another node writes lags; skipping to
    it would leave the cursor (which holds the events topic's trim) behind. So it reads."""
    tails: list[object] = []

    class CountedTail(deliver.Tail):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            tails.append(self)
            super().__init__(*args, **kwargs)

    class SharedLog(MemoryLog):
        @property
        def ends_known(self) -> bool:
            return False

    monkeypatch.setattr(deliver, "Tail", CountedTail)

    async def run() -> None:
        clock = FakeClock(start_ms=int(time.time() * 1000))
        log = SharedLog(1)
        service = Webhooks(Store(tmp_path / "webhooks.sqlite3"), log, clock=clock)
        batch = EventBatch(
            partition=0, offset=0, events=[event(0, EventKind.TaskFailed, "t", clock.now_ms())]
        )
        await service._start_positions()  # the cursor at the (empty) log's end
        await log.append(0, [EVENT_BATCH.encode(batch)])
        feeding = asyncio.create_task(service.feed())
        deadline = time.monotonic() + 10
        while service.needed.get(0) != 1:  # read past it, though no webhook wants it
            assert time.monotonic() < deadline, service.needed
            clock.advance(deliver.CURSOR_COMMIT_MS)  # committed once a second, as before
            await asyncio.sleep(0.05)
        assert len(tails) == 1
        feeding.cancel()
        await asyncio.gather(feeding, return_exceptions=True)
        service.store.close()

    asyncio.run(run())
