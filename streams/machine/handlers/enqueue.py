"""EnqueueTasks: create tasks; a keyed enqueue meets its twin and returns the original id."""

from __future__ import annotations

from collections.abc import Sequence

from conveyor.schemas import codec
from conveyor.schemas.resume import RESUME_POLICIES
from conveyor.schemas.types import (
    EnqueueTasks,
    EventKind,
    IdempotencyEntry,
    Task,
    TaskSpec,
    TaskStatus,
    TimerKind,
    TimerRef,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.lifecycle import (
    deadline_timers,
    emit,
    make_ready,
    run_timer,
)
from conveyor.streams.machine.outcome import Meta, Outcome, Reply

_NOT_A_SPEC = "task %d of the record is not an encoded TaskSpec"


def apply_enqueue(
    tables: Tables,
    record: EnqueueTasks,
    meta: Meta,
    out: Outcome,
    specs: Sequence[TaskSpec] | None = None,
) -> None:
    """``specs``: the record's items decoded, when the caller has them."""
    if specs is None:
        for index, raw in enumerate(record.tasks):
            out.actions.append(enqueue_one(tables, raw, meta, out, index))
    else:
        for index, (spec, raw) in enumerate(zip(specs, record.tasks, strict=True)):
            out.actions.append(enqueue_spec(tables, spec, raw, meta, out, index))


def enqueue_one(tables: Tables, raw: bytes, meta: Meta, out: Outcome, index: int) -> Reply:
    """Create the task of one encoded spec, or meet its twin; the reply says which.

    ``index`` must be unique among the items of the record that become ready: it orders the
    ready queue (a schedule firing passes its timer's index in the FireTimers record)."""
    try:
        spec = codec.TASK_SPEC.decode(raw)
    except Exception:  # fastavro raises many types on hostile input; never halt on it
        return Reply(
            offset=meta.offset, index=index, ok=False, task_id="", reason=_NOT_A_SPEC % index
        )
    return enqueue_spec(tables, spec, raw, meta, out, index)


def enqueue_spec(
    tables: Tables, spec: TaskSpec, raw: bytes, meta: Meta, out: Outcome, index: int
) -> Reply:
    """``enqueue_one`` of a spec already decoded from ``raw`` (kept as is in the spec row)."""
    problem = invalid(spec)
    if problem is not None:
        # The gateway validates; anything else that appends (ingest, tools) may not.
        return Reply(
            offset=meta.offset, index=index, ok=False, task_id=spec.task_id[:64], reason=problem
        )
    twin = _twin(tables, spec, meta)
    if twin is not None:
        existing = tables.task(twin)
        return Reply(
            offset=meta.offset,
            index=index,
            ok=True,
            task_id=twin,
            created=False,
            status=existing.status if existing else None,
        )
    task = _new_task(spec, meta)
    tables.put_spec(spec.task_id, raw, spec.payload)
    if spec.idempotency_key is not None:
        expires_ms = meta.ts_ms + spec.idempotency_window_ms
        tables.put_idempotency(
            spec.tenant,
            spec.app,
            spec.idempotency_key,
            IdempotencyEntry(task_id=spec.task_id, expires_ms=expires_ms),
        )
        forget = TimerRef(
            fire_at_ms=expires_ms, task_id=spec.task_id, kind=TimerKind.FORGET_KEY, token=0
        )
        tables.add_timer(forget)
    if task.run_at_ms > meta.ts_ms:
        tables.add_timer(run_timer(task))
    else:
        make_ready(tables, task, meta, index)
    for ref in deadline_timers(task):
        tables.add_timer(ref)
    tables.put_task(task, new=True)
    emit(out, EventKind.TaskEnqueued, task, meta)
    return Reply(
        offset=meta.offset,
        index=index,
        ok=True,
        task_id=task.task_id,
        created=True,
        status=task.status,
    )


NAME_BYTES_MAX = 1_024
TIME_MS_MAX = 1 << 53  # far beyond any real deadline, far below the u64 key encoding limit


def invalid(spec: TaskSpec) -> str | None:
    """Why a spec cannot be stored, or None. Cheap checks of what the key encodings need."""
    for name in ("task_id", "tenant", "app", "task_type", "queue"):
        if len(getattr(spec, name).encode()) > NAME_BYTES_MAX:
            return f"{name} longer than {NAME_BYTES_MAX} bytes"
    if not 0 <= spec.priority <= 255:
        return f"priority {spec.priority} outside 0..255"
    times = (
        spec.run_at_ms,
        spec.schedule_to_start_ms,
        spec.start_to_close_ms,
        spec.schedule_to_close_ms,
        spec.cancel_grace_ms,
        spec.idempotency_window_ms,
        spec.backoff_base_ms,
        spec.backoff_cap_ms,
    )
    if any(t is not None and not 0 <= t <= TIME_MS_MAX for t in times):
        return "a time or duration outside 0..2^53 ms"
    if spec.attempts_max < 1:
        return "attempts_max below 1"
    if spec.resume not in RESUME_POLICIES:
        return f"resume {spec.resume[:64]!r} is not one of {'|'.join(RESUME_POLICIES)}"
    return None


def forget_key(tables: Tables, task_id: str, meta: Meta) -> None:
    """The idempotency window of ``task_id``'s key is over: drop the key's row. Nothing reads
    a row past its window (``_twin``), so this changes no answer; it keeps a day of keyed
    enqueues from becoming a table that only grows. A row that a later enqueue re-keyed to
    its own task is that task's to forget."""
    spec = tables.spec(task_id)
    if spec is None or spec.idempotency_key is None:
        return
    entry = tables.idempotency(spec.tenant, spec.app, spec.idempotency_key)
    if entry is not None and entry.task_id == task_id and entry.expires_ms <= meta.ts_ms:
        tables.delete_idempotency(spec.tenant, spec.app, spec.idempotency_key)


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
        run_key=spec.run_key,
        resume=spec.resume,
    )
