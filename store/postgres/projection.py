"""The writes of the projector: fold events into rows, then one statement per table.

Rules, and why:

1. Rows only move forward. Every upsert is guarded by ``tasks.version < EXCLUDED.version``
   (the record-log offset of the newest event folded into the row), so replaying events that
   are already projected -- after a crash between the upsert and the watermark, or a second
   delivery by the outbox -- changes nothing.
2. Never a round trip per event. A chunk of events is folded per task in memory first (one
   row per task), then written with one ``INSERT ... SELECT FROM unnest($1, $2, ...)`` (one
   array per column) per table.
3. The watermark advances in the same transaction as the rows it covers.
4. The fold mirrors the state machine's rules for the columns that events do not carry in
   full: ``created_ms`` is the time of TaskEnqueued, ``finished_ms`` of the terminal event,
   and the error columns change only on events that set the task's error (ERROR_KINDS).
   ``ready_ms`` is when the task became ready, or, for one enqueued with a delay, when it
   will be (the TaskEnqueued's ``run_at_ms``; its TaskRequeued when due sets it again).
5. Step and schedule events carry their whole row, so their fold keeps the newest event per
   row (per step identity of a task, per schedule of a tenant) and the upsert replaces the row
   under the same version guard. A deleted schedule stays as a tombstone for that guard.
   A step's ``started_ms`` is the time of the first event of its row (its claim, made before
   its body runs): the fold keeps the earliest per row, since a claim and its commit often
   fall in one chunk, and the upsert sets it once, when it inserts the row.
6. Text goes in as PostgreSQL text, which cannot hold U+0000: a handler's exception text can
   (a C library's message, bytes decoded as text), and one such event would fail every retry
   of its chunk and halt the projection. In the snapshot it reads U+FFFD; the node keeps the
   original (``GET /v1/tasks/{id}``).
7. ``payload_fields`` (the payload's searchable fields, a JSON object the gateway made at
   enqueue) come with the TaskEnqueued only and are kept once set. jsonb cannot hold
   U+0000 either: the gateway leaves such a value out, and a TaskEnqueued that carries
   one anyway projects no fields rather than halting the projection (rule 6).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import asyncpg

from conveyor.schemas.types import (
    COMPENSATING_CLASS,
    RELEASED_CLASS,
    TERMINAL,
    EventKind,
    ScheduleEvent,
    StepEvent,
    TaskEvent,
    TaskStatus,
)
from conveyor.store.postgres.history import HistoryFold

# Events after which the task row holds the event's error (lifecycle.finish/attempt_failed).
ERROR_KINDS = frozenset(
    {
        EventKind.TaskRetryScheduled,
        EventKind.TaskFailed,
        EventKind.TaskCanceled,
        EventKind.TaskExpired,
    }
)
READY_KINDS = frozenset({EventKind.TaskEnqueued, EventKind.TaskRequeued})
# Events that end the attempt under way, and the outcome they give it (the machine's
# record_attempt outcome where it writes one).
ATTEMPT_ENDS = {
    EventKind.TaskSucceeded: "SUCCEEDED",
    EventKind.TaskRetryScheduled: "FAILED",
    EventKind.TaskFailed: "FAILED",
    EventKind.TaskCanceled: "CANCELED",
    EventKind.TaskExpired: "EXPIRED",
    EventKind.TaskSleeping: "SLEPT",
    # A fan-out (the machine's FANNED_OUT) or a wait for an event (WAITED): the event does not
    # say which, the task's steps do.
    EventKind.TaskWaiting: "PARKED",
}
# Ends emitted after the machine counted the next attempt: they end the previous one.
ENDS_AFTER_COUNTING = frozenset(
    {EventKind.TaskRetryScheduled, EventKind.TaskSleeping, EventKind.TaskWaiting}
)


@dataclass(slots=True)
class TaskRow:
    """One task's columns after the events of a chunk. ``None`` means "keep the stored
    value" for the columns the chunk's events did not determine."""

    task_id: str
    tenant: str
    app: str
    task_type: str
    queue: str
    partition: int
    status: str
    attempt: int
    updated_ms: int
    version: int
    last_event: str
    created_ms: int | None = None
    finished_ms: int | None = None
    ready_ms: int | None = None
    leased_ms: int | None = None
    agent_id: str | None = None
    error_class: str | None = None  # set (non-null) only when an ERROR_KINDS event set it
    error_message: str | None = None
    payload_fields: str | None = None  # JSON text; only a TaskEnqueued sets it


