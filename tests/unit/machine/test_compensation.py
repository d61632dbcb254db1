"""Cancel with compensations: a canceled task that committed a ``@compensate:`` marker gets
one more attempt, flagged compensating, instead of ending at once; its children and timers
are canceled first; the attempt's CANCELED ends it CANCELED, a failing compensation is retried
per policy and ends it FAILED."""

from __future__ import annotations

from conveyor.schemas.steps import COMPENSATE_PREFIX
from conveyor.schemas.types import (
    TERMINAL,
    CancelCause,
    Completion,
    EventKind,
    Outcome,
    RecordSteps,
    SleepStep,
    StepOp,
    StepWrite,
    TaskStatus,
)
from conveyor.streams.machine import Reply

from .harness import Harness, actions_of, grants
from .test_workflows import children, fan_out


def commit(h: Harness, task_id: str, lease_id: int, identity: str, value: bytes) -> None:
    item = StepWrite(
        task_id=task_id,
        lease_id=lease_id,
        op=StepOp.COMMIT,
        identity=identity,
        position=-1 if identity.startswith("@") else 0,
        value=value,
    )
    (reply,) = actions_of(h.apply(RecordSteps(items=[item])), Reply)
    assert reply.ok, reply


def charged(h: Harness, **spec: object) -> tuple[str, int]:
    """A workflow that committed the marker of charge#0, then charge#0 itself; leased."""
    workflow = h.spec(task_type="checkout", **spec)
    h.enqueue(workflow)
    lease = h.lease_one(workflow.task_id).lease_id
    assert not h.task(workflow.task_id).compensable
    commit(h, workflow.task_id, lease, f"{COMPENSATE_PREFIX}charge#0", b"true")
    assert h.task(workflow.task_id).compensable
    commit(h, workflow.task_id, lease, "charge#0", b'"ch_1"')
    return workflow.task_id, lease


def sleep(h: Harness, task_id: str, lease_id: int) -> None:
    step = SleepStep(identity="nap#0", position=1, sleep_ms=3_600_000)
    h.report(Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.SLEEP, sleep=step))


def compensating_lease(h: Harness, task_id: str) -> int:
    (grant,) = grants(h.grant(1))
    assert grant.task_id == task_id
    return grant.lease_id


def test_a_canceled_sleeping_workflow_gets_a_compensating_attempt_then_ends_canceled() -> None:
    h = Harness()
    task_id, lease = charged(h, attempts_max=3)
    sleep(h, task_id, lease)
    assert h.task(task_id).status == TaskStatus.SLEEPING and h.timers_of(task_id)
    out = h.cancel(task_id, reason="customer changed their mind")
    task = h.task(task_id)
    assert task.status == TaskStatus.ENQUEUED and task.compensating
    assert task.budget_base == task.attempt - 1  # the compensations get the full budget
    assert not any(t.kind == "RUN" for t in h.timers_of(task_id))  # the sleep's timer is gone
    assert [e.kind for e in out.events] == [EventKind.TaskRequeued]
    assert h.committed().step(task_id, "charge#0") is not None  # the replay needs the memos
    lease2 = compensating_lease(h, task_id)
    assert h.cancel(task_id).events == []  # canceling a compensating task changes nothing
    h.canceled(task_id, lease2, "canceled after 1 compensation(s)")
    task = h.task(task_id)
    assert task.status == TaskStatus.CANCELED
    assert (task.error_class, task.error_message) == ("Canceled", "customer changed their mind")
    assert h.committed().step(task_id, "charge#0") is None  # dropped with the task


def test_a_failing_compensation_is_retried_per_policy_then_fails_the_task() -> None:
    h = Harness()
    task_id, lease = charged(h, attempts_max=2)
    sleep(h, task_id, lease)
    h.cancel(task_id)
    message = "compensation of step 'charge#0' failed: RuntimeError: bank down"
    lease2 = compensating_lease(h, task_id)
    h.fail(task_id, lease2, "CompensationFailed", message, retry_after_ms=0)
    assert h.task(task_id).status == TaskStatus.RETRY_WAIT and h.task(task_id).compensating
    h.fire_due()
    h.fail(task_id, compensating_lease(h, task_id), "CompensationFailed", message)
    task = h.task(task_id)
    assert task.status == TaskStatus.FAILED
    assert (task.error_class, task.error_message) == ("CompensationFailed", message)


def test_a_running_workflow_that_stops_on_cancel_compensates_instead_of_ending() -> None:
    h = Harness()
    task_id, lease = charged(h)
    h.cancel(task_id)
    assert h.task(task_id).cancel_cause == CancelCause.CANCEL  # asked to stop first
    h.canceled(task_id, lease)
    task = h.task(task_id)
    assert task.status == TaskStatus.ENQUEUED and task.compensating and task.attempt == 2
    assert task.cancel_cause is None and h.leased() == {}
    h.complete(task_id, compensating_lease(h, task_id))  # a SUCCEEDED counts as done too
    assert h.task(task_id).status == TaskStatus.CANCELED


def test_a_workflow_whose_grace_runs_out_compensates() -> None:
    h = Harness()
    task_id, _ = charged(h, cancel_grace_ms=1_000)
    h.cancel(task_id)
    h.fire_due(h.now_ms + 1_000)
    task = h.task(task_id)
    assert task.status == TaskStatus.ENQUEUED and task.compensating


def test_cancel_of_a_waiting_workflow_cancels_its_children_then_compensates() -> None:
    h = Harness()
    task_id, lease = charged(h)
    fan_out(h, task_id, lease, 2, identity="fan#1")
    ids = children(task_id, 2, identity="fan#1")
    out = h.cancel(task_id)
    assert [h.task(i).status for i in ids] == [TaskStatus.CANCELED] * 2  # in the same record
    assert {e.task_id for e in out.events if e.kind == EventKind.TaskCanceled} == set(ids)
    parent = h.task(task_id)
    assert parent.status == TaskStatus.ENQUEUED and parent.compensating
    assert h.committed().step(task_id, "fan#1") is None  # the fan-in never fired
    lease2 = compensating_lease(h, task_id)
    h.canceled(task_id, lease2)
    assert h.task(task_id).status == TaskStatus.CANCELED
    assert all(h.task(i).status in TERMINAL for i in ids)


def test_a_task_without_compensations_is_canceled_at_once() -> None:
    h = Harness()
    spec = h.spec()
    h.enqueue(spec)
    lease = h.lease_one(spec.task_id).lease_id
    commit(h, spec.task_id, lease, "charge#0", b"1")
    sleep(h, spec.task_id, lease)
    h.cancel(spec.task_id)
    assert h.task(spec.task_id).status == TaskStatus.CANCELED


def test_a_compensating_attempt_that_dies_is_retried_with_its_undone_steps_kept() -> None:
    h = Harness()
    task_id, lease = charged(h, attempts_max=3)
    sleep(h, task_id, lease)
    h.cancel(task_id)
    lease2 = compensating_lease(h, task_id)
    commit(h, task_id, lease2, "@undo:charge#0", b'"refunded"')
    h.expire(task_id, lease2)  # the agent died before it reported
    task = h.task(task_id)
    assert task.status == TaskStatus.RETRY_WAIT and task.compensating
    h.fire_due(h.now_ms + 60_000)
    lease3 = compensating_lease(h, task_id)
    undo = h.committed().step(task_id, "@undo:charge#0")
    assert undo is not None and undo.value == b'"refunded"'  # the next attempt skips it
    assert h.cancel(task_id).events == []
    h.canceled(task_id, lease3)
    assert h.task(task_id).status == TaskStatus.CANCELED
