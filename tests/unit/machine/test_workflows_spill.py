"""Fan-outs that spill across partitions (``handlers/workflows.py`` rules 7-8,
``handlers/spill.py``): one Harness per partition, and a unit-level shipper that moves the
message rows the machine wrote to the harness of their partition, as the leader's
``MessageShipper`` does (optionally without deleting them: a resend)."""

from __future__ import annotations

import json

from conveyor.schemas import codec
from conveyor.schemas.types import (
    CancelTasks,
    ChildDone,
    Completion,
    EnqueueChildren,
    LandChildren,
    Outcome,
    ParallelMode,
    Record,
    TaskStatus,
)
from conveyor.store import keys
from conveyor.streams.machine.handlers.workflows import SPILL_AFTER, child_id, child_partition
from conveyor.streams.machine.messages import MESSAGE_BYTES_MAX, MESSAGE_ITEMS_MAX, chunks

from .harness import Harness, grants
from .test_workflows import fan_out, requeued, workflow


def cluster(partitions: int) -> list[Harness]:
    return [Harness(partition=p, partitions=partitions) for p in range(partitions)]


def messages(h: Harness) -> list[tuple[int, Record]]:
    """The message rows ``h`` holds, in row order: (target partition, record)."""
    found = []
    for _, value in h.kv.scan(keys.MESSAGES):
        target, data = keys.parse_message_value(value)
        found.append((target, codec.decode_body(codec.decode_envelope(data))))
    return found


def ship(hs: list[Harness], *, delete: bool = True) -> int:
    """Apply every message row of every partition on its target; how many were shipped."""
    shipped = 0
    for h in hs:
        rows = list(h.kv.scan(keys.MESSAGES))
        for _, value in rows:
            target, data = keys.parse_message_value(value)
            hs[target].apply(codec.decode_body(codec.decode_envelope(data)))
            shipped += 1
        if delete:
            h.kv.write({key: None for key, _ in rows})
    return shipped


def ship_all(hs: list[Harness]) -> None:
    while ship(hs):
        pass


def ids_of(parent_id: str, n: int, partitions: int) -> list[str]:
    return [child_id(parent_id, "fan#0", i, partitions) for i in range(n)]


def run_ready(h: Harness, *, fail: set[str] = frozenset()) -> None:  # type: ignore[assignment]
    """Lease every ready child of ``h`` and end it: the result is its index (from its
    payload), or a fatal error for the ids in ``fail``."""
    for grant in grants(h.grant(100_000, tenants=["t1"])):
        spec = h.committed().spec(grant.task_id)
        assert spec is not None
        if grant.task_id in fail:
            h.fatal(grant.task_id, grant.lease_id, "Boom", "broke")
        else:
            h.complete(grant.task_id, grant.lease_id, result=spec.payload)


def test_children_past_the_first_thousand_go_round_robin_to_the_other_partitions() -> None:
    assert [child_partition(1, i, 4) for i in (0, 999, 1000, 1001, 1002, 1003)] == [
        1,
        1,
        2,
        3,
        0,
        2,
    ]
    assert child_partition(0, 5_000, 1) == 0  # one partition: nothing spills
    parent = "0001" + "0" * 28
    assert child_id(parent, "fan#0", 1_500) == child_id(parent, "fan#0", 1_500, 1)
    assert child_id(parent, "fan#0", 10, 4)[:4] == "0001"
    spilled_id = child_id(parent, "fan#0", 1_000, 4)
    assert spilled_id[:4] == "0002" and spilled_id[4:] == child_id(parent, "fan#0", 1_000)[4:]


