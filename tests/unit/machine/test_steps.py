"""The machine's durable-step handlers: RecordSteps (claims, commits) and the SLEEP outcome."""

from __future__ import annotations

from conveyor.schemas.steps import STEP_BYTES_MAX
from conveyor.schemas.types import (
    Completion,
    Outcome,
    RecordSteps,
    SleepStep,
    StepOp,
    StepWrite,
    TaskStatus,
    TimerKind,
)
from conveyor.store import keys
from conveyor.streams.machine import Outcome as MachineOutcome
from conveyor.streams.machine import Reply

from .harness import Harness, actions_of


def write(
    h: Harness, task_id: str, lease_id: int, op: StepOp, identity: str, value: bytes | None = None
) -> MachineOutcome:
    item = StepWrite(
        task_id=task_id, lease_id=lease_id, op=op, identity=identity, position=0, value=value
    )
    return h.apply(RecordSteps(items=[item]))


def reply(out: MachineOutcome) -> Reply:
    (r,) = actions_of(out, Reply)
    return r


def leased(h: Harness) -> tuple[str, int]:
    spec = h.spec(attempts_max=2)
    h.enqueue(spec)
    return spec.task_id, h.lease_one(spec.task_id).lease_id


def sleep(
    h: Harness, task_id: str, lease_id: int, identity: str = "sleep#0", **when: int
) -> MachineOutcome:
    step = SleepStep(identity=identity, position=0, **when)
    return h.report(
        Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.SLEEP, sleep=step)
    )


def test_claims_count_and_commit_stores_the_value() -> None:
    h = Harness()
    task_id, lease = leased(h)
    assert reply(write(h, task_id, lease, StepOp.CLAIM, "charge#0")).ok
    assert h.committed().step(task_id, "charge#0").claims == 1  # type: ignore[union-attr]
    h.expire(task_id, lease)  # the claim's lease died before the commit
    h.advance(10_000)
    h.fire_due()
    lease2 = h.lease_one(task_id).lease_id
    write(h, task_id, lease2, StepOp.CLAIM, "charge#0")
    assert reply(write(h, task_id, lease2, StepOp.COMMIT, "charge#0", b'"ch_1"')).ok
    row = h.committed().step(task_id, "charge#0")
    assert row is not None and row.claims == 2 and row.value == b'"ch_1"'


def test_a_stale_lease_claim_or_commit_is_refused_and_changes_nothing() -> None:
    h = Harness()
    task_id, lease = leased(h)
    h.expire(task_id, lease)
    h.advance(10_000)
    h.fire_due()
    h.lease_one(task_id)
    before = h.dump(applied=False)
    for op in (StepOp.CLAIM, StepOp.COMMIT):
        r = reply(write(h, task_id, lease, op, "charge#0", b"1"))
        assert not r.ok and r.reason == f"stale lease {lease}; current lease is {lease + 1}"
    assert h.dump(applied=False) == before


def test_the_first_commit_stands() -> None:
    h = Harness()
    task_id, lease = leased(h)
    write(h, task_id, lease, StepOp.COMMIT, "a#0", b"1")
    assert reply(write(h, task_id, lease, StepOp.COMMIT, "a#0", b"2")).ok
    assert h.committed().step(task_id, "a#0").value == b"1"  # type: ignore[union-attr]
    assert not reply(write(h, task_id, lease, StepOp.CLAIM, "a#0")).ok


def test_the_machine_enforces_the_step_bytes_cap() -> None:
    h = Harness()
    task_id, lease = leased(h)
    r = reply(write(h, task_id, lease, StepOp.COMMIT, "render#0", b"x" * 1_468_006))
    assert r.reason == f"step 'render#0' exceeds the step bytes limit: 1468006 > {STEP_BYTES_MAX}"
    assert h.committed().step(task_id, "render#0") is None


