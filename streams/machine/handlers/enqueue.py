"""EnqueueTasks: create tasks; a keyed enqueue meets its twin and returns the original id."""

from __future__ import annotations

from conveyor.schemas import codec
from conveyor.schemas.types import (
    EnqueueTasks,
    EventKind,
    IdempotencyEntry,
    Task,
    TaskSpec,
    TaskStatus,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.lifecycle import (
    deadline_timers,
    emit,
    make_ready,
    run_timer,
)
from conveyor.streams.machine.outcome import Meta, Outcome, Reply


def apply_enqueue(tables: Tables, record: EnqueueTasks, meta: Meta, out: Outcome) -> None:
    for index, raw in enumerate(record.tasks):
        spec = codec.TASK_SPEC.decode(raw)
        twin = _twin(tables, spec, meta)
        if twin is not None:
            existing = tables.task(twin)
            out.actions.append(
                Reply(
                    offset=meta.offset,
                    index=index,
                    ok=True,
                    task_id=twin,
                    created=False,
                    status=existing.status if existing else None,
                )
            )
            continue
        task = _new_task(spec, meta)
        tables.put_spec(spec.task_id, raw, spec.payload)
        if spec.idempotency_key is not None:
            tables.put_idempotency(
                spec.tenant,
                spec.app,
                spec.idempotency_key,
                IdempotencyEntry(
                    task_id=spec.task_id, expires_ms=meta.ts_ms + spec.idempotency_window_ms
                ),
            )
        if task.run_at_ms > meta.ts_ms:
            tables.add_timer(run_timer(task))
        else:
            make_ready(tables, task, meta, index)
        for ref in deadline_timers(task):
            tables.add_timer(ref)
        tables.put_task(task, new=True)
        emit(out, EventKind.TaskEnqueued, task, meta)
        out.actions.append(
            Reply(
                offset=meta.offset,
                index=index,
                ok=True,
                task_id=task.task_id,
                created=True,
                status=task.status,
            )
        )


def _twin(tables: Tables, spec: TaskSpec, meta: Meta) -> str | None:
    """The task this enqueue duplicates: same idempotency key in its window, or same id."""
    if spec.idempotency_key is not None:
        entry = tables.idempotency(spec.tenant, spec.app, spec.idempotency_key)
        if entry is not None and entry.expires_ms > meta.ts_ms:
            return entry.task_id
    if tables.task(spec.task_id) is not None:
        return spec.task_id
    return None


def _new_task(spec: TaskSpec, meta: Meta) -> Task:
    now = meta.ts_ms
    return Task(
        task_id=spec.task_id,
        tenant=spec.tenant,
        app=spec.app,
        task_type=spec.task_type,
        queue=spec.queue,
        priority=spec.priority,
        status=TaskStatus.ENQUEUED,
        attempt=1,
        budget_base=0,
        lease_id=0,
        created_ms=now,
        run_at_ms=max(now, spec.run_at_ms or now),
        updated_ms=now,
        ready_seq=0,
        version=meta.offset,
        cancel_grace_ms=spec.cancel_grace_ms,
        start_to_close_ms=spec.start_to_close_ms,
        start_by_ms=None
        if spec.schedule_to_start_ms is None
        else max(now, spec.run_at_ms or now) + spec.schedule_to_start_ms,
        close_by_ms=None if spec.schedule_to_close_ms is None else now + spec.schedule_to_close_ms,
    )
