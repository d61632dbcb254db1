"""The machine's workflow handlers: the FAN_OUT outcome of ``ctx.parallel``, the striped fan-in,
fail_fast, and cancel cascading from a workflow to its children."""

from __future__ import annotations

import json

from conveyor.schemas import codec
from conveyor.schemas.types import (
    TERMINAL,
    Completion,
    EventKind,
    FanOut,
    Outcome,
    ParallelMode,
    TaskSpec,
    TaskStatus,
)
from conveyor.store import keys
from conveyor.streams.machine import Outcome as MachineOutcome
from conveyor.streams.machine import Reply
from conveyor.streams.machine.handlers.workflows import STRIPES, child_id

from .harness import APP, Harness, actions_of, grants


def workflow(h: Harness, **spec: object) -> tuple[str, int]:
    parent = h.spec(task_type="flow", **spec)
    h.enqueue(parent)
    return parent.task_id, h.lease_one(parent.task_id).lease_id


def child_spec(n: int, **overrides: object) -> bytes:
    fields: dict[str, object] = {
        "task_id": "",
        "tenant": "",
        "app": "",
        "task_type": "child",
        "payload": json.dumps(n).encode(),
        "attempts_max": 1,
    }
    fields.update(overrides)
    return codec.TASK_SPEC.encode(TaskSpec(**fields))  # type: ignore[arg-type]


def fan_out(
    h: Harness,
    task_id: str,
    lease_id: int,
    n: int,
    mode: ParallelMode = ParallelMode.COLLECT,
    identity: str = "fan#0",
) -> MachineOutcome:
    step = FanOut(
        identity=identity, position=0, mode=mode, children=[child_spec(i) for i in range(n)]
    )
    return h.report(
        Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.FAN_OUT, fan_out=step)
    )


def children(parent_id: str, n: int, identity: str = "fan#0") -> list[str]:
    return [child_id(parent_id, identity, i) for i in range(n)]