def test_sleep_waits_without_spending_the_budget_and_keeps_its_first_deadline() -> None:
    h = Harness()
    task_id, lease = leased(h)
    sleep(h, task_id, lease, sleep_ms=60_000)
    task = h.task(task_id)
    assert task.status == TaskStatus.SLEEPING and task.attempt == 2 and task.budget_base == 1
    assert [t.kind for t in h.timers_of(task_id)] == [TimerKind.RUN]
    assert h.leased() == {}
    h.advance(10_000)
    h.fire_due()
    assert h.task(task_id).status == TaskStatus.SLEEPING
    h.advance(50_000)
    h.fire_due()
    assert h.task(task_id).status == TaskStatus.ENQUEUED
    lease2 = h.lease_one(task_id).lease_id
    sleep(h, task_id, lease2, sleep_ms=60_000)  # a replay of the same sleep: same deadline
    assert h.task(task_id).run_at_ms == h.now_ms
    h.fire_due()
    h.fail(task_id, h.lease_one(task_id).lease_id)
    # attempts_max=2, three runs so far, one failure: the sleeps spent no retry.
    task = h.task(task_id)
    assert task.status == TaskStatus.RETRY_WAIT and task.attempt - task.budget_base == 2


def test_a_sleeping_task_can_be_canceled() -> None:
    h = Harness()
    task_id, lease = leased(h)
    sleep(h, task_id, lease, wake_at_ms=h.now_ms + 1_000)
    h.cancel(task_id)
    assert h.task(task_id).status == TaskStatus.CANCELED
    assert h.timers_of(task_id) == []


# -- lifetime: step rows go with the terminal transition ----------------------------------------


def step_keys(h: Harness) -> list[bytes]:
    """Every step row and totals row in the committed state."""
    return [k for k in h.dump() if k.startswith(keys.STEPS)]


def test_a_finished_task_keeps_no_step_rows() -> None:
    h = Harness()
    done, lease = leased(h)
    write(h, done, lease, StepOp.COMMIT, "a#0", b"1")
    write(h, done, lease, StepOp.CLAIM, "b#0")  # claimed, never committed
    other, other_lease = leased(h)
    write(h, other, other_lease, StepOp.COMMIT, "a#0", b"2")
    h.complete(done, lease)
    assert h.task(done).status == TaskStatus.SUCCEEDED
    assert h.committed().steps(done) == [] and h.committed().step_totals(done).count == 0
    # The other task's rows, whose key shares the prefix up to the task id, are untouched.
    assert [r.identity for r in h.committed().steps(other)] == ["a#0"]
    h.cancel(other)
    h.canceled(other, other_lease)
    assert h.task(other).status == TaskStatus.CANCELED and step_keys(h) == []


def test_failed_keeps_no_memos_and_its_dead_letter_retry_runs_steps_again() -> None:
    h = Harness()
    task_id, lease = leased(h)
    write(h, task_id, lease, StepOp.COMMIT, "charge#0", b'"ch_1"')
    h.fatal(task_id, lease)
    assert h.task(task_id).status == TaskStatus.FAILED and step_keys(h) == []
    h.retry_failed(task_id)
    (twin,) = [t for t in h.committed().tasks() if t.task_id != task_id]
    assert twin.run_key == task_id  # the idempotency keys of its steps stay stable
    grant = h.lease_one(twin.task_id)
    # A new task: no memo of the old one, so the step claims afresh (and its body runs).
    assert reply(write(h, twin.task_id, grant.lease_id, StepOp.CLAIM, "charge#0")).ok
    assert h.committed().step(twin.task_id, "charge#0").claims == 1  # type: ignore[union-attr]


def test_a_sleeping_task_canceled_drops_its_sleep_step() -> None:
    h = Harness()
    task_id, lease = leased(h)
    sleep(h, task_id, lease, sleep_ms=60_000)
    assert h.committed().step(task_id, "sleep#0") is not None
    h.cancel(task_id)
    assert h.task(task_id).status == TaskStatus.CANCELED and step_keys(h) == []
