"""What the machine does for operators: a delayed enqueue says when it is due; PauseQueue
pauses and resumes dispatch from a tenant's queue."""

from __future__ import annotations

from conveyor.schemas.types import EventKind, PauseQueue, TaskStatus
from conveyor.store.tables import TaskCache
from conveyor.streams.machine import Reply

from .harness import APP, Harness, grants

S = 1_000


def test_a_delayed_enqueue_says_when_it_is_due_and_its_requeue_when_it_is() -> None:
    h = Harness()
    now, later = h.spec(), h.spec(run_at_ms=h.now_ms + 90 * 60 * S)
    (a,) = h.enqueue(now).events
    (b,) = h.enqueue(later).events
    assert (a.kind, a.run_at_ms) == (EventKind.TaskEnqueued, None)  # ready at once
    assert (b.kind, b.status, b.run_at_ms) == (EventKind.TaskEnqueued, "ENQUEUED", later.run_at_ms)
    assert h.ready_ids() == [now.task_id]
    (due,) = h.fire_due(later.run_at_ms).events
    assert (due.kind, due.task_id, due.ts_ms, due.run_at_ms) == (
        EventKind.TaskRequeued, later.task_id, later.run_at_ms, None
    )  # fmt: skip


def _pause(h: Harness, queue: str, *, paused: bool = True, tenant: str = "t1") -> Reply:
    (reply,) = h.apply(PauseQueue(tenant=tenant, queue=queue, paused=paused)).actions
    assert isinstance(reply, Reply)
    return reply


def test_a_paused_queue_is_not_dispatched_from_and_its_tasks_wait_enqueued() -> None:
    h = Harness()
    held = [h.spec(queue="reports") for _ in range(2)]
    other = h.spec(queue="emails")
    h.enqueue(*held, other)
    assert _pause(h, "reports") == Reply(offset=h.offset - 1, index=0, ok=True, task_id="reports")
    tables = h.committed()
    assert tables.paused_queues("t1") == {"reports"}
    assert tables.ready_types(APP, "t1") == {"job": 1}  # what the dispatcher deals slots for
    assert [g.task_id for g in grants(h.grant(5))] == [other.task_id]
    late = h.spec(queue="reports")
    (reply,) = h.enqueue(late).actions  # enqueues are still accepted
    assert isinstance(reply, Reply) and reply.ok and reply.created
    assert grants(h.grant(5)) == []
    assert [h.task(s.task_id).status for s in (*held, late)] == [TaskStatus.ENQUEUED] * 3
    assert set(h.ready_ids()) == {s.task_id for s in (*held, late)}  # still in their queues

    _pause(h, "reports", paused=False)
    assert h.committed().paused_queues("t1") == frozenset()
    assert [g.task_id for g in grants(h.grant(5))] == [s.task_id for s in (*held, late)]


def test_pausing_twice_or_resuming_a_running_queue_changes_nothing() -> None:
    h = Harness()
    h.enqueue(h.spec(queue="q"))
    _pause(h, "q")
    before = h.dump(applied=False)
    assert _pause(h, "q").ok
    assert h.dump(applied=False) == before
    _pause(h, "q", paused=False)
    after = h.dump(applied=False)
    assert _pause(h, "q", paused=False).ok
    assert h.dump(applied=False) == after


def test_a_pause_is_of_one_tenants_queue() -> None:
    h = Harness()
    mine, theirs = h.spec(queue="q"), h.spec(queue="q", tenant="t2")
    h.enqueue(mine, theirs)
    _pause(h, "q", tenant="t2")
    assert [g.task_id for g in grants(h.grant(5))] == [mine.task_id]
    assert h.committed().paused_queues("t1") == frozenset()


def test_a_pause_asked_for_named_queues_leaves_a_request_for_it_empty() -> None:
    """An agent polling only the paused queue gets nothing, one polling several gets the
    others' tasks; a paused queue with a task of another type does not block its types."""
    h = Harness()
    a, b = h.spec(queue="a"), h.spec(queue="b", task_type="other")
    h.enqueue(a, b)
    _pause(h, "a")
    assert grants(h.grant(5, queues=["a"])) == []
    assert [g.task_id for g in grants(h.grant(5, queues=["a", "b"]))] == [b.task_id]


def test_partitions_sharing_a_node_cache_each_read_their_own_pauses() -> None:
    """A node's partitions share one cache of decoded rows, which keeps each store's pauses:
    a pause applied on one partition is not read on another before it applies it there, and
    a resume is read at once after its commit (the cached set is dropped with it)."""
    cache = TaskCache()
    one, two = Harness(cache=cache), Harness(partition=1, cache=cache)
    here, there = one.spec(queue="q"), two.spec(queue="q")
    one.enqueue(here)
    two.enqueue(there)
    assert two.tables.paused_queues("t1") == frozenset()  # now in the shared cache
    _pause(one, "q")
    assert one.tables.paused_queues("t1") == {"q"}
    assert two.tables.paused_queues("t1") == frozenset()
    assert [g.task_id for g in grants(two.grant(1))] == [there.task_id]
    assert grants(one.grant(1)) == []
    _pause(one, "q", paused=False)
    assert [g.task_id for g in grants(one.grant(1))] == [here.task_id]
