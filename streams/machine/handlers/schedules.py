"""UpsertSchedule, DeleteSchedule, PauseSchedule, and the firing of a SCHEDULE timer.

Rule 1: only the NEXT occurrence of a schedule is materialized, as one SCHEDULE timer whose
token is the schedule's generation (bumped by every upsert, pause and resume). A timer whose
generation or fire time no longer matches the row is stale and does nothing.
Rule 2: a firing enqueues one task whose id is derived from (tenant, schedule id, scheduled
time) on the schedule's own partition, with idempotency key ``<schedule id>@<scheduled ms>``.
The schedule's partition owns the task, so a second firing of the same scheduled time (a clock
that stepped back, an upsert stamped by a gateway whose clock lags) meets its twin in the same
enqueue check every client enqueue goes through, and never needs a cross-partition message.
Rule 3 (catch-up): a firing covers every occurrence from the armed one up to the record's
time. If the armed occurrence is more than ``MISFIRE_GRACE_MS`` before the record's time, the
partition was down (or far behind) and the whole window counts as missed: ``ONCE`` enqueues one
task for it, for its latest occurrence; ``NONE`` enqueues nothing for it. Within the grace the
firing is merely late and enqueues as usual. Either way the next timer is armed after "now",
so a long outage never replays its missed ticks, and a one-minute schedule that was down for
an hour fires once (``ONCE``) or not at all (``NONE``) for that hour.
Rule 4 (overlap): the row keeps the id of the task its last firing enqueued. While that task is
not terminal, ``SKIP`` drops the firing and ``CANCEL_PREVIOUS`` cancels it in the same record,
before enqueueing; ``ALLOW`` enqueues regardless.
Rule 5 (pause): a paused schedule keeps its row (history, policies, template) but has no
timer and no ``next_fire_ms``. Resume arms the first occurrence strictly after the resume
record's time; occurrences that passed while paused never fire (a pause is deliberate, not an
outage, so catch-up does not apply to it). From then on firings follow the catch-up policy as
usual. An upsert of a paused schedule replaces its definition and leaves it paused. Pausing a
paused schedule, or resuming a running one, is acknowledged and changes nothing.
Time comes from ``meta.ts_ms`` and stored fire times only; ``conveyor.streams.cron`` explains
why its arithmetic is pure.
"""

from __future__ import annotations

import dataclasses
import hashlib

from conveyor.schemas import codec
from conveyor.schemas.types import (
    TERMINAL,
    CatchUp,
    DeleteSchedule,
    OverlapPolicy,
    PauseSchedule,
    Schedule,
    ScheduleEvent,
    TaskSpec,
    TimerKind,
    TimerRef,
    UpsertSchedule,
)
from conveyor.store import keys
from conveyor.store.tables import Tables
from conveyor.streams import cron
from conveyor.streams.machine.handlers.cancel import stop_task
from conveyor.streams.machine.handlers.enqueue import NAME_BYTES_MAX, enqueue_one, invalid
from conveyor.streams.machine.outcome import Meta, Outcome, Refusal, Reply

MISFIRE_GRACE_MS = 60_000  # a timer firing later than this after its occurrence missed it
UNKNOWN_SCHEDULE = "unknown schedule"


def apply_upsert_schedule(tables: Tables, record: UpsertSchedule, meta: Meta, out: Outcome) -> None:
    problem = _invalid(record)
    if problem is not None:
        out.actions.append(
            _reply(meta, record.schedule_id, refusal=Refusal.INVALID_SCHEDULE, reason=problem)
        )
        return
    old = tables.schedule(record.tenant, record.schedule_id)
    if old is not None:
        _disarm(tables, old)
    row = Schedule(
        tenant=record.tenant,
        schedule_id=record.schedule_id,
        cron=record.cron,
        timezone=record.timezone,
        template=record.template,
        overlap=record.overlap.value,
        catch_up=record.catch_up.value,
        generation=1 if old is None else old.generation + 1,
        created_ms=meta.ts_ms if old is None else old.created_ms,
        updated_ms=meta.ts_ms,
        # The history survives an upsert: overlap still sees the task already running.
        last_fire_ms=None if old is None else old.last_fire_ms,
        last_task_id=None if old is None else old.last_task_id,
        fired=0 if old is None else old.fired,
        skipped=0 if old is None else old.skipped,
        paused=old is not None and old.paused,
    )
    if row.paused:
        tables.put_schedule(row)
    else:
        row = _arm(tables, row, meta.ts_ms)
    _report(out, row, meta)
    out.actions.append(_reply(meta, record.schedule_id, created=old is None))