def run_children(h: Harness, ids: list[str], *, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Lease every ready child and complete it (fatally for those in ``fail``)."""
    leases = {g.task_id: g.lease_id for g in grants(h.grant(len(ids), tenants=["t1"]))}
    for task_id in ids:
        if task_id in fail:
            h.fatal(task_id, leases[task_id], "Boom", f"{task_id} broke")
        else:
            h.complete(task_id, leases[task_id], result=json.dumps(task_id[-4:]).encode())


def requeued(h: Harness, task_id: str) -> int:
    return sum(
        1
        for a in h.history
        for e in a.outcome.events
        if e.task_id == task_id and e.kind == EventKind.TaskRequeued
    )


def test_fan_out_enqueues_derived_children_and_parks_the_parent_in_waiting() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    out = fan_out(h, parent_id, lease, 3)
    (reply,) = actions_of(out, Reply)
    assert reply.ok and reply.status == TaskStatus.WAITING
    parent = h.task(parent_id)
    assert parent.status == TaskStatus.WAITING
    assert parent.attempt == 2 and parent.budget_base == 1  # a fan-out spends no retry
    assert h.leased() == {} and h.timers_of(parent_id) == []
    ids = children(parent_id, 3)
    assert all(i[:4] == parent_id[:4] for i in ids)  # the parent's partition
    assert h.ready_ids() == ids  # in child order
    for i, task_id in enumerate(ids):
        child = h.task(task_id)
        assert (child.tenant, child.app, child.task_type) == ("t1", APP, "child")
        spec = h.committed().spec(task_id)
        assert spec is not None and spec.payload == json.dumps(i).encode()
    kinds = [e.kind for e in out.events]
    assert kinds.count(EventKind.TaskEnqueued) == 3 and EventKind.TaskWaiting in kinds


def test_collect_fires_once_with_results_in_child_order_and_errors_included() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    fan_out(h, parent_id, lease, 5)
    ids = children(parent_id, 5)
    run_children(h, list(reversed(ids)), fail={ids[1]})  # land in reverse order
    parent = h.task(parent_id)
    assert parent.status == TaskStatus.ENQUEUED and parent.ready_seq != 0
    assert requeued(h, parent_id) == 1
    row = h.committed().step(parent_id, "fan#0")
    assert row is not None and row.position == 0 and row.value is not None
    value = json.loads(row.value)
    assert value["results"] == [i[-4:] if i != ids[1] else None for i in ids]
    assert value["errors"] == {
        "1": {
            "task_id": ids[1],
            "status": "FAILED",
            "error_class": "Boom",
            "message": f"{ids[1]} broke",
        }
    }
    barrier = h.committed().barrier(parent_id, "fan#0")
    assert barrier is not None and barrier.fired and barrier.stripes_open == 0
    # the woken workflow is leased again, and its next attempt sees the committed step
    assert h.lease_one(parent_id).attempt == 2


def test_the_barrier_row_changes_only_when_a_stripe_closes() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    n = STRIPES * 3
    fan_out(h, parent_id, lease, n)
    ids = children(parent_id, n)
    key = keys.barrier(parent_id, "fan#0")
    writes = 0
    leases = {g.task_id: g.lease_id for g in grants(h.grant(n, tenants=["t1"]))}
    for task_id in ids:
        before = h.kv.get(key)
        h.complete(task_id, leases[task_id])
        writes += h.kv.get(key) != before
    # children 0..15 leave every stripe at 2, 16..31 at 1, 32..47 close them one by one
    assert writes == STRIPES
    assert h.task(parent_id).status == TaskStatus.ENQUEUED


def test_fail_fast_wakes_the_parent_with_the_failure_and_cancels_the_siblings() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    fan_out(h, parent_id, lease, 4, ParallelMode.FAIL_FAST)
    ids = children(parent_id, 4)
    leases = {g.task_id: g.lease_id for g in grants(h.grant(2, tenants=["t1"]))}
    assert set(leases) == set(ids[:2])
    h.complete(ids[0], leases[ids[0]])
    out = h.fatal(ids[1], leases[ids[1]], "Boom", "bad input")
    assert h.task(parent_id).status == TaskStatus.ENQUEUED
    row = h.committed().step(parent_id, "fan#0")
    assert row is not None and row.value is not None
    assert json.loads(row.value) == {
        "failed": {
            "index": 1,
            "task_id": ids[1],
            "status": "FAILED",
            "error_class": "Boom",
            "message": "bad input",
        }
    }
    assert [h.task(i).status for i in ids[2:]] == [TaskStatus.CANCELED] * 2
    assert {e.task_id for e in out.events if e.kind == EventKind.TaskCanceled} == set(ids[2:])
    assert requeued(h, parent_id) == 1


def test_fail_fast_asks_running_siblings_to_stop_and_their_end_changes_nothing() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    fan_out(h, parent_id, lease, 2, ParallelMode.FAIL_FAST)
    ids = children(parent_id, 2)
    leases = {g.task_id: g.lease_id for g in grants(h.grant(2, tenants=["t1"]))}
    h.fatal(ids[0], leases[ids[0]])
    assert h.task(ids[1]).cancel_cause == "CANCEL"
    step_before = h.committed().step(parent_id, "fan#0")
    h.canceled(ids[1], leases[ids[1]])
    assert h.task(ids[1]).status == TaskStatus.CANCELED
    assert h.committed().step(parent_id, "fan#0") == step_before
    assert requeued(h, parent_id) == 1 and h.task(parent_id).status == TaskStatus.ENQUEUED


def test_a_resent_or_stale_fan_out_is_refused_and_changes_nothing() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    fan_out(h, parent_id, lease, 3)
    before = h.dump(applied=False, outbox=False)
    (reply,) = actions_of(fan_out(h, parent_id, lease, 3), Reply)
    assert not reply.ok and reply.reason == "task is WAITING"
    assert h.dump(applied=False, outbox=False) == before


def test_a_child_that_ends_twice_lands_once() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    fan_out(h, parent_id, lease, 2)
    ids = children(parent_id, 2)
    leases = {g.task_id: g.lease_id for g in grants(h.grant(2, tenants=["t1"]))}
    h.complete(ids[0], leases[ids[0]])
    before = h.dump(applied=False, outbox=False)
    h.complete(ids[0], leases[ids[0]])  # a resent completion: refused by the lease fence
    h.cancel(ids[0])  # a cancel of a finished child: nothing to do
    assert h.dump(applied=False, outbox=False) == before
    assert h.task(parent_id).status == TaskStatus.WAITING


def test_cancel_of_a_waiting_workflow_cascades_to_its_children() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    fan_out(h, parent_id, lease, 3)
    ids = children(parent_id, 3)
    leases = {g.task_id: g.lease_id for g in grants(h.grant(1, tenants=["t1"]))}
    out = h.cancel(parent_id)
    assert h.task(parent_id).status == TaskStatus.CANCELED
    assert h.task(ids[0]).status == TaskStatus.LEASED and h.task(ids[0]).cancel_cause == "CANCEL"
    assert [h.task(i).status for i in ids[1:]] == [TaskStatus.CANCELED] * 2
    assert {e.task_id for e in out.events if e.kind == EventKind.TaskCanceled} == {
        parent_id,
        *ids[1:],
    }
    h.canceled(ids[0], leases[ids[0]])
    assert all(h.task(i).status in TERMINAL for i in ids)
    assert h.task(parent_id).status == TaskStatus.CANCELED  # never woken
    assert h.committed().step(parent_id, "fan#0") is None


def test_schedule_to_close_of_a_waiting_workflow_expires_it_and_its_children() -> None:
    h = Harness()
    parent_id, lease = workflow(h, schedule_to_close_ms=60_000)
    fan_out(h, parent_id, lease, 2)
    h.fire_due(h.now_ms + 60_000)
    assert h.task(parent_id).status == TaskStatus.EXPIRED
    assert [h.task(i).status for i in children(parent_id, 2)] == [TaskStatus.CANCELED] * 2
    assert h.timers() == []


def test_a_pending_cancel_ends_the_workflow_instead_of_fanning_out() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    h.cancel(parent_id)
    fan_out(h, parent_id, lease, 3)
    assert h.task(parent_id).status == TaskStatus.CANCELED
    assert all(h.tables.task(i) is None for i in children(parent_id, 3))


def test_a_bad_fan_out_fails_the_workflow_without_retries() -> None:
    for step in (
        FanOut(identity="fan#0", position=0, mode=ParallelMode.COLLECT, children=[]),
        FanOut(identity="fan#0", position=0, mode=ParallelMode.COLLECT, children=[b"\xff"]),
        FanOut(
            identity="fan#0",
            position=0,
            mode=ParallelMode.COLLECT,
            children=[child_spec(0, priority=999)],
        ),
    ):
        h = Harness()
        parent_id, lease = workflow(h, attempts_max=5)
        h.report(
            Completion(task_id=parent_id, lease_id=lease, outcome=Outcome.FAN_OUT, fan_out=step)
        )
        parent = h.task(parent_id)
        assert parent.status == TaskStatus.FAILED and parent.error_class == "BadFanOut"
        assert h.ready_ids() == []


def test_children_of_two_fan_outs_in_one_record_get_distinct_ready_slots() -> None:
    h = Harness()
    a = h.spec(task_type="flow")
    b = h.spec(task_type="flow")
    h.enqueue(a, b)
    leases = {g.task_id: g.lease_id for g in grants(h.grant(2, tenants=["t1"]))}
    items = [
        Completion(
            task_id=p,
            lease_id=leases[p],
            outcome=Outcome.FAN_OUT,
            fan_out=FanOut(
                identity="fan#0",
                position=0,
                mode=ParallelMode.COLLECT,
                children=[child_spec(i) for i in range(3)],
            ),
        )
        for p in (a.task_id, b.task_id)
    ]
    h.report(*items)
    assert h.ready_ids() == children(a.task_id, 3) + children(b.task_id, 3)


def test_results_over_the_step_bytes_limit_fail_the_workflow() -> None:
    h = Harness()
    parent_id, lease = workflow(h)
    n = 17  # 17 x 256 KiB > 4 MiB
    fan_out(h, parent_id, lease, n)
    leases = {g.task_id: g.lease_id for g in grants(h.grant(n, tenants=["t1"]))}
    big = json.dumps("x" * (256 * 1024 - 2)).encode()
    for task_id in children(parent_id, n):
        h.complete(task_id, leases[task_id], result=big)
    parent = h.task(parent_id)
    assert parent.status == TaskStatus.FAILED and parent.error_class == "StepTooLarge"
    assert "exceed the task's step bytes limit" in (parent.error_message or "")
    assert h.committed().step(parent_id, "fan#0") is None
    assert requeued(h, parent_id) == 0