@dataclass(slots=True)
class AttemptRow:
    task_id: str
    attempt: int
    agent_id: str | None = None
    started_ms: int | None = None  # None: this chunk only saw the attempt end
    finished_ms: int | None = None
    outcome: str | None = None
    error_class: str | None = None
    error_message: str | None = None


@dataclass(slots=True)
class Fold:
    """Rows of one chunk: the newest state per task, every attempt touched, and the newest
    event per step and per schedule (rule 5)."""

    tasks: dict[str, TaskRow]
    attempts: dict[tuple[str, int], AttemptRow]
    steps: dict[tuple[str, str], StepEvent]
    schedules: dict[tuple[str, str], ScheduleEvent]
    # Attempts handed back before they started: an open row of theirs is deleted (before
    # this chunk's starts are written: the same attempt number may be leased again).
    released: set[tuple[str, int]]
    step_started: dict[tuple[str, str], int] = field(default_factory=dict)  # rule 5

    @classmethod
    def empty(cls) -> Fold:
        return cls({}, {}, {}, {}, set())

    def add_step(self, event: StepEvent) -> None:
        key = (event.task_id, event.identity)
        started = self.step_started.get(key)
        self.step_started[key] = event.ts_ms if started is None else min(started, event.ts_ms)
        held = self.steps.get(key)
        # Equal versions: two writes of one record (a claim, then its commit); the later wins.
        if held is None or held.version <= event.version:
            self.steps[key] = event

    def add_schedule(self, event: ScheduleEvent) -> None:
        key = (event.tenant, event.schedule_id)
        held = self.schedules.get(key)
        if held is None or held.version <= event.version:
            self.schedules[key] = event

    def add(self, partition: int, event: TaskEvent) -> None:
        row = self.tasks.get(event.task_id)
        if row is None:
            row = self.tasks[event.task_id] = _row_of(partition, event)
        elif event.version < row.version:
            return  # a replayed older event inside one chunk: rule 1 in memory
        _apply(row, event)
        self._attempt(event)

    def _attempt(self, event: TaskEvent) -> None:
        if event.kind == EventKind.TaskRequeued and event.error_class == RELEASED_CLASS:
            key = (event.task_id, event.attempt)
            self.attempts.pop(key, None)
            self.released.add(key)
            return
        if event.kind == EventKind.TaskLeased:
            key = (event.task_id, event.attempt)
            row = self.attempts.setdefault(key, AttemptRow(event.task_id, event.attempt))
            row.agent_id, row.started_ms = _text(event.agent_id), event.ts_ms
            return
        outcome = ATTEMPT_ENDS.get(event.kind)
        compensating = event.kind == EventKind.TaskRequeued and (
            event.error_class == COMPENSATING_CLASS
        )
        if compensating:
            outcome = "CANCELED"
        if outcome is None:
            return
        # A retry, a sleep, a wait or a cancel into compensations has already counted the next
        # attempt; the one that ended is the previous (an end of one that had ended: no-op).
        after = compensating or event.kind in ENDS_AFTER_COUNTING
        number = event.attempt - 1 if after else event.attempt
        row = self.attempts.setdefault((event.task_id, number), AttemptRow(event.task_id, number))
        if row.finished_ms is None:
            row.finished_ms, row.outcome = event.ts_ms, outcome
            row.error_class = _text(event.error_class)
            row.error_message = _text(event.error_message)


def _text(value: str | None) -> str | None:
    """Rule 6: U+0000 -> U+FFFD (a scan for it costs little next to the upsert)."""
    return value.replace("\x00", "\ufffd") if value is not None and "\x00" in value else value


