"""The queue history and the queue list's delayed tasks, against a real PostgreSQL fed synthetic
events through an in-memory events log (as test_projection_columns.py): what the projector
folds must read back as the events say, counted once however often they are read or shipped.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_projection import _fresh_pool, pg_server  # noqa: F401  (the fixture, by name)

from conveyor.schemas.codec import EVENT_BATCH
from conveyor.schemas.types import EventBatch, EventKind, TaskEvent
from conveyor.store.postgres import history, queries
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.sinks.projector import Projector

pytestmark = pytest.mark.timeout(120)

MINUTE = 60_000


def _event(
    task_id: str, kind: EventKind, status: str, version: int, ts_ms: int, **extra: Any
) -> TaskEvent:
    return TaskEvent(
        kind=kind,
        task_id=task_id,
        tenant="alpha",
        app="shop",
        task_type=extra.pop("task_type", "email"),
        queue="q",
        status=status,
        attempt=1,
        ts_ms=ts_ms,
        version=version,
        **extra,
    )


async def _ship(events: MemoryLog, *batch: TaskEvent) -> None:
    record = EventBatch(partition=0, offset=batch[-1].version, events=list(batch))
    await events.append(0, [EVENT_BATCH.encode(record)])


def _run(body: Any) -> Any:
    async def main(dsn: str) -> Any:
        async with _fresh_pool(dsn) as pool:
            return await body(MemoryLog(1), pool)

    return main


def _lifecycle(task_id: str, first: int, at_ms: int, wait_ms: int, run_ms: int) -> list[TaskEvent]:
    """Enqueued at ``at_ms``, leased ``wait_ms`` later, done ``run_ms`` after that."""
    return [
        _event(task_id, EventKind.TaskEnqueued, "ENQUEUED", first, at_ms),
        _event(task_id, EventKind.TaskLeased, "LEASED", first + 1, at_ms + wait_ms, agent_id="a"),
        _event(task_id, EventKind.TaskSucceeded, "SUCCEEDED", first + 2, at_ms + wait_ms + run_ms),
    ]


def test_oldest_ready_counts_only_due_tasks_and_delayed_ones_say_when(
    pg_server: Any,  # noqa: F811
) -> None:
    """A task enqueued ten minutes ago with a delay of an hour and a half is not a queue stuck
    for ten minutes: it is delayed, due in 80 minutes; the oldest ready task is the one due."""
    now = int(time.time() * 1000)

    async def body(events: MemoryLog, pool: Any) -> Any:
        await _ship(
            events,
            _event("late", EventKind.TaskEnqueued, "ENQUEUED", 0, now - 10 * MINUTE,
                   run_at_ms=now + 80 * MINUTE),
            _event("due", EventKind.TaskEnqueued, "ENQUEUED", 1, now - 2 * MINUTE),
        )  # fmt: skip
        await Projector(events, pool).catch_up()
        (before,) = await queries.queues(pool, "alpha", now)
        # Its run timer fires: a TaskRequeued makes it ready, and it is no longer delayed.
        await _ship(
            events, _event("late", EventKind.TaskRequeued, "ENQUEUED", 2, now + 80 * MINUTE)
        )
        await Projector(events, pool).catch_up()
        (after,) = await queries.queues(pool, "alpha", now + 81 * MINUTE)
        return before, after

    before, after = asyncio.run(_run(body)(str(pg_server.get_uri())))
    assert before["depth"] == {"ENQUEUED": 2}
    assert before["oldest_ready_age_ms"] == 2 * MINUTE
    assert (before["delayed"], before["next_due_in_ms"]) == (1, 80 * MINUTE)
    assert after["oldest_ready_age_ms"] == 83 * MINUTE  # "due": enqueued 2 min before now
    assert (after["delayed"], after["next_due_in_ms"]) == (0, None)


def test_history_counts_each_event_once_across_replays_and_duplicate_shipments(
    pg_server: Any,  # noqa: F811
) -> None:
    """Twenty tasks waiting 1 s and running 250 ms, and two that fail after a retry. The batch
    is shipped twice (an outbox crash between append and delete) and the whole log is projected
    again from its start (watermarks lost): the counts and percentiles stay those of one pass.
    """
    now = int(time.time() * 1000)
    at = now - now % MINUTE - 5 * MINUTE  # five minutes ago, at the start of a minute

    async def body(events: MemoryLog, pool: Any) -> Any:
        ok: list[TaskEvent] = []
        for i in range(20):
            ok += _lifecycle(f"ok{i}", 10 * i, at + i, wait_ms=1_000, run_ms=250)
        await _ship(events, *ok)
        await _ship(events, *ok)  # the same batch again
        bad = 1_000
        for i in range(2):
            task = f"bad{i}"
            v = bad + 10 * i
            await _ship(
                events,
                _event(task, EventKind.TaskEnqueued, "ENQUEUED", v, at),
                _event(task, EventKind.TaskLeased, "LEASED", v + 1, at + 10, agent_id="a"),
                _event(task, EventKind.TaskRetryScheduled, "RETRY_WAIT", v + 2, at + 20),
                _event(task, EventKind.TaskRequeued, "ENQUEUED", v + 3, at + 30),
                _event(task, EventKind.TaskLeased, "LEASED", v + 4, at + 40, agent_id="a"),
                _event(task, EventKind.TaskFailed, "FAILED", v + 5, at + 60, error_class="E"),
            )
        await Projector(events, pool).catch_up()
        first = await history.read(pool, history.HistoryQuery(tenant="alpha", window="1h"), now)
        await pool.execute("DELETE FROM watermarks")
        await Projector(events, pool).catch_up()  # every event read again
        again = await history.read(pool, history.HistoryQuery(tenant="alpha", window="1h"), now)
        return first, again

    first, again = asyncio.run(_run(body)(str(pg_server.get_uri())))
    assert first == again
    (point,) = [p for p in first["points"] if p["at_ms"] == at]
    assert point["enqueued"] == 22 and point["started"] == 24
    assert (point["succeeded"], point["failed"], point["retried"]) == (20, 2, 2)
    assert point["error_rate"] == round(2 / 22, 4)
    assert 1_000 / 1.19 <= point["wait_p50_ms"] <= 1_000 * 1.19
    assert 250 / 1.19 <= point["run_p50_ms"] <= 250 * 1.19
    # the two failed attempts' 10 and 20 ms are the fastest runs; none waits more than 1 s
    assert point["wait_p99_ms"] <= 1_000 * 1.19
    assert first["task_types"] == ["email"] and first["depth"] == 0
    assert sum(p["finished"] for p in first["points"]) == 22
    assert [p["depth"] for p in first["points"]] == [0] * 60


def test_a_duration_spanning_a_projector_restart_is_read_from_the_task_row(
    pg_server: Any,  # noqa: F811
) -> None:
    """The projector remembers lease times between chunks; one started anew has forgotten
    them and takes the lease time from the task row, as it stood before the chunk."""
    now = int(time.time() * 1000)
    at = now - now % MINUTE - 2 * MINUTE

    async def body(events: MemoryLog, pool: Any) -> Any:
        await _ship(events, _event("t", EventKind.TaskEnqueued, "ENQUEUED", 0, at))
        await Projector(events, pool).catch_up()
        await _ship(
            events, _event("t", EventKind.TaskLeased, "LEASED", 1, at + 3_000, agent_id="a")
        )
        await Projector(events, pool).catch_up()
        await _ship(events, _event("t", EventKind.TaskSucceeded, "SUCCEEDED", 2, at + 4_000))
        await _ship(events, _event("u", EventKind.TaskEnqueued, "ENQUEUED", 3, at + 4_000))
        await Projector(events, pool).catch_up()
        return await history.read(pool, history.HistoryQuery(tenant="alpha", window="1h"), now)

    read = asyncio.run(_run(body)(str(pg_server.get_uri())))
    (point,) = [p for p in read["points"] if p["at_ms"] == at]
    assert 3_000 / 1.19 <= point["wait_p50_ms"] <= 3_000 * 1.19
    assert 1_000 / 1.19 <= point["run_p50_ms"] <= 1_000 * 1.19
    # "u" is still waiting: one unfinished task from its minute on, none before
    depths = {p["at_ms"]: p["depth"] for p in read["points"]}
    assert depths[at] == 1 and depths[at - MINUTE] == 0 and read["depth"] == 1


def test_the_history_filters_by_queue_and_task_type_and_the_day_has_15_minute_steps(
    pg_server: Any,  # noqa: F811
) -> None:
    now = int(time.time() * 1000)
    at = now - 3 * 3_600_000  # three hours ago: in the day, not in the hour

    async def body(events: MemoryLog, pool: Any) -> Any:
        await _ship(
            events,
            _event("a", EventKind.TaskEnqueued, "ENQUEUED", 0, at, task_type="resize"),
            _event("b", EventKind.TaskEnqueued, "ENQUEUED", 1, at, task_type="email"),
            _event("c", EventKind.TaskEnqueued, "ENQUEUED", 2, now, task_type="email"),
        )
        await Projector(events, pool).catch_up()
        q = history.HistoryQuery
        day = await history.read(pool, q(tenant="alpha", window="24h", task_type="resize"), now)
        hour = await history.read(pool, q(tenant="alpha", window="1h", queue="q"), now)
        other = await history.read(pool, q(tenant="beta", window="24h"), now)
        return day, hour, other

    day, hour, other = asyncio.run(_run(body)(str(pg_server.get_uri())))
    assert day["step_ms"] == 900_000 and len(day["points"]) == 96
    assert sum(p["enqueued"] for p in day["points"]) == 1 and day["depth"] == 1
    assert hour["step_ms"] == MINUTE and len(hour["points"]) == 60
    assert sum(p["enqueued"] for p in hour["points"]) == 1
    assert hour["points"][-1]["enqueued"] == 1  # the step holding now is the last
    assert hour["task_types"] == ["email"]
    assert sum(p["enqueued"] for p in other["points"]) == 0 and other["depth"] == 0
