"""Workflows: the FAN_OUT outcome of ``ctx.parallel`` and the fan-in of its children.

Rule 1 (fan-out): a FAN_OUT outcome, in the batch that applies it, enqueues the children on the
parent's partition, links each to its barrier slot, creates the barrier, ends the lease and
moves the parent LEASED -> WAITING. Child ids are derived from (parent id, step identity,
child index), so a replayed or resent fan-out meets its own children and never duplicates one.
Rule 2 (striped fan-in): each child that reaches a terminal state lands once in its slot (a
slot that already holds a result ignores it) and counts down stripe ``index % STRIPES``; only
a stripe reaching zero touches the barrier row, so a 10,000-way fan-in rewrites that row at
most STRIPES times.
Rule 3 (fires once): the barrier fires when its last stripe closes (collect) or at the first
child that ends FAILED, CANCELED or EXPIRED (fail_fast). Firing commits the parallel step
(its results in child order, or the failure) and moves the parent WAITING -> ENQUEUED; the
``fired`` flag, written in the same batch, makes every later landing a no-op. fail_fast then
cancels the siblings still running (their landings change nothing but their slots).
Rule 4 (cascade): a workflow that ends while a barrier is open (canceled, expired) cancels
every child of that barrier that has not ended.
Rule 5 (no I/O): like every handler, only the tables; the slots of a fired barrier stay for
``GET /v1/workflows/{id}``.
Rule 6 (events): ``ctx.wait_for_event`` parks a workflow in WAITING too (handlers/events.py);
a workflow that ends while waiting drops its wait and its timeout timer here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from conveyor.schemas import codec
from conveyor.schemas.steps import PARALLEL_CHILDREN_MAX, STEPS_BYTES_MAX
from conveyor.schemas.types import (
    TERMINAL,
    Barrier,
    ChildLink,
    ChildResult,
    Completion,
    EventKind,
    EventWait,
    FanOut,
    ParallelMode,
    StepRow,
    StepTotals,
    Task,
    TaskSpec,
    TaskStatus,
    TimerKind,
    TimerRef,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.handlers.cancel import stop_task
from conveyor.streams.machine.handlers.enqueue import enqueue_one, invalid
from conveyor.streams.machine.handlers.steps import put_step
from conveyor.streams.machine.lifecycle import (
    attempt_failed,
    emit,
    end_lease,
    finish,
    make_ready,
    record_attempt,
    spare_index,
    stopped_instead,
    touch,
)
from conveyor.streams.machine.outcome import Meta, Outcome, TaskFinished
from conveyor.streams.machine.transitions import move

STRIPES = 16


def child_id(parent_id: str, identity: str, index: int) -> str:
    """The id of child ``index`` of a parallel step: on the parent's partition (the first four
    hex digits), the same however often the fan-out is applied."""
    digest = hashlib.blake2b(f"{parent_id}/{identity}/{index}".encode(), digest_size=14)
    return parent_id[:4] + digest.hexdigest()


# -- fan-out -------------------------------------------------------------------------------


WAIT_EXPIRED = "schedule_to_close passed before the workflow could wait"


def fan_out_attempt(tables: Tables, task: Task, item: Completion, meta: Meta, out: Outcome) -> None:
    """A LEASED attempt ended in ``ctx.parallel`` (rule 1)."""
    fan = item.fan_out
    specs = _child_specs(task, fan) if fan is not None else "a FAN_OUT outcome without its step"
    if isinstance(specs, str):
        attempt_failed(
            tables, task, meta, out, error_class="BadFanOut", error_message=specs, fatal=True
        )
        return
    assert fan is not None
    if stopped_instead(tables, task, meta, out, expired=WAIT_EXPIRED):
        return
    barrier = tables.barrier(task.task_id, fan.identity)
    if barrier is None:
        _open(tables, task, fan, specs, meta, out)
    park(tables, task, "FANNED_OUT", meta, out)
    if barrier is not None and barrier.fired:
        wake(tables, task, meta, out)  # the step was committed before: carry on at once


def park(tables: Tables, task: Task, outcome: str, meta: Meta, out: Outcome) -> None:
    """End a LEASED attempt into WAITING (no lease, no guest). The attempt number moves on and
    so does the budget base: waiting never spends a retry."""
    record_attempt(tables, task, meta, outcome)
    end_lease(tables, task, out)
    move(task, TaskStatus.WAITING)
    task.attempt += 1
    task.budget_base += 1
    touch(task, meta)
    tables.put_task(task)
    emit(out, EventKind.TaskWaiting, task, meta)


def _child_specs(task: Task, fan: FanOut) -> list[TaskSpec] | str:
    """The children as they will be stored, or why the fan-out is refused."""
    if not 1 <= len(fan.children) <= PARALLEL_CHILDREN_MAX:
        return (
            f"parallel step {fan.identity!r} has {len(fan.children)} children; "
            f"it takes 1..{PARALLEL_CHILDREN_MAX}"
        )
    specs = []
    for index, raw in enumerate(fan.children):
        try:
            spec = codec.TASK_SPEC.decode(raw)
        except Exception:  # fastavro raises many types on hostile input
            return f"parallel step {fan.identity!r}: child {index} is not a TaskSpec"
        spec = dataclasses.replace(
            spec,
            task_id=child_id(task.task_id, fan.identity, index),
            tenant=task.tenant,
            app=spec.app or task.app,
            idempotency_key=None,
            run_key=None,
        )
        problem = invalid(spec)
        if problem is not None:
            return f"parallel step {fan.identity!r}: child {index}: {problem}"
        specs.append(spec)
    return specs


def _open(
    tables: Tables, task: Task, fan: FanOut, specs: list[TaskSpec], meta: Meta, out: Outcome
) -> None:
    """Create the barrier, link and enqueue the children."""
    counts = [0] * STRIPES
    for index, spec in enumerate(specs):
        counts[index % STRIPES] += 1
        tables.put_child_link(
            spec.task_id, ChildLink(parent_id=task.task_id, identity=fan.identity, index=index)
        )
        enqueue_one(tables, codec.TASK_SPEC.encode(spec), meta, out, spare_index(out))
    for n, count in enumerate(counts):
        tables.put_stripe(task.task_id, fan.identity, n, count)
    tables.put_barrier(
        task.task_id,
        Barrier(
            identity=fan.identity,
            position=fan.position,
            mode=fan.mode.value,
            total=len(specs),
            stripes_open=sum(1 for c in counts if c),
            created_ms=meta.ts_ms,
        ),
    )


# -- fan-in --------------------------------------------------------------------------------


def settle(tables: Tables, meta: Meta, out: Outcome) -> None:
    """Land every task this record finished in its parent's barrier (rules 2-3), and cascade
    the end of a workflow to its open children (rule 4). Landing may finish more tasks (the
    siblings fail_fast cancels): they are settled in the same pass."""
    actions = out.actions
    i = 0
    while i < len(actions):
        action = actions[i]
        i += 1
        if not isinstance(action, TaskFinished):
            continue
        task = tables.task(action.task_id)
        if task is None:
            continue
        link = tables.child_link(task.task_id)
        if link is not None:
            _land(tables, task, link, meta, out)
        if task.attempt > 1:  # only a task that ended an attempt can have fanned out
            _cascade(tables, task, meta, out)


def _land(tables: Tables, child: Task, link: ChildLink, meta: Meta, out: Outcome) -> None:
    parent_id, identity, index = link.parent_id, link.identity, link.index
    barrier = tables.barrier(parent_id, identity)
    if barrier is None or tables.child_result(parent_id, identity, index) is not None:
        return  # gone, or landed already
    failed = child.status != TaskStatus.SUCCEEDED
    tables.put_child_result(
        parent_id,
        identity,
        index,
        ChildResult(
            task_id=child.task_id,
            status=child.status.value,
            result=None if failed else child.result,
            error_class=child.error_class if failed else None,
            error_message=child.error_message if failed else None,
        ),
    )
    n = index % STRIPES
    left = tables.stripe(parent_id, identity, n) - 1
    tables.put_stripe(parent_id, identity, n, max(0, left))
    if left == 0:
        barrier = dataclasses.replace(barrier, stripes_open=barrier.stripes_open - 1)
    if barrier.fired:
        if left == 0:
            tables.put_barrier(parent_id, barrier)
        return
    if failed and barrier.mode == ParallelMode.FAIL_FAST:
        tables.put_barrier(parent_id, dataclasses.replace(barrier, fired=True))
        _fire(tables, parent_id, barrier, _failure_value(index, child), meta, out)
        reason = f"a sibling ({child.task_id}) ended {child.status.value} (fail_fast)"
        _cancel_open(tables, parent_id, barrier, reason, meta, out)
    elif barrier.stripes_open == 0:
        tables.put_barrier(parent_id, dataclasses.replace(barrier, fired=True))
        _fire(tables, parent_id, barrier, _results_value(tables, parent_id, identity), meta, out)
    elif left == 0:
        tables.put_barrier(parent_id, barrier)


def _fire(
    tables: Tables, parent_id: str, barrier: Barrier, value: bytes, meta: Meta, out: Outcome
) -> None:
    """Commit the parallel step and wake its workflow (rule 3), unless it ended already."""
    parent = tables.task(parent_id)
    if parent is None or parent.status != TaskStatus.WAITING:
        return
    totals = tables.step_totals(parent_id)
    if totals.bytes + len(value) > STEPS_BYTES_MAX:
        finish(
            tables,
            parent,
            TaskStatus.FAILED,
            meta,
            out,
            error_class="StepTooLarge",
            error_message=(
                f"parallel step {barrier.identity!r}: the children's results exceed the task's "
                f"step bytes limit: {totals.bytes + len(value)} > {STEPS_BYTES_MAX}; "
                "have children store big results elsewhere and return a handle"
            ),
        )
        return
    tables.put_step_totals(
        parent_id, StepTotals(count=totals.count + 1, bytes=totals.bytes + len(value))
    )
    row = StepRow(identity=barrier.identity, position=barrier.position, claims=1, value=value)
    put_step(tables, parent, row, meta, out)
    wake(tables, parent, meta, out)


def wake(tables: Tables, parent: Task, meta: Meta, out: Outcome) -> None:
    """WAITING -> ENQUEUED: the step the workflow waited in is committed."""
    move(parent, TaskStatus.ENQUEUED)
    make_ready(tables, parent, meta, spare_index(out))
    touch(parent, meta)
    tables.put_task(parent)
    emit(out, EventKind.TaskRequeued, parent, meta)


def _results_value(tables: Tables, parent_id: str, identity: str) -> bytes:
    """``{"results": [...], "errors": {"<index>": {...}}}``: each child's stored result (compact
    JSON) in child order, null where the child did not succeed; the errors name how it ended."""
    values: list[bytes] = []
    errors: dict[str, dict[str, str | None]] = {}
    for index, row in tables.child_results(parent_id, identity):
        if row.status == TaskStatus.SUCCEEDED:
            values.append(row.result if row.result else b"null")
        else:
            values.append(b"null")
            errors[str(index)] = _error(row.task_id, row.status, row.error_class, row.error_message)
    tail = json.dumps(errors, separators=(",", ":")).encode()
    return b'{"results":[' + b",".join(values) + b'],"errors":' + tail + b"}"


def _failure_value(index: int, child: Task) -> bytes:
    failure = _error(child.task_id, child.status.value, child.error_class, child.error_message)
    return json.dumps({"failed": {"index": index, **failure}}, separators=(",", ":")).encode()


def _error(
    task_id: str, status: str, error_class: str | None, message: str | None
) -> dict[str, str | None]:
    return {"task_id": task_id, "status": status, "error_class": error_class, "message": message}


def _cancel_open(
    tables: Tables, parent_id: str, barrier: Barrier, reason: str, meta: Meta, out: Outcome
) -> None:
    """Cancel every child of ``barrier`` that has not ended (rules 3 and 4)."""
    for index in range(barrier.total):
        if tables.child_result(parent_id, barrier.identity, index) is not None:
            continue
        child = tables.task(child_id(parent_id, barrier.identity, index))
        if child is not None and child.status not in TERMINAL:
            stop_task(tables, child, reason, meta, out)


def _cascade(tables: Tables, task: Task, meta: Meta, out: Outcome) -> None:
    for barrier in tables.barriers(task.task_id):
        if not barrier.fired:
            reason = f"the workflow {task.task_id} ended {task.status.value}"
            _cancel_open(tables, task.task_id, barrier, reason, meta, out)
    wait = tables.event_wait(task.task_id)
    if wait is not None:  # its pending timer goes with it
        end_wait(tables, task.task_id, wait)


def event_timer(task_id: str, wait: EventWait) -> TimerRef | None:
    if wait.deadline_ms is None:
        return None
    return TimerRef(
        fire_at_ms=wait.deadline_ms, task_id=task_id, kind=TimerKind.EVENT_TIMEOUT, token=wait.token
    )


def end_wait(tables: Tables, task_id: str, wait: EventWait) -> None:
    """Drop a ``ctx.wait_for_event`` and its timeout timer."""
    tables.put_event_wait(task_id, None)
    timer = event_timer(task_id, wait)
    if timer is not None:
        tables.remove_timer(timer)