def _fields(text: str | None) -> str | None:
    """Rule 7: searchable fields jsonb can hold, or none."""
    return None if text is None or "\\u0000" in text or "\x00" in text else text


def _row_of(partition: int, event: TaskEvent) -> TaskRow:
    return TaskRow(
        task_id=event.task_id,
        tenant=_text(event.tenant) or "",
        app=_text(event.app) or "",
        task_type=_text(event.task_type) or "",
        queue=_text(event.queue) or "",
        partition=partition,
        status=event.status,
        attempt=event.attempt,
        updated_ms=event.ts_ms,
        version=event.version,
        last_event=event.kind.value,
    )


def _apply(row: TaskRow, event: TaskEvent) -> None:
    row.status, row.attempt = event.status, event.attempt
    row.updated_ms, row.version, row.last_event = event.ts_ms, event.version, event.kind.value
    row.agent_id = _text(event.agent_id)
    kind = event.kind
    if kind == EventKind.TaskEnqueued:
        row.created_ms = event.ts_ms
        row.payload_fields = _fields(event.payload_fields)
    if kind in READY_KINDS and event.status == TaskStatus.ENQUEUED:
        row.ready_ms = event.ts_ms if event.run_at_ms is None else event.run_at_ms
    if kind == EventKind.TaskLeased:
        row.leased_ms = event.ts_ms
    if event.status in TERMINAL and row.finished_ms is None:
        row.finished_ms = event.ts_ms
    if kind in ERROR_KINDS and event.error_class is not None:
        row.error_class, row.error_message = _text(event.error_class), _text(event.error_message)


_TASK_COLUMNS = (
    ("task_id", "text"),
    ("tenant", "text"),
    ("app", "text"),
    ("task_type", "text"),
    ("queue", "text"),
    ("partition", "int4"),
    ("status", "text"),
    ("attempt", "int4"),
    ("created_ms", "int8"),
    ("updated_ms", "int8"),
    ("finished_ms", "int8"),
    ("ready_ms", "int8"),
    ("leased_ms", "int8"),
    ("agent_id", "text"),
    ("error_class", "text"),
    ("error_message", "text"),
    ("last_event", "text"),
    ("version", "int8"),
    ("payload_fields", "jsonb"),
)
_NAMES = ", ".join(name for name, _ in _TASK_COLUMNS)
_UNNEST = ", ".join(f"${i}::{kind}[]" for i, (_, kind) in enumerate(_TASK_COLUMNS, 1))
# created_ms is NOT NULL: a row first seen without its TaskEnqueued (its events log prefix was
# trimmed) takes the time we first saw it. Once stored it never changes: TaskEnqueued is a
# task's first event, so a later chunk has nothing to correct it with; and records carry the
# leader's wall clock, which may step back, so its other stamps (EXCLUDED.created_ms is
# COALESCEd to updated_ms) must not pull it earlier.
UPSERT_TASKS = f"""
INSERT INTO tasks AS t ({_NAMES})
SELECT task_id, tenant, app, task_type, queue, partition, status, attempt,
       COALESCE(created_ms, updated_ms), updated_ms, finished_ms, ready_ms, leased_ms, agent_id,
       error_class, error_message, last_event, version, payload_fields
FROM unnest({_UNNEST}) AS u({_NAMES})
ON CONFLICT (task_id) DO UPDATE SET
    status = EXCLUDED.status,
    attempt = EXCLUDED.attempt,
    updated_ms = EXCLUDED.updated_ms,
    finished_ms = COALESCE(t.finished_ms, EXCLUDED.finished_ms),
    ready_ms = COALESCE(EXCLUDED.ready_ms, t.ready_ms),
    leased_ms = COALESCE(EXCLUDED.leased_ms, t.leased_ms),
    agent_id = EXCLUDED.agent_id,
    error_class = COALESCE(EXCLUDED.error_class, t.error_class),
    error_message = CASE WHEN EXCLUDED.error_class IS NULL THEN t.error_message
                         ELSE EXCLUDED.error_message END,
    last_event = EXCLUDED.last_event,
    version = EXCLUDED.version,
    payload_fields = COALESCE(EXCLUDED.payload_fields, t.payload_fields)
WHERE t.version < EXCLUDED.version
"""

