"""EnqueueTasks: create tasks; a keyed enqueue meets its twin and returns the original id.

Rule 1: an item is created, meets its twin, or is refused with a ``Refusal``; a refused item
writes nothing, so no reply ever names a task that does not exist.
Rule 2 (conflicts): a client's keyed enqueue whose key names a task in its window meets that
twin only if it asks for the same task: same type, payload, queue, priority, timing, retry
policy, timeouts and cancel grace. Otherwise it is refused as ``CONFLICT``, naming the twin and
the fields that differ. The decision is the partition's (it holds the key), so it holds however
many gateways race. Schedule firings and workflow children derive their own keys and ids: they
meet their twin without comparing (a replaced schedule re-firing a time keeps its first task).
"""

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
from conveyor.streams.machine.outcome import Meta, Outcome, Refusal, Reply

_NOT_A_SPEC = "task %d of the record is not an encoded TaskSpec"


def apply_enqueue(
    tables: Tables,
    record: EnqueueTasks,
    meta: Meta,
    out: Outcome,
    specs: Sequence[TaskSpec] | None = None,
) -> None:
    """``specs``: the record's items decoded, when the caller has them. Items of a client
    record are compared with their twins (rule 2)."""
    if specs is None:
        for index, raw in enumerate(record.tasks):
            out.actions.append(enqueue_one(tables, raw, meta, out, index, compare=True))
    else:
        for index, (spec, raw) in enumerate(zip(specs, record.tasks, strict=True)):
            reply = enqueue_spec(tables, spec, raw, meta, out, index, compare=True)
            out.actions.append(reply)


def enqueue_one(
    tables: Tables, raw: bytes, meta: Meta, out: Outcome, index: int, *, compare: bool = False
) -> Reply:
    """Create the task of one encoded spec, or meet its twin; the reply says which.

    ``index`` must be unique among the items of the record that become ready: it orders the
    ready queue (a schedule firing passes its timer's index in the FireTimers record)."""
    try:
        spec = codec.TASK_SPEC.decode(raw)
    except Exception:  # fastavro raises many types on hostile input; never halt on it
        return Reply(
            offset=meta.offset,
            index=index,
            ok=False,
            task_id="",
            reason=_NOT_A_SPEC % index,
            refusal=Refusal.NOT_A_SPEC,
        )
    return enqueue_spec(tables, spec, raw, meta, out, index, compare=compare)


def enqueue_spec(
    tables: Tables,
    spec: TaskSpec,
    raw: bytes,
    meta: Meta,
    out: Outcome,
    index: int,
    *,
    compare: bool = False,
) -> Reply:
    """``enqueue_one`` of a spec already decoded from ``raw`` (kept as is in the spec row)."""
    problem = invalid(spec)
    if problem is not None:
        # The gateway validates; anything else that appends (ingest, tools) may not.
        return Reply(
            offset=meta.offset,
            index=index,
            ok=False,
            task_id=spec.task_id[:64],
            reason=problem,
            refusal=Refusal.INVALID_SPEC,
        )
    twin = _twin(tables, spec, meta)
    if twin is not None:
        if compare and spec.idempotency_key is not None:
            stored = tables.spec(twin)
            differing = () if stored is None else differing_fields(stored, spec)
            if differing:
                return _conflict(spec, twin, differing, meta, index)
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
    tables.put_spec(spec.task_id, raw, spec.payload, spec.trace_context)
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
    delayed = task.run_at_ms > meta.ts_ms
    if delayed:
        tables.add_timer(run_timer(task))
    else:
        make_ready(tables, task, meta, index)
    for ref in deadline_timers(task):
        tables.add_timer(ref)
    tables.put_task(task, new=True)
    run_at_ms = task.run_at_ms if delayed else None
    fields = spec.payload_fields  # searchable in the snapshot (gateway/payload_fields.py)
    emit(out, EventKind.TaskEnqueued, task, meta, run_at_ms=run_at_ms, payload_fields=fields)
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


# What a client asks for, field by field, as ``differing_fields`` compares it (rule 2): the
# wire's name (``POST /v1/tasks``), so that a conflict can name it to the client, then the
# spec's.
_COMPARED = (
    ("task_type", "task_type"),
    ("payload", "payload"),
    ("queue", "queue"),
    ("priority", "priority"),
    ("retry.attempts_max", "attempts_max"),
    ("retry.backoff_base_ms", "backoff_base_ms"),
    ("retry.backoff_factor", "backoff_factor"),
    ("retry.backoff_cap_ms", "backoff_cap_ms"),
    ("retry.non_retryable", "non_retryable"),
    ("timeouts.schedule_to_start_ms", "schedule_to_start_ms"),
    ("timeouts.start_to_close_ms", "start_to_close_ms"),
    ("timeouts.schedule_to_close_ms", "schedule_to_close_ms"),
    ("cancel_grace_ms", "cancel_grace_ms"),
)


def differing_fields(stored: TaskSpec, incoming: TaskSpec) -> tuple[str, ...]:
    """The wire names of what ``incoming`` asks for differently from ``stored`` (rule 2)."""
    names = [wire for wire, name in _COMPARED if getattr(stored, name) != getattr(incoming, name)]
    if _timing(stored) != _timing(incoming):
        names.append("run_at" if incoming.delay_ms is None else "delay_ms")
    return tuple(names)


def _timing(spec: TaskSpec) -> tuple[str, int]:
    """When the client asked the task to run: a delay is compared as a delay (a retry sent
    later computes a later ``run_at_ms`` from it), an instant as an instant."""
    if spec.delay_ms:
        return ("delay_ms", spec.delay_ms)
    if spec.run_at_ms is not None:
        return ("run_at", spec.run_at_ms)
    return ("now", 0)


def _conflict(
    spec: TaskSpec, twin: str, differing: tuple[str, ...], meta: Meta, index: int
) -> Reply:
    return Reply(
        offset=meta.offset,
        index=index,
        ok=False,
        task_id=twin,
        reason=f"idempotency key {spec.idempotency_key!r} already names task {twin}, "
        f"which differs in {', '.join(differing)}",
        refusal=Refusal.CONFLICT,
        twin_id=twin,
        differing=differing,
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
        run_key=spec.run_key,
        resume=spec.resume,
    )
