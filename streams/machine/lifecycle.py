"""Shared moves of the lifecycle: make ready, end an attempt, finish, arm and disarm timers.

Every helper edits the task in place, puts it, and records the events and actions it causes.
"""

from __future__ import annotations

import hashlib

from conveyor.errors import InvariantError
from conveyor.schemas.types import (
    COMPENSATING_CLASS,
    Attempt,
    CancelCause,
    EventKind,
    Task,
    TaskEvent,
    TaskSpec,
    TaskStatus,
    TimerKind,
    TimerRef,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.outcome import LeaseEnded, Meta, Outcome, TaskFinished
from conveyor.streams.machine.transitions import move

# Not leased, not finished: on a ready queue, waiting for a RUN timer, or (a workflow in
# WAITING) for its children; none of them holds a lease.
WAITING = (TaskStatus.ENQUEUED, TaskStatus.RETRY_WAIT, TaskStatus.SLEEPING, TaskStatus.WAITING)
SEQ_SLOTS = 1 << 24  # items per record that can become ready: seq = (offset + 1) * SLOTS + i
# Ready indexes at and above SPARE_BASE are dealt by ``spare_index``, to tasks that become
# ready as a side effect of an item (fan-out children, a woken workflow); record items use
# their own index, below it.
SPARE_BASE = 1 << 23


def ready_seq(meta: Meta, index: int) -> int:
    if not 0 <= index < SEQ_SLOTS:
        raise InvariantError(f"record item index {index} out of range [0, {SEQ_SLOTS})")
    return (meta.offset + 1) * SEQ_SLOTS + index


def spare_index(out: Outcome) -> int:
    """A ready index no item of this record uses (see ``SPARE_BASE``)."""
    index = SPARE_BASE + out.spare_ready
    out.spare_ready += 1
    return index


def emit(
    out: Outcome,
    kind: EventKind,
    task: Task,
    meta: Meta,
    *,
    error_class: str | None = None,
    error_message: str | None = None,
    run_at_ms: int | None = None,
    payload_fields: str | None = None,
) -> None:
    out.events.append(
        TaskEvent(
            kind=kind,
            task_id=task.task_id,
            tenant=task.tenant,
            app=task.app,
            task_type=task.task_type,
            queue=task.queue,
            status=task.status.value,
            attempt=task.attempt,
            ts_ms=meta.ts_ms,
            version=meta.offset,
            agent_id=task.agent_id,
            error_class=error_class,
            error_message=error_message,
            run_at_ms=run_at_ms,
            payload_fields=payload_fields,
        )
    )


def holder(tables: Tables, task_id: str, lease_id: int) -> Task | str:
    """The task if ``lease_id`` is its live lease, else why not (the fence of every agent
    record: completions, checkpoints, step claims and commits)."""
    task = tables.task(task_id)
    if task is None:
        return "unknown task"
    if task.status != TaskStatus.LEASED:
        return f"task is {task.status.value}"
    if task.lease_id != lease_id:
        return f"stale lease {lease_id}; current lease is {task.lease_id}"
    return task


def touch(task: Task, meta: Meta) -> None:
    task.updated_ms = meta.ts_ms
    task.version = meta.offset


def make_ready(tables: Tables, task: Task, meta: Meta, index: int) -> None:
    task.ready_seq = ready_seq(meta, index)
    tables.add_ready(task)


def run_timer(task: Task) -> TimerRef:
    return TimerRef(
        fire_at_ms=task.run_at_ms, task_id=task.task_id, kind=TimerKind.RUN, token=task.attempt
    )


def start_to_close_timer(task: Task) -> TimerRef | None:
    if task.start_to_close_ms is None or task.leased_ms is None:
        return None
    return TimerRef(
        fire_at_ms=task.leased_ms + task.start_to_close_ms,
        task_id=task.task_id,
        kind=TimerKind.START_TO_CLOSE,
        token=task.lease_id,
    )


def grace_timer(task: Task) -> TimerRef | None:
    if task.grace_until_ms is None:
        return None
    return TimerRef(
        fire_at_ms=task.grace_until_ms,
        task_id=task.task_id,
        kind=TimerKind.CANCEL_GRACE,
        token=task.lease_id,
    )


def deadline_timers(task: Task) -> list[TimerRef]:
    refs = []
    if task.start_by_ms is not None:
        refs.append(
            TimerRef(
                fire_at_ms=task.start_by_ms,
                task_id=task.task_id,
                kind=TimerKind.SCHEDULE_TO_START,
                token=0,
            )
        )
    if task.close_by_ms is not None:
        refs.append(
            TimerRef(
                fire_at_ms=task.close_by_ms,
                task_id=task.task_id,
                kind=TimerKind.SCHEDULE_TO_CLOSE,
                token=0,
            )
        )
    return refs


def leave_waiting(tables: Tables, task: Task) -> None:
    """Take a waiting task (ENQUEUED, RETRY_WAIT, SLEEPING) off its ready queue or RUN timer."""
    if task.ready_seq:
        tables.remove_ready(task)
        task.ready_seq = 0
    else:
        tables.remove_timer(run_timer(task))


def end_lease(tables: Tables, task: Task, out: Outcome) -> None:
    """Release everything a LEASED task holds for its current lease."""
    tables.clear_leased(task.task_id)
    for ref in (start_to_close_timer(task), grace_timer(task)):
        if ref is not None:
            tables.remove_timer(ref)
    task.grace_until_ms = None
    task.cancel_cause = None
    out.actions.append(LeaseEnded(task_id=task.task_id, lease_id=task.lease_id))


def record_attempt(
    tables: Tables,
    task: Task,
    meta: Meta,
    outcome: str,
    error_class: str | None = None,
    error_message: str | None = None,
    error_stack: str | None = None,
) -> None:
    tables.put_attempt(
        Attempt(
            task_id=task.task_id,
            attempt=task.attempt,
            lease_id=task.lease_id,
            agent_id=task.agent_id or "",
            started_ms=task.leased_ms or meta.ts_ms,
            finished_ms=meta.ts_ms,
            outcome=outcome,
            error_class=error_class,
            error_message=error_message,
            error_stack=error_stack,
        )
    )


def finish(
    tables: Tables,
    task: Task,
    to: TaskStatus,
    meta: Meta,
    out: Outcome,
    *,
    error_class: str | None = None,
    error_message: str | None = None,
    error_stack: str | None = None,
) -> None:
    """Move to a terminal state and drop everything the task still holds."""
    if task.status == TaskStatus.LEASED:
        end_lease(tables, task, out)
    elif task.status in WAITING:
        leave_waiting(tables, task)
    for ref in deadline_timers(task):
        tables.remove_timer(ref)
    move(task, to)
    if error_class is not None:
        task.error_class, task.error_message = error_class, error_message
        task.error_stack = error_stack
    task.finished_ms = meta.ts_ms
    touch(task, meta)
    if to == TaskStatus.FAILED:
        tables.add_dead(task.tenant, task.task_id)
    tables.drop_steps(task.task_id)  # memos serve only a task that can still run (steps.py)
    tables.put_task(task)
    emit(out, FINISHED[to], task, meta, error_class=error_class, error_message=error_message)
    out.actions.append(TaskFinished(task_id=task.task_id, status=to))


# The event that reports each terminal status.
FINISHED = {
    TaskStatus.SUCCEEDED: EventKind.TaskSucceeded,
    TaskStatus.FAILED: EventKind.TaskFailed,
    TaskStatus.CANCELED: EventKind.TaskCanceled,
    TaskStatus.EXPIRED: EventKind.TaskExpired,
}


def cancel_now(tables: Tables, task: Task, meta: Meta, out: Outcome, reason: str | None) -> None:
    """The task is canceled, with ``reason``: at once, or, if it registered compensations,
    after an attempt that runs them (``begin_compensation``)."""
    if task.compensable and not task.compensating:
        begin_compensation(tables, task, meta, out, reason)
        return
    canceled = TaskStatus.CANCELED
    finish(tables, task, canceled, meta, out, error_class="Canceled", error_message=reason)


def begin_compensation(
    tables: Tables, task: Task, meta: Meta, out: Outcome, reason: str | None
) -> None:
    """A canceled task with compensations (a workflow that ran a step with ``compensate=``)
    does not end yet: it drops its lease, sleep or wait, goes back to ENQUEUED flagged
    ``compensating`` with a fresh retry budget, and its children and timers are canceled in
    this record (``out.compensating``). Its next attempt replays the committed steps, runs their
    compensations newest first as durable steps, and reports CANCELED; a compensation that
    keeps failing ends it FAILED per the retry policy. A cancel of a compensating task changes
    nothing."""
    if task.status == TaskStatus.LEASED:
        end_lease(tables, task, out)
        task.attempt += 1
    elif task.status != TaskStatus.ENQUEUED:
        leave_waiting(tables, task)
    task.compensating = True
    task.cancel_reason = reason
    task.budget_base = task.attempt - 1
    if task.status != TaskStatus.ENQUEUED:
        move(task, TaskStatus.ENQUEUED)
        task.run_at_ms = meta.ts_ms
        make_ready(tables, task, meta, spare_index(out))
    touch(task, meta)
    tables.put_task(task)
    emit(
        out,
        EventKind.TaskRequeued,
        task,
        meta,
        error_class=COMPENSATING_CLASS,
        error_message=reason,
    )
    out.compensating.append(task.task_id)


def expire_closed(tables: Tables, task: Task, meta: Meta, out: Outcome, message: str) -> None:
    """schedule_to_close ended the task."""
    cause = "ScheduleToCloseTimeout"
    finish(tables, task, TaskStatus.EXPIRED, meta, out, error_class=cause, error_message=message)


def end_stopped(tables: Tables, task: Task, meta: Meta, out: Outcome, *, expired: str) -> None:
    """A LEASED task that was asked to stop ends where its cause sends it: EXPIRED after a
    schedule_to_close (``expired`` is the message), else CANCELED with the cancel reason."""
    if task.cancel_cause == CancelCause.SCHEDULE_TO_CLOSE:
        expire_closed(tables, task, meta, out, expired)
    else:
        cancel_now(tables, task, meta, out, task.cancel_reason)


def backoff_ms(spec: TaskSpec, task_id: str, attempt: int) -> int:
    """Exponential backoff with full jitter; the jitter is a hash of (task id, attempt)."""
    ceiling = min(spec.backoff_cap_ms, spec.backoff_base_ms * spec.backoff_factor ** (attempt - 1))
    digest = hashlib.blake2b(f"{task_id}:{attempt}".encode(), digest_size=8).digest()
    fraction = int.from_bytes(digest, "big") / 2**64
    return int(ceiling * fraction)


def attempt_failed(
    tables: Tables,
    task: Task,
    meta: Meta,
    out: Outcome,
    *,
    error_class: str,
    error_message: str | None,
    error_stack: str | None = None,
    fatal: bool = False,
    retry_after_ms: int | None = None,
) -> None:
    """A LEASED attempt failed: retry after a backoff, or fail the task for good."""
    if task.status != TaskStatus.LEASED:
        raise InvariantError(f"task {task.task_id}: an attempt failed while {task.status}")
    record_attempt(tables, task, meta, "FAILED", error_class, error_message, error_stack)
    if task.cancel_cause == CancelCause.CANCEL and task.compensable and not task.compensating:
        begin_compensation(tables, task, meta, out, task.cancel_reason)
        return
    if task.cancel_cause == CancelCause.CANCEL:
        finish(
            tables,
            task,
            TaskStatus.CANCELED,
            meta,
            out,
            error_class=error_class,
            error_message=error_message,
            error_stack=error_stack,
        )
        return
    spec = tables.spec(task.task_id)
    if spec is None:
        raise InvariantError(f"task {task.task_id} has no spec")
    exhausted = task.attempt - task.budget_base >= spec.attempts_max
    if fatal or exhausted or error_class in spec.non_retryable:
        finish(
            tables,
            task,
            TaskStatus.FAILED,
            meta,
            out,
            error_class=error_class,
            error_message=error_message,
            error_stack=error_stack,
        )
        return
    delay = (
        retry_after_ms
        if retry_after_ms is not None
        else backoff_ms(spec, task.task_id, task.attempt)
    )
    run_at = meta.ts_ms + max(0, delay)
    # Once the SCHEDULE_TO_CLOSE timer fired the deadline has passed on the log's time base,
    # whatever this record's timestamp says (a leader clock may step back): never retry then.
    closed = task.cancel_cause == CancelCause.SCHEDULE_TO_CLOSE
    if task.close_by_ms is not None and (closed or run_at >= task.close_by_ms):
        finish(
            tables,
            task,
            TaskStatus.EXPIRED,
            meta,
            out,
            error_class="ScheduleToCloseTimeout",
            error_message="the next retry would start after schedule_to_close",
        )
        return
    end_lease(tables, task, out)
    move(task, TaskStatus.RETRY_WAIT)
    task.attempt += 1
    task.run_at_ms = run_at
    task.error_class, task.error_message, task.error_stack = (
        error_class,
        error_message,
        error_stack,
    )
    touch(task, meta)
    tables.add_timer(run_timer(task))
    tables.put_task(task)
    emit(
        out,
        EventKind.TaskRetryScheduled,
        task,
        meta,
        error_class=error_class,
        error_message=error_message,
    )


def stopped_instead(
    tables: Tables,
    task: Task,
    meta: Meta,
    out: Outcome,
    *,
    expired: str,
    until_ms: int | None = None,
) -> bool:
    """An attempt that ends in a wait (a sleep, a fan-out, an event wait) ends the task instead
    when a cancel is pending (CANCELED), when schedule_to_close has passed, or when the wait
    would run to ``until_ms`` at or past it (EXPIRED, with ``expired`` as the message)."""
    if task.cancel_cause == CancelCause.CANCEL:
        record_attempt(tables, task, meta, "CANCELED", "Canceled", task.cancel_reason)
        cancel_now(tables, task, meta, out, task.cancel_reason)
        return True
    closed = task.cancel_cause == CancelCause.SCHEDULE_TO_CLOSE
    close_by = task.close_by_ms
    if closed or (until_ms is not None and close_by is not None and until_ms >= close_by):
        expire_closed(tables, task, meta, out, expired)
        return True
    return False