# Attempts: a start inserts the row (with its end when the chunk saw both); an end alone
# closes an open row and never reopens a closed one. An end with no started row is an attempt
# that never ran (canceled while waiting): nothing to record.
_ATTEMPT_UNNEST = """unnest($1::text[], $2::int4[], $3::text[], $4::int8[], $5::int8[],
            $6::text[], $7::text[], $8::text[])
     AS u(task_id, attempt, agent_id, started_ms, finished_ms, outcome, error_class,
          error_message)"""
START_ATTEMPTS = f"""
INSERT INTO attempts AS a (task_id, attempt, agent_id, started_ms, finished_ms, outcome,
                           error_class, error_message)
SELECT * FROM {_ATTEMPT_UNNEST}
ON CONFLICT (task_id, attempt) DO UPDATE SET
    agent_id = EXCLUDED.agent_id,
    started_ms = EXCLUDED.started_ms,
    finished_ms = COALESCE(a.finished_ms, EXCLUDED.finished_ms),
    outcome = COALESCE(a.outcome, EXCLUDED.outcome),
    error_class = CASE WHEN a.finished_ms IS NULL THEN EXCLUDED.error_class ELSE a.error_class END,
    error_message = CASE WHEN a.finished_ms IS NULL THEN EXCLUDED.error_message
                         ELSE a.error_message END
"""
DELETE_RELEASED = """
DELETE FROM attempts AS a USING unnest($1::text[], $2::int4[]) AS u(task_id, attempt)
WHERE a.task_id = u.task_id AND a.attempt = u.attempt AND a.finished_ms IS NULL
"""
END_ATTEMPTS = f"""
UPDATE attempts AS a SET finished_ms = u.finished_ms, outcome = u.outcome,
    error_class = u.error_class, error_message = u.error_message
FROM {_ATTEMPT_UNNEST}
WHERE a.task_id = u.task_id AND a.attempt = u.attempt AND a.finished_ms IS NULL
"""

_STEP_COLUMNS = (
    ("task_id", "text"),
    ("identity", "text"),
    ("tenant", "text"),
    ("position", "int4"),
    ("state", "text"),
    ("claims", "int4"),
    ("value", "bytea"),
    ("wake_at_ms", "int8"),
    ("ts_ms", "int8"),
    ("version", "int8"),
)
_STEP_UNNEST = ", ".join(f"${i}::{kind}[]" for i, (_, kind) in enumerate(_STEP_COLUMNS, 1))
UPSERT_STEPS = f"""
INSERT INTO steps AS s (task_id, identity, tenant, position, state, claims, value, wake_at_ms,
                        updated_ms, version, started_ms)
SELECT * FROM unnest({_STEP_UNNEST}, ${len(_STEP_COLUMNS) + 1}::int8[])
ON CONFLICT (task_id, identity) DO UPDATE SET
    started_ms = COALESCE(s.started_ms, EXCLUDED.started_ms),
    position = EXCLUDED.position,
    state = EXCLUDED.state,
    claims = EXCLUDED.claims,
    value = EXCLUDED.value,
    wake_at_ms = EXCLUDED.wake_at_ms,
    updated_ms = EXCLUDED.updated_ms,
    version = EXCLUDED.version
WHERE s.version < EXCLUDED.version
"""

