"""CancelTasks and RetryFailed.

Cancel: a waiting task is CANCELED at once (its ready entry or timer removed in the same
batch); a LEASED task is asked to stop (``CancelLease``: the leader pushes it to the holding
agent, and its heartbeats answer CANCEL) and becomes CANCELED when the handler stops (keeping
what it returned) or the grace ends, whichever comes first.

RetryFailed: a FAILED task stays FAILED (terminal states are final). Its retry is a new task
with the same spec and a fresh attempt budget, on the same partition, with an id derived from
the original id and the record's offset. The retry takes the task out of the dead letters, so
retrying the same dead letter again does nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib

from conveyor.errors import InvariantError
from conveyor.schemas import codec
from conveyor.schemas.types import (
    CancelCause,
    CancelTasks,
    EnqueueTasks,
    EventKind,
    RetryFailed,
    Task,
    TaskStatus,
    TimerRef,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.handlers.enqueue import apply_enqueue
from conveyor.streams.machine.lifecycle import WAITING, cancel_now, emit, grace_timer, touch
from conveyor.streams.machine.outcome import CancelLease, Meta, Outcome, Refusal, Reply


def apply_cancel(tables: Tables, record: CancelTasks, meta: Meta, out: Outcome) -> None:
    for index, task_id in enumerate(record.task_ids):
        task = tables.task(task_id)
        if task is None or task.tenant != record.tenant:
            out.actions.append(
                Reply(
                    offset=meta.offset,
                    index=index,
                    ok=False,
                    task_id=task_id,
                    reason="unknown task",
                    refusal=Refusal.UNKNOWN_TASK,
                )
            )
            continue
        stop_task(tables, task, record.reason, meta, out)
        out.actions.append(
            Reply(offset=meta.offset, index=index, ok=True, task_id=task_id, status=task.status)
        )


def stop_task(tables: Tables, task: Task, reason: str, meta: Meta, out: Outcome) -> None:
    """Cancel one task: at once if it waits, by asking its holder if it runs; else nothing
    (a compensating task is being canceled already)."""
    if task.compensating:
        return
    if task.status in WAITING:
        cancel_now(tables, task, meta, out, reason)
    elif task.status == TaskStatus.LEASED and task.cancel_cause != CancelCause.CANCEL:
        request_stop(tables, task, CancelCause.CANCEL, reason, meta, out)


def request_stop(
    tables: Tables, task: Task, cause: CancelCause, reason: str, meta: Meta, out: Outcome
) -> None:
    """Ask the holder of a LEASED task to stop; the grace timer ends it if it does not."""
    old: TimerRef | None = grace_timer(task)
    if old is not None:
        tables.remove_timer(old)
    task.cancel_cause = cause
    task.cancel_reason = reason
    task.grace_until_ms = meta.ts_ms + task.cancel_grace_ms
    new = grace_timer(task)
    if new is None:
        raise InvariantError(f"task {task.task_id}: a grace deadline and no grace timer")
    tables.add_timer(new)
    touch(task, meta)
    tables.put_task(task)
    emit(out, EventKind.CancelRequested, task, meta, error_message=reason)
    out.actions.append(CancelLease(task_id=task.task_id, lease_id=task.lease_id))


def retry_id(task_id: str, offset: int) -> str:
    digest = hashlib.blake2b(f"{task_id}/{offset}".encode(), digest_size=14).hexdigest()
    return task_id[:4] + digest


def apply_retry_failed(tables: Tables, record: RetryFailed, meta: Meta, out: Outcome) -> None:
    specs: list[bytes] = []
    for task_id in record.task_ids:
        task = tables.task(task_id)
        spec = tables.spec(task_id)
        if task is None or spec is None or task.tenant != record.tenant:
            continue
        if task.status != TaskStatus.FAILED or not tables.is_dead(task.tenant, task_id):
            continue  # not failed, or already retried: one retry per dead letter
        tables.remove_dead(task.tenant, task_id)
        # The run key travels with the retry, so step idempotency keys stay stable across it.
        twin = dataclasses.replace(
            spec,
            task_id=retry_id(task_id, meta.offset),
            idempotency_key=None,
            run_at_ms=None,
            run_key=task.run_key or task_id,
        )
        specs.append(codec.TASK_SPEC.encode(twin))
        touch(task, meta)
        tables.put_task(task)
        emit(out, EventKind.TaskRequeued, task, meta)
    apply_enqueue(tables, EnqueueTasks(tasks=specs), meta, out)
