"""The machine's event handlers: the WAIT_EVENT outcome of ``ctx.wait_for_event``, SendEvents,
the EVENT_TIMEOUT timer, and what cancel does to a waiting workflow."""

from __future__ import annotations

import json

from conveyor.schemas.types import (
    Completion,
    EventKind,
    Outcome,
    SendEvents,
    TaskStatus,
    TimerKind,
    WaitStep,
    WorkflowEvent,
)
from conveyor.streams.machine import Outcome as MachineOutcome
from conveyor.streams.machine import Reply

from .harness import Harness, actions_of

STEP = "event:approved#0"


def workflow(h: Harness, **spec: object) -> tuple[str, int]:
    parent = h.spec(task_type="flow", **spec)
    h.enqueue(parent)
    return parent.task_id, h.lease_one(parent.task_id).lease_id


def wait(
    h: Harness, task_id: str, lease_id: int, name: str = "approved", timeout_ms: int | None = None
) -> MachineOutcome:
    step = WaitStep(identity=f"event:{name}#0", position=0, name=name, timeout_ms=timeout_ms)
    return h.report(
        Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.WAIT_EVENT, wait=step)
    )


def send(
    h: Harness, task_id: str, name: str = "approved", payload: object = None, tenant: str = "t1"
) -> Reply:
    item = WorkflowEvent(task_id=task_id, name=name, payload=json.dumps(payload).encode())
    (reply,) = actions_of(h.apply(SendEvents(tenant=tenant, items=[item])), Reply)
    return reply


def committed(h: Harness, task_id: str, identity: str = STEP) -> object:
    row = h.committed().step(task_id, identity)
    return None if row is None or row.value is None else json.loads(row.value)


def test_a_wait_parks_the_workflow_and_the_event_wakes_it_with_its_payload() -> None:
    h = Harness()
    task_id, lease = workflow(h)
    out = wait(h, task_id, lease)
    assert h.task(task_id).status == TaskStatus.WAITING and h.leased() == {}
    assert EventKind.TaskWaiting in [e.kind for e in out.events]
    reply = send(h, task_id, payload={"by": "ann"})
    assert reply.ok and reply.status == TaskStatus.ENQUEUED
    assert committed(h, task_id) == {"payload": {"by": "ann"}}
    assert h.committed().event_wait(task_id) is None
    assert h.lease_one(task_id).attempt == 2  # the next attempt sees the committed step


def test_an_event_that_comes_first_is_kept_for_the_wait() -> None:
    h = Harness()
    task_id, lease = workflow(h)
    assert send(h, task_id, payload=1).ok and send(h, task_id, payload=2).ok
    assert h.task(task_id).status == TaskStatus.LEASED  # running: kept, not delivered
    wait(h, task_id, lease)
    assert h.task(task_id).status == TaskStatus.ENQUEUED  # woken at once by the oldest
    assert committed(h, task_id) == {"payload": 1}
    kept = list(h.committed().kept_events(task_id, "approved"))
    assert [json.loads(payload) for _, payload in kept] == [2]


def test_an_event_of_another_name_does_not_wake_the_wait() -> None:
    h = Harness()
    task_id, lease = workflow(h)
    wait(h, task_id, lease)
    assert send(h, task_id, name="rejected").ok
    assert h.task(task_id).status == TaskStatus.WAITING
    assert committed(h, task_id) is None


def test_the_timeout_wakes_the_workflow_with_a_timeout_once() -> None:
    h = Harness()
    task_id, lease = workflow(h)
    wait(h, task_id, lease, timeout_ms=60_000)
    (timer,) = h.timers_of(task_id)
    assert timer.kind == TimerKind.EVENT_TIMEOUT
    h.fire_due(h.now_ms + 60_000)
    assert h.task(task_id).status == TaskStatus.ENQUEUED
    assert committed(h, task_id) == {"timeout": True}
    before = h.dump(applied=False, outbox=False)
    h.fire([timer])  # a stale copy of the timer
    assert h.dump(applied=False, outbox=False) == before
    # an event after the timeout is kept, and never rewrites the committed step
    assert send(h, task_id, payload="late").ok
    assert committed(h, task_id) == {"timeout": True}


def test_an_event_before_the_timeout_disarms_the_timer() -> None:
    h = Harness()
    task_id, lease = workflow(h)
    wait(h, task_id, lease, timeout_ms=60_000)
    send(h, task_id, payload="yes")
    assert h.timers_of(task_id) == []
    h.fire_due(h.now_ms + 120_000)
    assert committed(h, task_id) == {"payload": "yes"}


def test_events_for_finished_unknown_or_foreign_workflows_are_refused() -> None:
    h = Harness()
    task_id, lease = workflow(h)
    h.complete(task_id, lease)
    before = h.dump(applied=False, outbox=False)
    assert send(h, task_id).reason == "workflow is SUCCEEDED"
    assert send(h, h.new_id()).reason == "unknown task"
    assert h.dump(applied=False, outbox=False) == before
    other, _ = workflow(h)
    before = h.dump(applied=False, outbox=False)
    assert send(h, other, tenant="t2").reason == "unknown task"
    assert h.dump(applied=False, outbox=False) == before


def test_cancel_of_a_waiting_workflow_drops_its_wait_and_timer() -> None:
    h = Harness()
    task_id, lease = workflow(h)
    wait(h, task_id, lease, timeout_ms=60_000)
    h.cancel(task_id)
    assert h.task(task_id).status == TaskStatus.CANCELED
    assert h.timers_of(task_id) == [] and h.committed().event_wait(task_id) is None
    assert send(h, task_id).reason == "workflow is CANCELED"


def test_a_stale_wait_is_refused_and_changes_nothing() -> None:
    h = Harness()
    task_id, lease = workflow(h)
    wait(h, task_id, lease)
    before = h.dump(applied=False, outbox=False)
    (reply,) = actions_of(wait(h, task_id, lease), Reply)
    assert not reply.ok and reply.reason == "task is WAITING"
    assert h.dump(applied=False, outbox=False) == before