def test_a_fan_out_of_2500_enqueues_1000_here_and_writes_messages_for_the_rest() -> None:
    hs = cluster(4)
    h = hs[0]
    parent_id, lease = workflow(h)
    out = fan_out(h, parent_id, lease, 2_500)
    ids = ids_of(parent_id, 2_500, 4)
    assert h.ready_ids() == ids[:SPILL_AFTER]  # the local ones, in child order
    assert sum(1 for e in out.events if e.kind == "TaskEnqueued") == SPILL_AFTER
    sent = messages(h)
    assert all(isinstance(r, EnqueueChildren) for _, r in sent)
    by_target: dict[int, list[int]] = {}
    for target, record in sent:
        assert isinstance(record, EnqueueChildren)
        assert record.parent_id == parent_id and record.identity == "fan#0"
        assert len(record.tasks) == len(record.indexes) <= MESSAGE_ITEMS_MAX
        for index, raw in zip(record.indexes, record.tasks, strict=True):
            assert codec.TASK_SPEC.decode(raw).task_id == ids[index]
            assert ids[index][:4] == f"{target:04x}"
        by_target.setdefault(target, []).extend(record.indexes)
    assert sorted(by_target) == [1, 2, 3]  # every other partition, none on the parent's
    assert {t: len(ix) for t, ix in by_target.items()} == {1: 500, 2: 500, 3: 500}
    assert sorted(i for ix in by_target.values() for i in ix) == list(range(1_000, 2_500))
    assert [t for t, _ in sent] == [1, 1, 2, 2, 3, 3]  # 256 + 244 each
    barrier = h.committed().barrier(parent_id, "fan#0")
    assert barrier is not None and barrier.total == 2_500 and not barrier.fired
    # nothing left the parent's partition but rows of its own batch
    assert all(not hs[p].kv.data for p in (1, 2, 3))


def test_spilled_children_run_on_their_partitions_and_land_once_in_child_order() -> None:
    hs = cluster(3)
    parent_id, lease = workflow(hs[0])
    n = SPILL_AFTER + 200
    fan_out(hs[0], parent_id, lease, n)
    ship_all(hs)
    ids = ids_of(parent_id, n, 3)
    for p in (1, 2):
        assert len(hs[p].ready_ids()) == 100
        link = hs[p].committed().child_link(ids[SPILL_AFTER + p - 1])
        assert link is not None and (link.parent_id, link.index) == (parent_id, SPILL_AFTER + p - 1)
    run_ready(hs[1])
    run_ready(hs[2])
    assert hs[0].task(parent_id).status == TaskStatus.WAITING  # the landings are in flight
    run_ready(hs[0])
    assert hs[0].task(parent_id).status == TaskStatus.WAITING
    ship_all(hs)
    assert hs[0].task(parent_id).status == TaskStatus.ENQUEUED
    assert requeued(hs[0], parent_id) == 1
    row = hs[0].committed().step(parent_id, "fan#0")
    assert row is not None and row.value is not None
    assert json.loads(row.value) == {"results": list(range(n)), "errors": {}}


def test_a_resent_message_changes_nothing() -> None:
    hs = cluster(2)
    parent_id, lease = workflow(hs[0])
    n = SPILL_AFTER + 10
    fan_out(hs[0], parent_id, lease, n)
    ship(hs, delete=False)
    once = hs[1].dump(applied=False, outbox=False)
    ship(hs)  # the same EnqueueChildren again: every child exists
    assert hs[1].dump(applied=False, outbox=False) == once
    assert len(hs[1].ready_ids()) == 10
    run_ready(hs[0])
    run_ready(hs[1])
    ship(hs, delete=False)  # the LandChildren: the barrier fires
    assert hs[0].task(parent_id).status == TaskStatus.ENQUEUED
    fired = hs[0].dump(applied=False, outbox=False)
    assert ship(hs) == 10  # resent (one per completion record): every slot is filled
    assert hs[0].dump(applied=False, outbox=False) == fired
    assert requeued(hs[0], parent_id) == 1


def test_a_forged_or_misrouted_landing_is_ignored() -> None:
    hs = cluster(2)
    parent_id, lease = workflow(hs[0])
    fan_out(hs[0], parent_id, lease, SPILL_AFTER + 1)
    ship_all(hs)
    before = hs[0].dump(applied=False, outbox=False)
    real = child_id(parent_id, "fan#0", SPILL_AFTER, 2)
    wrong_slot = ChildDone(
        child_id=real, parent_id=parent_id, identity="fan#0", index=3, status="SUCCEEDED"
    )
    not_ended = ChildDone(
        child_id=real, parent_id=parent_id, identity="fan#0", index=SPILL_AFTER, status="LEASED"
    )
    hs[0].apply(LandChildren(items=[wrong_slot, not_ended]))
    assert hs[0].dump(applied=False, outbox=False) == before


