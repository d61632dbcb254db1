"""Workflows: the FAN_OUT outcome of ``ctx.parallel`` and the fan-in of its children.

Rule 1 (fan-out): a FAN_OUT outcome, in the batch that applies it, enqueues the children on the
parent's partition (the first SPILL_AFTER; the rest spill: rule 7), links each to its barrier
slot, creates the barrier, ends the lease and moves the parent LEASED -> WAITING. Child ids
are derived from (parent id, step identity, child index), so a replayed or resent fan-out meets
its own children and never duplicates one.
Rule 2 (striped fan-in): each child that reaches a terminal state lands once in its slot (a
slot that already holds a result ignores it) and counts down stripe ``index % STRIPES``; only
a stripe reaching zero touches the barrier row, so a 10,000-way fan-in rewrites that row at
most STRIPES times.
Rule 3 (fires once): the barrier fires when its last stripe closes (collect) or at the first
child that ends FAILED, CANCELED or EXPIRED (fail_fast). Firing commits the parallel step
(its results in child order, or the failure) and moves the parent WAITING -> ENQUEUED; the
``fired`` flag, written in the same batch, makes every later landing a no-op. fail_fast then
cancels the siblings still running (their landings change nothing but their slots).
Rule 4 (cascade): a workflow that ends while a barrier is open (canceled, expired) or begins
compensating (``lifecycle.begin_compensation``) cancels every child of that barrier that has
not ended.
Rule 5 (no I/O): like every handler, only the tables; the slots of a fired barrier stay for
``GET /v1/workflows/{id}``.
Rule 6 (events): ``ctx.wait_for_event`` parks a workflow in WAITING too (handlers/events.py);
a workflow that ends while waiting drops its wait and its timeout timer here.
Rule 7 (spill): children with index < SPILL_AFTER live on the parent's partition; the rest,
on a node of several partitions, go round-robin to the other partitions (``child_partition``),
their ids derived as before but with the target's four hex digits. The barrier, its stripes
and its slots stay on the parent's partition. The fan-out writes, in its own batch, one
EnqueueChildren message per run of spilled children of a partition (``machine/messages.py``:
runs of MESSAGE_ITEMS_MAX children or MESSAGE_BYTES_MAX bytes); the receiving partition
enqueues each child with its link back to the slot (``handlers/spill.py``), skipping an id it
holds already.
Rule 8 (remote landing): a spilled child that ends writes a ChildDone (in a LandChildren
message) to the parent's partition, which lands it exactly like a local child (rules 2-3); a
resent ChildDone meets a filled slot and changes nothing. Cancels of rules 3 and 4 reach
spilled children as CancelTasks messages to their partitions, sent after (so applied after)
the EnqueueChildren that created them; canceling a child that ended changes nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import defaultdict

from conveyor.errors import InvariantError
from conveyor.schemas import codec
from conveyor.schemas.steps import PARALLEL_CHILDREN_MAX, STEPS_BYTES_MAX
from conveyor.schemas.types import (
    TERMINAL,
    Barrier,
    CancelTasks,
    ChildDone,
    ChildLink,
    ChildResult,
    Completion,
    EnqueueChildren,
    EventKind,
    EventWait,
    FanOut,
    LandChildren,
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
from conveyor.streams.machine.messages import chunks, send
from conveyor.streams.machine.outcome import Meta, Outcome, TaskFinished
from conveyor.streams.machine.transitions import move

STRIPES = 16
SPILL_AFTER = 1_000  # children of one parallel step kept on the parent's partition (rule 7)


def child_partition(home: int, index: int, partitions: int) -> int:
    """The partition of child ``index`` of a workflow on partition ``home`` (rule 7)."""
    if index < SPILL_AFTER or partitions < 2:
        return home
    return (home + 1 + (index - SPILL_AFTER) % (partitions - 1)) % partitions


def child_id(parent_id: str, identity: str, index: int, partitions: int = 1) -> str:
    """The id of child ``index`` of a parallel step, the same however often the fan-out is
    applied: its first four hex digits name ``child_partition`` of the parent's partition on a
    node of ``partitions`` partitions (the parent's own digits for the first SPILL_AFTER)."""
    digest = hashlib.blake2b(f"{parent_id}/{identity}/{index}".encode(), digest_size=14)
    home = _partition(parent_id, partitions)
    if home is None:
        return parent_id[:4] + digest.hexdigest()
    return f"{child_partition(home, index, partitions):04x}" + digest.hexdigest()


def spilled(parent_id: str, child: str) -> bool:
    """Whether a child lives on another partition than its parent (rule 7)."""
    return child[:4] != parent_id[:4]


def _partition(task_id: str, partitions: int) -> int | None:
    """The partition a task id names, or None (one partition, or not a routable id)."""
    try:
        home = int(task_id[:4], 16)
    except ValueError:
        return None
    return home if partitions > 1 and home < partitions else None


# -- fan-out -------------------------------------------------------------------------------


WAIT_EXPIRED = "schedule_to_close passed before the workflow could wait"


def fan_out_attempt(tables: Tables, task: Task, item: Completion, meta: Meta, out: Outcome) -> None:
    """A LEASED attempt ended in ``ctx.parallel`` (rule 1)."""
    fan = item.fan_out
    specs = (
        _child_specs(task, fan, meta.partitions)
        if fan is not None
        else "a FAN_OUT outcome without its step"
    )
    if isinstance(specs, str):
        attempt_failed(
            tables, task, meta, out, error_class="BadFanOut", error_message=specs, fatal=True
        )
        return
    if fan is None:
        raise InvariantError(f"task {task.task_id}: a fan-out step with no fan-out")
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


def _child_specs(task: Task, fan: FanOut, partitions: int) -> list[TaskSpec] | str:
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
            task_id=child_id(task.task_id, fan.identity, index, partitions),
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
    """Create the barrier, link and enqueue the local children, and send the spilled ones to
    their partitions (rule 7)."""
    counts = [0] * STRIPES
    away: dict[int, list[tuple[int, bytes]]] = defaultdict(list)
    for index, spec in enumerate(specs):
        counts[index % STRIPES] += 1
        raw = codec.TASK_SPEC.encode(spec)
        if spilled(task.task_id, spec.task_id):
            away[int(spec.task_id[:4], 16)].append((index, raw))
            continue
        tables.put_child_link(
            spec.task_id, ChildLink(parent_id=task.task_id, identity=fan.identity, index=index)
        )
        enqueue_one(tables, raw, meta, out, spare_index(out))
    for partition, children in sorted(away.items()):
        for chunk in chunks(children, lambda child: len(child[1])):
            message = EnqueueChildren(
                parent_id=task.task_id,
                identity=fan.identity,
                indexes=[index for index, _ in chunk],
                tasks=[raw for _, raw in chunk],
            )
            send(tables, meta, out, partition, message, task.task_id)
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
    away: dict[int, list[ChildDone]] = defaultdict(list)
    for task_id in out.compensating:  # canceled, ending after its compensations: cascade now
        compensating = tables.task(task_id)
        if compensating is not None:
            _cascade(tables, compensating, meta, out)
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
            row = _result_row(task)
            home = _partition(link.parent_id, meta.partitions)
            if home is not None and spilled(link.parent_id, task.task_id):
                away[home].append(_done(link, row))  # rule 8
            else:
                land(tables, link.parent_id, link.identity, link.index, row, meta, out)
        if task.attempt > 1:  # only a task that ended an attempt can have fanned out
            _cascade(tables, task, meta, out)
    for partition, items in sorted(away.items()):
        for chunk in chunks(items, _done_bytes):
            send(tables, meta, out, partition, LandChildren(items=chunk), chunk[0].parent_id)


def _result_row(child: Task) -> ChildResult:
    failed = child.status != TaskStatus.SUCCEEDED
    return ChildResult(
        task_id=child.task_id,
        status=child.status.value,
        result=None if failed else child.result,
        error_class=child.error_class if failed else None,
        error_message=child.error_message if failed else None,
    )


def _done_bytes(done: ChildDone) -> int:
    return len(done.result or b"") + len(done.error_message or "") + 200


def _done(link: ChildLink, row: ChildResult) -> ChildDone:
    return ChildDone(
        child_id=row.task_id,
        parent_id=link.parent_id,
        identity=link.identity,
        index=link.index,
        status=row.status,
        result=row.result,
        error_class=row.error_class,
        error_message=row.error_message,
    )


def land(
    tables: Tables,
    parent_id: str,
    identity: str,
    index: int,
    row: ChildResult,
    meta: Meta,
    out: Outcome,
) -> None:
    """Child ``index`` ended as ``row`` says: fill its slot once (rules 2-3, 8)."""
    barrier = tables.barrier(parent_id, identity)
    if barrier is None or not 0 <= index < barrier.total:
        return  # gone (or a slot it never had)
    if tables.child_result(parent_id, identity, index) is not None:
        return  # landed already
    failed = row.status != TaskStatus.SUCCEEDED
    tables.put_child_result(parent_id, identity, index, row)
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
        _fire(tables, parent_id, barrier, _failure_value(index, row), meta, out)
        reason = f"a sibling ({row.task_id}) ended {row.status} (fail_fast)"
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


def _failure_value(index: int, row: ChildResult) -> bytes:
    failure = _error(row.task_id, row.status, row.error_class, row.error_message)
    return json.dumps({"failed": {"index": index, **failure}}, separators=(",", ":")).encode()


def _error(
    task_id: str, status: str, error_class: str | None, message: str | None
) -> dict[str, str | None]:
    return {"task_id": task_id, "status": status, "error_class": error_class, "message": message}


def _cancel_open(
    tables: Tables, parent_id: str, barrier: Barrier, reason: str, meta: Meta, out: Outcome
) -> None:
    """Cancel every child of ``barrier`` that has not ended (rules 3 and 4); the spilled ones
    that have not landed by CancelTasks messages to their partitions (rule 8)."""
    away: dict[int, list[str]] = defaultdict(list)
    for index in range(barrier.total):
        if tables.child_result(parent_id, barrier.identity, index) is not None:
            continue
        task_id = child_id(parent_id, barrier.identity, index, meta.partitions)
        if spilled(parent_id, task_id):
            away[int(task_id[:4], 16)].append(task_id)
            continue
        child = tables.task(task_id)
        if child is not None and child.status not in TERMINAL:
            stop_task(tables, child, reason, meta, out)
    parent = tables.task(parent_id)
    if parent is None:
        return
    for partition, ids in sorted(away.items()):
        for chunk in chunks(ids, len):
            message = CancelTasks(tenant=parent.tenant, task_ids=chunk, reason=reason)
            send(tables, meta, out, partition, message, parent_id)


def _cascade(tables: Tables, task: Task, meta: Meta, out: Outcome) -> None:
    for barrier in tables.barriers(task.task_id):
        if not barrier.fired:
            ended = "was canceled" if task.compensating else f"ended {task.status.value}"
            reason = f"the workflow {task.task_id} {ended}"
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
