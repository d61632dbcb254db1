"""CompleteAttempts, SaveCheckpoints, ExpireLeases: everything fenced by a lease id.

Rule: an item whose lease id is not the task's current lease of a LEASED task is rejected and
changes nothing. That is what keeps a paused zombie agent from completing a task twice.

A CANCELED completion of a task asked to stop (cancel requested) ends it CANCELED; the result it
carries (what the handler returned when it saw ``ctx.cancelled``) is kept on the task.
"""

from __future__ import annotations

from conveyor.schemas.types import (
    RELEASED_CLASS,
    CancelCause,
    CompleteAttempts,
    Completion,
    EventKind,
    ExpireLeases,
    SaveCheckpoints,
    Task,
    TaskStatus,
)
from conveyor.schemas.types import (
    Outcome as AttemptOutcome,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.handlers.events import wait_attempt
from conveyor.streams.machine.handlers.steps import sleep_attempt
from conveyor.streams.machine.handlers.workflows import fan_out_attempt
from conveyor.streams.machine.lifecycle import (
    attempt_failed,
    cancel_now,
    emit,
    end_lease,
    end_stopped,
    finish,
    holder,
    make_ready,
    record_attempt,
    touch,
)
from conveyor.streams.machine.outcome import Meta, Outcome, Reply
from conveyor.streams.machine.transitions import move


def apply_complete(tables: Tables, record: CompleteAttempts, meta: Meta, out: Outcome) -> None:
    for index, item in enumerate(record.items):
        task = holder(tables, item.task_id, item.lease_id)
        if isinstance(task, str):
            out.actions.append(
                Reply(offset=meta.offset, index=index, ok=False, task_id=item.task_id, reason=task)
            )
            continue
        _complete(tables, task, item, meta, out, index)
        out.actions.append(
            Reply(
                offset=meta.offset, index=index, ok=True, task_id=item.task_id, status=task.status
            )
        )


def _complete(
    tables: Tables, task: Task, item: Completion, meta: Meta, out: Outcome, index: int
) -> None:
    match item.outcome:
        case AttemptOutcome.RELEASED if task.cancel_cause is None:
            _release(tables, task, meta, out, index, item.error_message)
        case AttemptOutcome.SUCCEEDED | AttemptOutcome.CANCELED if (
            task.compensating and task.cancel_cause is None
        ):
            # The compensating attempt ran every compensation: the cancel is complete.
            record_attempt(tables, task, meta, "CANCELED", "Canceled", item.error_message)
            cancel_now(tables, task, meta, out, task.cancel_reason)
        case AttemptOutcome.SUCCEEDED:
            # The final attempt is described by the task row itself; no attempts row.
            task.result = item.result
            finish(tables, task, TaskStatus.SUCCEEDED, meta, out)
        case AttemptOutcome.SLEEP:
            sleep_attempt(tables, task, item, meta, out)
        case AttemptOutcome.FAN_OUT:
            fan_out_attempt(tables, task, item, meta, out)
        case AttemptOutcome.WAIT_EVENT:
            wait_attempt(tables, task, item, meta, out)
        case AttemptOutcome.CANCELED | AttemptOutcome.RELEASED if (
            task.cancel_cause == CancelCause.START_TO_CLOSE
        ):
            # The handler obeyed the timeout's stop (or never started before it came): the
            # attempt failed; retry per policy.
            task.cancel_cause = None
            attempt_failed(
                tables,
                task,
                meta,
                out,
                error_class="StartToCloseTimeout",
                error_message="the attempt ran past start_to_close",
            )
        case AttemptOutcome.CANCELED | AttemptOutcome.RELEASED if task.cancel_cause is not None:
            # The handler stopped on request (or never started): where the grace would have
            # sent it, keeping what a canceled handler returned (say, how far it got).
            record_attempt(tables, task, meta, "CANCELED", "Canceled", item.error_message)
            if item.result is not None and task.cancel_cause == CancelCause.CANCEL:
                task.result = item.result
            end_stopped(tables, task, meta, out, expired=task.cancel_reason or "")
        case AttemptOutcome.FAILED | AttemptOutcome.FATAL | AttemptOutcome.CANCELED:
            attempt_failed(
                tables,
                task,
                meta,
                out,
                error_class=item.error_class or "Error",
                error_message=item.error_message,
                error_stack=item.error_stack,
                fatal=item.outcome == AttemptOutcome.FATAL,
                retry_after_ms=item.retry_after_ms,
            )


def _release(
    tables: Tables, task: Task, meta: Meta, out: Outcome, index: int, why: str | None
) -> None:
    """A LEASED attempt handed back before it started: ready again at once, at the back of
    its queue, under the same attempt number and with the retry budget untouched (no attempt
    ran, so none is recorded). A compensating task stays compensating."""
    end_lease(tables, task, out)
    move(task, TaskStatus.ENQUEUED)
    touch(task, meta)
    make_ready(tables, task, meta, index)
    tables.put_task(task)
    emit(out, EventKind.TaskRequeued, task, meta, error_class=RELEASED_CLASS, error_message=why)


def apply_checkpoints(tables: Tables, record: SaveCheckpoints, meta: Meta, out: Outcome) -> None:
    for index, item in enumerate(record.items):
        task = holder(tables, item.task_id, item.lease_id)
        if isinstance(task, str):
            out.actions.append(
                Reply(offset=meta.offset, index=index, ok=False, task_id=item.task_id, reason=task)
            )
            continue
        task.checkpoint = item.value
        touch(task, meta)
        tables.put_task(task)
        emit(out, EventKind.CheckpointSaved, task, meta)
        out.actions.append(
            Reply(
                offset=meta.offset, index=index, ok=True, task_id=item.task_id, status=task.status
            )
        )


def apply_expire(tables: Tables, record: ExpireLeases, meta: Meta, out: Outcome) -> None:
    for item in record.items:
        task = holder(tables, item.task_id, item.lease_id)
        if isinstance(task, str):
            continue  # the lease ended some other way first
        emit(out, EventKind.LeaseExpired, task, meta, error_class="LeaseExpired")
        attempt_failed(
            tables,
            task,
            meta,
            out,
            error_class="LeaseExpired",
            error_message=f"no heartbeat for lease {item.lease_id}",
        )
