"""FireTimers: delays and backoff ending, the three timeouts, the cancel grace, cron firings
(handlers/schedules.py).

A timer carries a token (the attempt or lease it was armed for). A timer whose task has moved
on is stale and does nothing, so disarming a timer is an optimisation, never a requirement.
"""

from __future__ import annotations

from typing import assert_never

from conveyor.schemas.types import (
    TERMINAL,
    CancelCause,
    EventKind,
    FireTimers,
    Task,
    TaskStatus,
    TimerKind,
    TimerRef,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.handlers.cancel import request_stop
from conveyor.streams.machine.handlers.enqueue import forget_key
from conveyor.streams.machine.handlers.events import fire_event_timeout
from conveyor.streams.machine.handlers.schedules import fire_schedule
from conveyor.streams.machine.lifecycle import (
    WAITING,
    attempt_failed,
    emit,
    end_stopped,
    expire_closed,
    finish,
    make_ready,
    touch,
)
from conveyor.streams.machine.outcome import Meta, Outcome
from conveyor.streams.machine.transitions import move


def apply_timers(tables: Tables, record: FireTimers, meta: Meta, out: Outcome) -> None:
    for index, ref in enumerate(record.timers):
        if not 0 <= ref.fire_at_ms <= meta.ts_ms or ref.token < 0:
            continue  # not due (timers never fire early), or not a timer we could arm
        if not tables.timer_exists(ref):
            continue  # already fired or disarmed
        tables.remove_timer(ref)
        if ref.kind == TimerKind.SCHEDULE:
            fire_schedule(tables, ref, meta, out, index)
            continue
        if ref.kind == TimerKind.FORGET_KEY:
            forget_key(tables, ref.task_id, meta)  # whatever the task's state
            continue
        task = tables.task(ref.task_id)
        if task is not None and task.status not in TERMINAL:
            _fire(tables, task, ref, meta, out, index)


def _fire(tables: Tables, task: Task, ref: TimerRef, meta: Meta, out: Outcome, index: int) -> None:
    leased_now = task.status == TaskStatus.LEASED and task.lease_id == ref.token
    match ref.kind:
        case TimerKind.RUN:
            if task.status in WAITING and task.ready_seq == 0 and task.attempt == ref.token:
                if task.status != TaskStatus.ENQUEUED:
                    move(task, TaskStatus.ENQUEUED)  # backoff or sleep over
                make_ready(tables, task, meta, index)
                touch(task, meta)
                tables.put_task(task)
                emit(out, EventKind.TaskRequeued, task, meta)
        case TimerKind.SCHEDULE_TO_START:
            if task.status == TaskStatus.ENQUEUED and task.lease_id == 0:
                finish(
                    tables,
                    task,
                    TaskStatus.EXPIRED,
                    meta,
                    out,
                    error_class="ScheduleToStartTimeout",
                    error_message="not started before schedule_to_start",
                )
        case TimerKind.SCHEDULE_TO_CLOSE:
            if task.status == TaskStatus.LEASED:
                request_stop(
                    tables,
                    task,
                    CancelCause.SCHEDULE_TO_CLOSE,
                    "schedule_to_close passed",
                    meta,
                    out,
                )
            else:
                expire_closed(tables, task, meta, out, "not finished before schedule_to_close")
        case TimerKind.START_TO_CLOSE:
            if leased_now and task.cancel_cause is None:
                request_stop(
                    tables, task, CancelCause.START_TO_CLOSE, "start_to_close passed", meta, out
                )
        case TimerKind.CANCEL_GRACE:
            if leased_now and task.cancel_cause is not None:
                _grace_over(tables, task, meta, out)
        case TimerKind.EVENT_TIMEOUT:
            fire_event_timeout(tables, task, ref, meta, out)
        case TimerKind.SCHEDULE | TimerKind.FORGET_KEY:
            raise AssertionError(f"{ref.kind} timers fire before the task is looked up")
        case _:
            assert_never(ref.kind)


def _grace_over(tables: Tables, task: Task, meta: Meta, out: Outcome) -> None:
    cause = task.cancel_cause
    if cause == CancelCause.START_TO_CLOSE:
        task.cancel_cause = None  # the attempt failed; the task is not canceled
        attempt_failed(
            tables,
            task,
            meta,
            out,
            error_class="StartToCloseTimeout",
            error_message="the attempt ran past start_to_close",
        )
    else:
        end_stopped(tables, task, meta, out, expired="not finished before schedule_to_close")