_SCHEDULE_COLUMNS = (
    ("tenant", "text"),
    ("schedule_id", "text"),
    ("cron", "text"),
    ("timezone", "text"),
    ("app", "text"),
    ("task_type", "text"),
    ("queue", "text"),
    ("overlap", "text"),
    ("catch_up", "text"),
    ("paused", "bool"),
    ("deleted", "bool"),
    ("next_fire_ms", "int8"),
    ("last_fire_ms", "int8"),
    ("last_task_id", "text"),
    ("fired", "int8"),
    ("skipped", "int8"),
    ("created_ms", "int8"),
    ("updated_ms", "int8"),
    ("version", "int8"),
)
_SCHEDULE_NAMES = ", ".join(name for name, _ in _SCHEDULE_COLUMNS)
_SCHEDULE_UNNEST = ", ".join(f"${i}::{kind}[]" for i, (_, kind) in enumerate(_SCHEDULE_COLUMNS, 1))
_SCHEDULE_SET = ",\n    ".join(f"{name} = EXCLUDED.{name}" for name, _ in _SCHEDULE_COLUMNS[2:])
UPSERT_SCHEDULES = f"""
INSERT INTO schedules AS s ({_SCHEDULE_NAMES})
SELECT * FROM unnest({_SCHEDULE_UNNEST})
ON CONFLICT (tenant, schedule_id) DO UPDATE SET
    {_SCHEDULE_SET}
WHERE s.version < EXCLUDED.version
"""

SAVE_WATERMARKS = """
INSERT INTO watermarks (partition, next_offset)
SELECT * FROM unnest($1::int4[], $2::int8[])
ON CONFLICT (partition) DO UPDATE SET next_offset = GREATEST(watermarks.next_offset,
                                                             EXCLUDED.next_offset)
"""


_ATTEMPT_NAMES = [
    "task_id",
    "attempt",
    "agent_id",
    "started_ms",
    "finished_ms",
    "outcome",
    "error_class",
    "error_message",
]


def _columns(rows: Iterable[object], names: list[str]) -> list[list[object]]:
    """Column arrays for ``unnest``: one parameter per column, any number of rows."""
    items = list(rows)
    return [[getattr(row, name) for row in items] for name in names]


async def write(
    conn: asyncpg.Connection,
    fold: Fold,
    marks: Mapping[int, int],
    history: HistoryFold | None = None,
) -> None:
    """Rows of ``fold`` and the watermarks that cover them, in one transaction (rule 3), with
    the queue history of the chunk's events (history.py; it reads task rows as they stood
    before the chunk, so it goes first)."""
    async with conn.transaction():
        if history is not None:
            await history.write(conn)
        if fold.tasks:
            names = [name for name, _ in _TASK_COLUMNS]
            await conn.execute(UPSERT_TASKS, *_columns(fold.tasks.values(), names))
        if fold.released:
            task_ids, numbers = zip(*fold.released, strict=True)
            await conn.execute(DELETE_RELEASED, list(task_ids), list(numbers))
        starts = [a for a in fold.attempts.values() if a.started_ms is not None]
        ends = [a for a in fold.attempts.values() if a.started_ms is None]
        for sql, rows in ((START_ATTEMPTS, starts), (END_ATTEMPTS, ends)):
            if rows:
                await conn.execute(sql, *_columns(rows, _ATTEMPT_NAMES))
        if fold.steps:
            names = [name for name, _ in _STEP_COLUMNS]
            started = [fold.step_started.get(k, e.ts_ms) for k, e in fold.steps.items()]
            await conn.execute(UPSERT_STEPS, *_columns(fold.steps.values(), names), started)
        if fold.schedules:
            names = [name for name, _ in _SCHEDULE_COLUMNS]
            await conn.execute(UPSERT_SCHEDULES, *_columns(fold.schedules.values(), names))
        if marks:
            await conn.execute(SAVE_WATERMARKS, list(marks), list(marks.values()))


async def watermarks(conn: asyncpg.Connection) -> dict[int, int]:
    """Per events partition, the next offset to read (absent: from the start)."""
    rows = await conn.fetch("SELECT partition, next_offset FROM watermarks")
    return {int(r["partition"]): int(r["next_offset"]) for r in rows}


async def truncate(conn: asyncpg.Connection) -> None:
    """Forget everything projected: the next projector run rebuilds from offset 0."""
    await conn.execute(
        "TRUNCATE tasks, attempts, steps, schedules, watermarks, queue_history, history_marks"
    )
