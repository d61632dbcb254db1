"""RecordSteps (step claims and commits) and the SLEEP outcome of an attempt.

Rule 1 (fencing): every claim and commit names the lease it was made under; one that is not
the task's live lease is rejected and changes nothing. A zombie's step never lands.
Rule 2 (first commit wins): a commit of an already committed step is acknowledged and changes
nothing, so a resent commit is harmless and a sleep's deadline is fixed by its first commit.
Rule 3 (claims count attempts): a claim before a non-memoized step runs adds one to the step's
claim count; a step claimed under a lease that died is claimed again by the next attempt, and
its body sees the count (``ctx.step.attempt``) above 1.
Rule 4 (caps): the per-step, per-task bytes and per-task count caps of ``schemas/steps.py``
are enforced here too, because the guest that computed the value is not trusted.
Rule 5 (lifetime): step rows are kept only while the task can still run. ``lifecycle.finish``
drops them (and the totals row) in the terminal transition's batch. FAILED keeps none either:
a dead-letter retry is a NEW task that runs its steps again under the run key it carries, so
``ctx.step.idempotency_key`` stays stable for the side effects, and memos never cross tasks.
The history of steps lives in the Postgres projection, fed by the step events.
Rule 6 (compensations): committing a ``@compensate:<identity>`` marker (``schemas/steps.py``)
flags the task ``compensable``: from then on a cancel gives it a compensating attempt
(``lifecycle.begin_compensation``) instead of ending it at once.
"""

from __future__ import annotations

from conveyor.schemas.steps import COMPENSATE_PREFIX, over_cap
from conveyor.schemas.types import (
    Completion,
    EventKind,
    RecordSteps,
    SleepStep,
    StepEvent,
    StepOp,
    StepRow,
    StepTotals,
    StepWrite,
    Task,
    TaskStatus,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.lifecycle import (
    attempt_failed,
    emit,
    end_lease,
    holder,
    record_attempt,
    run_timer,
    stopped_instead,
    touch,
)
from conveyor.streams.machine.outcome import Meta, Outcome, Reply
from conveyor.streams.machine.transitions import move

SLEEP_VALUE = b"null"  # what a sleep step memoizes: nothing (JSON null)


def apply_steps(tables: Tables, record: RecordSteps, meta: Meta, out: Outcome) -> None:
    for index, item in enumerate(record.items):
        task = holder(tables, item.task_id, item.lease_id)
        if isinstance(task, str):
            reason: str | None = task
        elif item.op == StepOp.CLAIM:
            reason = _claim(tables, task, item, meta, out)
        else:
            reason = _commit(tables, task, item, meta, out)
        out.actions.append(
            Reply(
                offset=meta.offset,
                index=index,
                ok=reason is None,
                task_id=item.task_id,
                reason=reason,
            )
        )


def put_step(tables: Tables, task: Task, row: StepRow, meta: Meta, out: Outcome) -> None:
    """Write a step row and report it as a step event (the projection keeps the history)."""
    tables.put_step(task.task_id, row)
    out.steps.append(
        StepEvent(
            task_id=task.task_id,
            tenant=task.tenant,
            identity=row.identity,
            position=row.position,
            state="CLAIMED" if row.value is None else "COMMITTED",
            claims=row.claims,
            value=row.value,
            wake_at_ms=row.wake_at_ms,
            ts_ms=meta.ts_ms,
            version=meta.offset,
        )
    )


def _claim(tables: Tables, task: Task, item: StepWrite, meta: Meta, out: Outcome) -> str | None:
    row = tables.step(item.task_id, item.identity)
    if row is not None and row.value is not None:
        return f"step {item.identity!r} is already committed"
    claims = 1 if row is None else row.claims + 1
    put_step(
        tables,
        task,
        StepRow(identity=item.identity, position=item.position, claims=claims),
        meta,
        out,
    )
    return None


def _commit(tables: Tables, task: Task, item: StepWrite, meta: Meta, out: Outcome) -> str | None:
    row = tables.step(item.task_id, item.identity)
    if row is not None and row.value is not None:
        return None  # rule 2: the first commit stands
    value = item.value if item.value is not None else SLEEP_VALUE
    why = _add(tables, item.task_id, item.identity, len(value))
    if why is not None:
        return why
    claims = 1 if row is None else row.claims
    put_step(
        tables,
        task,
        StepRow(identity=item.identity, position=item.position, claims=claims, value=value),
        meta,
        out,
    )
    if item.identity.startswith(COMPENSATE_PREFIX) and not task.compensable:
        task.compensable = True  # rule 6: a cancel now runs its compensations first
        touch(task, meta)
        tables.put_task(task)
    return None


def _add(tables: Tables, task_id: str, identity: str, size: int) -> str | None:
    """Count one more committed step of ``size`` bytes, unless a cap refuses it."""
    totals = tables.step_totals(task_id)
    why = over_cap(identity, size, totals.count, totals.bytes)
    if why is None:
        tables.put_step_totals(
            task_id, StepTotals(count=totals.count + 1, bytes=totals.bytes + size)
        )
    return why


def sleep_attempt(tables: Tables, task: Task, item: Completion, meta: Meta, out: Outcome) -> None:
    """A LEASED attempt ended in a durable sleep: commit the sleep step (its deadline fixed by
    the first commit), then wait in SLEEPING for a RUN timer at that deadline. The attempt
    number moves on (attempt rows stay distinct) and so does the budget base: a sleep never
    spends a retry."""
    sleep = item.sleep
    if sleep is None:
        attempt_failed(
            tables,
            task,
            meta,
            out,
            error_class="BadSleep",
            error_message="a SLEEP outcome without its sleep step",
            fatal=True,
        )
        return
    wake_at = _commit_sleep(tables, task, sleep, meta, out)
    if isinstance(wake_at, str):
        attempt_failed(tables, task, meta, out, error_class="StepTooLarge", error_message=wake_at)
        return
    expired = "the sleep would end after schedule_to_close"
    if stopped_instead(tables, task, meta, out, expired=expired, until_ms=wake_at):
        return
    record_attempt(tables, task, meta, "SLEPT")
    end_lease(tables, task, out)
    move(task, TaskStatus.SLEEPING)
    task.attempt += 1
    task.budget_base += 1
    task.run_at_ms = wake_at
    touch(task, meta)
    tables.add_timer(run_timer(task))
    tables.put_task(task)
    emit(out, EventKind.TaskSleeping, task, meta)


def _commit_sleep(
    tables: Tables, task: Task, sleep: SleepStep, meta: Meta, out: Outcome
) -> int | str:
    """The sleep's deadline: the committed one, or a new one committed now; or why not."""
    row = tables.step(task.task_id, sleep.identity)
    if row is not None and row.wake_at_ms is not None:
        return row.wake_at_ms
    if sleep.wake_at_ms is not None:
        wake_at = sleep.wake_at_ms
    else:
        wake_at = meta.ts_ms + max(0, sleep.sleep_ms or 0)
    why = _add(tables, task.task_id, sleep.identity, len(SLEEP_VALUE))
    if why is not None:
        return why
    put_step(
        tables,
        task,
        StepRow(
            identity=sleep.identity,
            position=sleep.position,
            claims=1 if row is None else row.claims,
            value=SLEEP_VALUE,
            wake_at_ms=wake_at,
        ),
        meta,
        out,
    )
    return wake_at