def test_fail_fast_cancels_the_spilled_siblings_and_their_landings_change_nothing() -> None:
    hs = cluster(2)
    parent_id, lease = workflow(hs[0])
    n = SPILL_AFTER + 20
    fan_out(hs[0], parent_id, lease, n, ParallelMode.FAIL_FAST)
    ship_all(hs)
    ids = ids_of(parent_id, n, 2)
    leases = {g.task_id: g.lease_id for g in grants(hs[0].grant(1, tenants=["t1"]))}
    running = {g.task_id: g.lease_id for g in grants(hs[1].grant(5, tenants=["t1"]))}
    hs[0].fatal(ids[0], leases[ids[0]], "Boom", "bad input")
    assert hs[0].task(parent_id).status == TaskStatus.ENQUEUED
    sent = messages(hs[0])
    assert [t for t, _ in sent] == [1]
    (cancel,) = (r for _, r in sent)
    assert isinstance(cancel, CancelTasks) and cancel.tenant == "t1"
    assert cancel.task_ids == ids[SPILL_AFTER:]
    ship(hs)
    statuses = [hs[1].task(i).status for i in ids[SPILL_AFTER:]]
    assert statuses.count(TaskStatus.CANCELED) == 15  # the waiting ones at once
    assert all(hs[1].task(i).cancel_cause == "CANCEL" for i in running)  # asked to stop
    for task_id, lease_id in running.items():
        hs[1].canceled(task_id, lease_id)
    step = hs[0].committed().step(parent_id, "fan#0")
    ship_all(hs)
    assert hs[0].committed().step(parent_id, "fan#0") == step
    assert requeued(hs[0], parent_id) == 1
    for i in ids[SPILL_AFTER:]:
        slot = hs[0].committed().child_result(parent_id, "fan#0", ids.index(i))
        assert slot is not None and slot.status == "CANCELED"


def test_canceling_the_workflow_cascades_to_spilled_children_not_yet_enqueued() -> None:
    hs = cluster(3)
    parent_id, lease = workflow(hs[0])
    n = SPILL_AFTER + 30
    fan_out(hs[0], parent_id, lease, n)
    hs[0].cancel(parent_id)  # before any message was shipped
    assert hs[0].task(parent_id).status == TaskStatus.CANCELED
    kinds = [type(r).__name__ for _, r in messages(hs[0])]
    assert kinds == ["EnqueueChildren"] * 2 + ["CancelTasks"] * 2  # enqueue first, per target
    ship_all(hs)
    ids = ids_of(parent_id, n, 3)
    assert all(hs[0].task(i).status == TaskStatus.CANCELED for i in ids[:SPILL_AFTER])
    for i in ids[SPILL_AFTER:]:
        assert hs[int(i[:4], 16)].task(i).status == TaskStatus.CANCELED
    assert hs[1].ready_ids() == [] and hs[2].ready_ids() == []


def test_messages_are_cut_by_item_count_and_by_bytes() -> None:
    assert [len(c) for c in chunks(list(range(600)), lambda _: 1)] == [256, 256, 88]
    big = MESSAGE_BYTES_MAX // 3 + 1
    assert [len(c) for c in chunks([b"x"] * 7, lambda _: big)] == [2, 2, 2, 1]
    assert list(
        chunks([b"huge", b"a"], lambda b: MESSAGE_BYTES_MAX * 2 if b == b"huge" else 1)
    ) == [
        [b"huge"],
        [b"a"],
    ]
    assert list(chunks([], len)) == []


def test_big_child_results_travel_in_several_landings() -> None:
    hs = cluster(2)
    parent_id, lease = workflow(hs[0])
    n = SPILL_AFTER + 12
    fan_out(hs[0], parent_id, lease, n)
    ship_all(hs)
    result = json.dumps("x" * (MESSAGE_BYTES_MAX // 5)).encode()
    granted = grants(hs[1].grant(100, tenants=["t1"]))
    hs[1].report(
        *(
            Completion(
                task_id=g.task_id, lease_id=g.lease_id, outcome=Outcome.SUCCEEDED, result=result
            )
            for g in granted
        )
    )
    sizes = [len(r.items) for _, r in messages(hs[1]) if isinstance(r, LandChildren)]
    assert sum(sizes) == 12 and max(sizes) <= 5  # one record finished 12 children
