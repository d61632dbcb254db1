"""``ctx.wait_for_event``: the WAIT_EVENT outcome, SendEvents, and the EVENT_TIMEOUT timer.

Rule 1 (a step): a wait is a step of the workflow. The WAIT_EVENT outcome parks the workflow
in WAITING (like a fan-out: no lease, no guest) with a wait row naming the event, and arms an
EVENT_TIMEOUT timer when the wait has a timeout. Whatever ends the wait commits the step and
moves the workflow WAITING -> ENQUEUED, exactly once: the wait row is dropped in that batch.
Rule 2 (delivery): an event for a workflow waiting for that name commits the step with
``{"payload": <the event's payload>}``. Any other event (the workflow is running, sleeping,
waiting for something else) is kept, in arrival order, and the next wait for its name takes
the oldest one at once, without parking. An event for a finished or unknown workflow is
refused and changes nothing.
Rule 3 (timeout): the timer commits the step with ``{"timeout": true}``; a stale timer (the
wait ended, or a later attempt armed another) does nothing.
Rule 4 (caps): at most ``EVENTS_KEPT_MAX`` events are kept per workflow and event name; the
gateway caps a payload at the step bytes limit.
"""

from __future__ import annotations

import itertools

from conveyor.schemas.types import (
    TERMINAL,
    Completion,
    EventWait,
    SendEvents,
    StepRow,
    StepTotals,
    Task,
    TaskStatus,
    TimerRef,
    WaitStep,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.handlers.steps import put_step
from conveyor.streams.machine.handlers.workflows import (
    WAIT_EXPIRED,
    end_wait,
    event_timer,
    park,
    wake,
)
from conveyor.streams.machine.lifecycle import SEQ_SLOTS, attempt_failed, stopped_instead
from conveyor.streams.machine.outcome import Meta, Outcome, Refusal, Reply

EVENTS_KEPT_MAX = 1_000
TIMED_OUT = b'{"timeout":true}'


def wait_attempt(tables: Tables, task: Task, item: Completion, meta: Meta, out: Outcome) -> None:
    """A LEASED attempt ended in ``ctx.wait_for_event`` (rule 1)."""
    wait = item.wait
    if wait is None:
        attempt_failed(
            tables,
            task,
            meta,
            out,
            error_class="BadWait",
            error_message="a WAIT_EVENT outcome without its step",
            fatal=True,
        )
        return
    if stopped_instead(tables, task, meta, out, expired=WAIT_EXPIRED):
        return
    park(tables, task, "WAITED", meta, out)
    row = tables.step(task.task_id, wait.identity)
    if row is not None and row.value is not None:
        wake(tables, task, meta, out)  # committed before: carry on at once
        return
    kept = next(tables.kept_events(task.task_id, wait.name), None)
    if kept is not None:  # rule 2: an event came first
        key, payload = kept
        tables.drop_kept_event(key)
        _commit(tables, task, wait, _delivered(payload), meta, out)
        wake(tables, task, meta, out)
        return
    deadline = None if wait.timeout_ms is None else meta.ts_ms + max(0, wait.timeout_ms)
    row_wait = EventWait(
        identity=wait.identity,
        position=wait.position,
        name=wait.name,
        deadline_ms=deadline,
        token=task.attempt,
    )
    tables.put_event_wait(task.task_id, row_wait)
    timer = event_timer(task.task_id, row_wait)
    if timer is not None:
        tables.add_timer(timer)


def apply_send_events(tables: Tables, record: SendEvents, meta: Meta, out: Outcome) -> None:
    for index, item in enumerate(record.items):
        task = tables.task(item.task_id)
        reason: str | None = None
        refusal: Refusal | None = None
        if task is None or task.tenant != record.tenant:
            reason, refusal = "unknown task", Refusal.UNKNOWN_TASK
        elif task.status in TERMINAL:
            reason, refusal = f"workflow is {task.status.value}", Refusal.FINISHED
        else:
            reason = _deliver(tables, task, item.name, item.payload, meta, out, index)
            refusal = None if reason is None else Refusal.EVENTS_FULL
        out.actions.append(
            Reply(
                offset=meta.offset,
                index=index,
                ok=reason is None,
                task_id=item.task_id,
                status=None if task is None or reason is not None else task.status,
                reason=reason,
                refusal=refusal,
            )
        )


def _deliver(
    tables: Tables, task: Task, name: str, payload: bytes, meta: Meta, out: Outcome, index: int
) -> str | None:
    """Wake the workflow if it waits for ``name``, else keep the event (rule 2)."""
    wait = tables.event_wait(task.task_id)
    if task.status == TaskStatus.WAITING and wait is not None and wait.name == name:
        end_wait(tables, task.task_id, wait)
        _commit(tables, task, wait, _delivered(payload), meta, out)
        wake(tables, task, meta, out)
        return None
    kept = itertools.islice(tables.kept_events(task.task_id, name), EVENTS_KEPT_MAX)
    if sum(1 for _ in kept) >= EVENTS_KEPT_MAX:
        return f"{EVENTS_KEPT_MAX} events named {name!r} are already kept for this workflow"
    tables.keep_event(task.task_id, name, (meta.offset + 1) * SEQ_SLOTS + index, payload)
    return None


def fire_event_timeout(tables: Tables, task: Task, ref: TimerRef, meta: Meta, out: Outcome) -> None:
    """Rule 3."""
    wait = tables.event_wait(task.task_id)
    if task.status != TaskStatus.WAITING or wait is None or wait.token != ref.token:
        return
    end_wait(tables, task.task_id, wait)
    _commit(tables, task, wait, TIMED_OUT, meta, out)
    wake(tables, task, meta, out)


def _delivered(payload: bytes) -> bytes:
    return b'{"payload":' + (payload or b"null") + b"}"


def _commit(
    tables: Tables, task: Task, wait: EventWait | WaitStep, value: bytes, meta: Meta, out: Outcome
) -> None:
    totals = tables.step_totals(task.task_id)
    tables.put_step_totals(
        task.task_id, StepTotals(count=totals.count + 1, bytes=totals.bytes + len(value))
    )
    row = StepRow(identity=wait.identity, position=wait.position, claims=1, value=value)
    put_step(tables, task, row, meta, out)