def apply_delete_schedule(tables: Tables, record: DeleteSchedule, meta: Meta, out: Outcome) -> None:
    row = tables.schedule(record.tenant, record.schedule_id)
    if row is None:
        out.actions.append(
            _reply(
                meta, record.schedule_id, refusal=Refusal.UNKNOWN_SCHEDULE, reason=UNKNOWN_SCHEDULE
            )
        )
        return
    _disarm(tables, row)
    tables.delete_schedule(row.tenant, row.schedule_id)
    _report(out, row, meta, deleted=True)
    out.actions.append(_reply(meta, record.schedule_id))


def apply_pause_schedule(tables: Tables, record: PauseSchedule, meta: Meta, out: Outcome) -> None:
    """Pause (disarm, keep the row) or resume (arm the next occurrence after now): rule 5."""
    row = tables.schedule(record.tenant, record.schedule_id)
    if row is None:
        out.actions.append(
            _reply(
                meta, record.schedule_id, refusal=Refusal.UNKNOWN_SCHEDULE, reason=UNKNOWN_SCHEDULE
            )
        )
        return
    if row.paused != record.paused:
        _disarm(tables, row)
        row = dataclasses.replace(
            row,
            paused=record.paused,
            generation=row.generation + 1,
            updated_ms=meta.ts_ms,
            next_fire_ms=None,
        )
        if row.paused:
            tables.put_schedule(row)
        else:
            row = _arm(tables, row, meta.ts_ms)
        _report(out, row, meta)
    out.actions.append(_reply(meta, record.schedule_id))


def fire_schedule(tables: Tables, ref: TimerRef, meta: Meta, out: Outcome, index: int) -> None:
    """A SCHEDULE timer is due (and was removed): enqueue per the policies, arm the next."""
    named = keys.parse_schedule_ref(ref.task_id)
    row = None if named is None else tables.schedule(*named)
    if row is None or row.generation != ref.token or row.next_fire_ms != ref.fire_at_ms:
        return  # deleted or replaced since the timer was armed
    latest = cron.last_at_or_before(row.cron, row.timezone, meta.ts_ms)
    scheduled = max(ref.fire_at_ms, latest or 0)
    # The ARMED occurrence decides: a timer that fired past the grace means the partition was
    # down (or far behind) for the whole window from it up to now, the latest tick included.
    missed = meta.ts_ms - ref.fire_at_ms > MISFIRE_GRACE_MS
    if missed and row.catch_up == CatchUp.NONE:
        row = dataclasses.replace(row, skipped=row.skipped + 1)
    else:
        row = _fire(tables, row, scheduled, meta, out, index)
    _report(out, _arm(tables, row, max(meta.ts_ms, scheduled)), meta)


def _fire(
    tables: Tables, row: Schedule, scheduled: int, meta: Meta, out: Outcome, index: int
) -> Schedule:
    task_id = firing_task_id(meta.partition, row.tenant, row.schedule_id, scheduled)
    previous = None if row.last_task_id is None else tables.task(row.last_task_id)
    # The previous task IS this firing's task on a re-fire: leave it to the enqueue dedup.
    if previous is not None and previous.task_id != task_id and previous.status not in TERMINAL:
        if row.overlap == OverlapPolicy.SKIP:
            return dataclasses.replace(row, skipped=row.skipped + 1)
        if row.overlap == OverlapPolicy.CANCEL_PREVIOUS:
            reason = f"canceled by schedule {row.schedule_id!r}: its next firing started"
            stop_task(tables, previous, reason, meta, out)
    spec = dataclasses.replace(
        codec.TASK_SPEC.decode(row.template),
        task_id=task_id,
        tenant=row.tenant,
        run_at_ms=None,
        idempotency_key=f"{row.schedule_id}@{scheduled}",
    )
    reply = enqueue_one(tables, codec.TASK_SPEC.encode(spec), meta, out, index)
    if not reply.ok:
        return dataclasses.replace(row, skipped=row.skipped + 1)
    return dataclasses.replace(
        row, last_fire_ms=scheduled, last_task_id=reply.task_id, fired=row.fired + 1
    )


