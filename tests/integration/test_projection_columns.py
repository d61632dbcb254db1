"""The projection against a real PostgreSQL, fed synthetic events through an in-memory events
log: columns the events fix must read in the snapshot as the events say, whatever the chunking.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_projection import _fresh_pool, pg_server  # noqa: F401  (the fixture, by name)

from conveyor.schemas.codec import EVENT_BATCH
from conveyor.schemas.types import EventBatch, EventKind, TaskEvent
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.sinks.projector import Projector

pytestmark = pytest.mark.timeout(120)


def _event(kind: EventKind, status: str, attempt: int, version: int, ts_ms: int) -> TaskEvent:
    return TaskEvent(
        kind=kind,
        task_id="t1",
        tenant="alpha",
        app="shop",
        task_type="email",
        queue="q",
        status=status,
        attempt=attempt,
        ts_ms=ts_ms,
        version=version,
        agent_id="a",
    )


async def _ship(events: MemoryLog, *batch: TaskEvent) -> None:
    """One record of the processor: its events, shipped to events partition 0."""
    record = EventBatch(partition=0, offset=batch[0].version, events=list(batch))
    await events.append(0, [EVENT_BATCH.encode(record)])


def _project(dsn: str, body: Any) -> Any:
    async def main() -> Any:
        async with _fresh_pool(dsn) as pool:
            return await body(MemoryLog(1), pool)

    return asyncio.run(main())


def test_created_ms_stays_the_enqueue_time_when_a_later_event_is_stamped_earlier(
    pg_server: Any,  # noqa: F811
) -> None:
    """Records are stamped with the leader's wall clock, which may step back (a new leader on
    a node whose clock is behind, an NTP step). The task was created when TaskEnqueued says,
    as the processor's row keeps it; a later chunk without that event must not move it."""

    async def body(events: MemoryLog, pool: Any) -> Any:
        await _ship(events, _event(EventKind.TaskEnqueued, "ENQUEUED", 1, 0, ts_ms=10_000))
        await Projector(events, pool).catch_up()
        await _ship(events, _event(EventKind.TaskLeased, "LEASED", 1, 1, ts_ms=9_990))
        await _ship(events, _event(EventKind.TaskSucceeded, "SUCCEEDED", 1, 2, ts_ms=9_995))
        await Projector(events, pool).catch_up()
        return await pool.fetchrow("SELECT status, created_ms FROM tasks WHERE task_id = 't1'")

    row = _project(str(pg_server.get_uri()), body)
    assert (row["status"], row["created_ms"]) == ("SUCCEEDED", 10_000)


def test_an_attempt_that_ends_in_a_sleep_is_closed(pg_server: Any) -> None:  # noqa: F811
    """A workflow's attempt that sleeps ends there (TaskSleeping: the machine counts the next
    attempt and records this one as SLEPT); the next lease is a new attempt. The snapshot must
    not keep the slept attempt open forever, whether its end comes with its start or later."""

    async def body(events: MemoryLog, pool: Any) -> Any:
        await _ship(events, _event(EventKind.TaskEnqueued, "ENQUEUED", 1, 0, ts_ms=1_000))
        await _ship(events, _event(EventKind.TaskLeased, "LEASED", 1, 1, ts_ms=1_001))
        await _ship(events, _event(EventKind.TaskSleeping, "SLEEPING", 2, 2, ts_ms=1_002))
        await Projector(events, pool).catch_up()  # start and end in one chunk
        await _ship(events, _event(EventKind.TaskRequeued, "ENQUEUED", 2, 3, ts_ms=1_003))
        await _ship(events, _event(EventKind.TaskLeased, "LEASED", 2, 4, ts_ms=1_004))
        await Projector(events, pool).catch_up()
        await _ship(events, _event(EventKind.TaskSleeping, "SLEEPING", 3, 5, ts_ms=1_005))
        await Projector(events, pool).catch_up()  # the end alone: closes the open row
        rows = await pool.fetch(
            "SELECT attempt, finished_ms, outcome FROM attempts WHERE task_id = 't1' "
            "ORDER BY attempt"
        )
        return [tuple(r) for r in rows]

    attempts = _project(str(pg_server.get_uri()), body)
    assert attempts == [(1, 1_002, "SLEPT"), (2, 1_005, "SLEPT")]