def firing_task_id(partition: int, tenant: str, schedule_id: str, scheduled_ms: int) -> str:
    """The task id of one firing: on the schedule's partition, the same for every re-fire."""
    seed = f"{tenant}\x00{schedule_id}\x00{scheduled_ms}".encode()
    return f"{partition:04x}{hashlib.blake2b(seed, digest_size=14).hexdigest()}"


def schedule_timer(row: Schedule) -> TimerRef | None:
    if row.next_fire_ms is None:
        return None
    return TimerRef(
        fire_at_ms=row.next_fire_ms,
        task_id=keys.schedule_ref(row.tenant, row.schedule_id),
        kind=TimerKind.SCHEDULE,
        token=row.generation,
    )


def _arm(tables: Tables, row: Schedule, after_ms: int) -> Schedule:
    row = dataclasses.replace(row, next_fire_ms=cron.next_after(row.cron, row.timezone, after_ms))
    ref = schedule_timer(row)
    if ref is not None:
        tables.add_timer(ref)
    tables.put_schedule(row)
    return row


def _report(out: Outcome, row: Schedule, meta: Meta, *, deleted: bool = False) -> None:
    """The row as it now stands, for the projection's ``schedules`` table."""
    spec = codec.TASK_SPEC.decode(row.template)
    out.schedules.append(
        ScheduleEvent(
            tenant=row.tenant,
            schedule_id=row.schedule_id,
            cron=row.cron,
            timezone=row.timezone,
            app=spec.app,
            task_type=spec.task_type,
            queue=spec.queue,
            overlap=row.overlap,
            catch_up=row.catch_up,
            paused=row.paused,
            deleted=deleted,
            next_fire_ms=None if deleted else row.next_fire_ms,
            last_fire_ms=row.last_fire_ms,
            last_task_id=row.last_task_id,
            fired=row.fired,
            skipped=row.skipped,
            created_ms=row.created_ms,
            updated_ms=meta.ts_ms if deleted else row.updated_ms,
            version=meta.offset,
        )
    )


def _disarm(tables: Tables, row: Schedule) -> None:
    ref = schedule_timer(row)
    if ref is not None:
        tables.remove_timer(ref)


def _invalid(record: UpsertSchedule) -> str | None:
    """Why the record cannot be stored. The gateway checks all of it first; other appenders
    may not, and a valid record must never raise in the machine."""
    for name in ("tenant", "schedule_id"):
        value = getattr(record, name)
        if not value or len(value.encode()) > NAME_BYTES_MAX or "\x00" in value:
            return f"{name} must be 1..{NAME_BYTES_MAX} bytes without NUL"
    problem = cron.problem(record.cron, record.timezone)
    if problem is not None:
        return problem
    try:
        template: TaskSpec = codec.TASK_SPEC.decode(record.template)
    except Exception:  # fastavro raises many types on hostile bytes
        return "template is not a TaskSpec"
    return invalid(dataclasses.replace(template, task_id="x" * 32, tenant=record.tenant))


def _reply(
    meta: Meta,
    schedule_id: str,
    *,
    created: bool = False,
    refusal: Refusal | None = None,
    reason: str | None = None,
) -> Reply:
    """Ok unless ``refusal`` says why not."""
    # Reply.task_id carries the schedule id: one reply shape for every client record.
    return Reply(
        offset=meta.offset,
        index=0,
        ok=refusal is None,
        task_id=schedule_id[:NAME_BYTES_MAX],
        created=created,
        reason=reason,
        refusal=refusal,
    )
