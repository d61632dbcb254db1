"""Rows and leases as the JSON shapes of PROTOCOL.md. Pure: values in, replies out: the task
replies as the contract's models (``conveyor.contract.replies``, encoded by ``routes.reply``);
a lease and its step rows as dicts, which the worker protocol's replies still are."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Literal, TypedDict, cast

import msgspec

from conveyor.contract import replies as out
from conveyor.schemas.resume import RESUME_PINNED
from conveyor.schemas.types import (
    Attempt,
    Barrier,
    CancelCause,
    EventWait,
    StepRow,
    Task,
    TaskStatus,
)
from conveyor.streams.machine import Reply
from conveyor.streams.processor.pool import Lease

# What the machine's statuses are on the wire (``replies.Status`` spells them out).
STATUS = cast("dict[TaskStatus, out.Status]", {s: s.value for s in TaskStatus})


def error_reply(cls: str | None, message: str | None, stack: str | None) -> out.Error | None:
    if cls is None and message is None:
        return None
    return out.Error(class_=cls, message=message, stack=stack)


class _SummaryFields(TypedDict):
    """The fields a listing's row and the task's detail share (a TypedDict, so mypy checks
    them against both models' fields where they are unpacked)."""

    task_id: str
    app: str
    task_type: str
    queue: str
    priority: int | None
    status: out.Status
    attempt: int
    created_ms: int
    updated_ms: int
    run_at_ms: int | None
    finished_ms: int | None
    error: out.Error | None
    cancel_requested: bool


def _summary_fields(task: Task) -> _SummaryFields:
    return {
        "task_id": task.task_id,
        "app": task.app,
        "task_type": task.task_type,
        "queue": task.queue,
        "priority": task.priority,
        "status": STATUS[task.status],
        "attempt": task.attempt,
        "created_ms": task.created_ms,
        "updated_ms": task.updated_ms,
        "run_at_ms": task.run_at_ms,
        "finished_ms": task.finished_ms,
        "error": error_reply(task.error_class, task.error_message, task.error_stack),
        "cancel_requested": task.cancel_cause == CancelCause.CANCEL,
    }


def task_summary(task: Task) -> out.TaskSummary:
    """What a listing shows: no payload, result, checkpoint or attempts (any can be large)."""
    return out.TaskSummary(**_summary_fields(task))


def attempt_row(a: Attempt, logged: set[int]) -> out.AttemptRow:
    return out.AttemptRow(
        attempt=a.attempt,
        worker=a.agent_id,
        started_ms=a.started_ms,
        finished_ms=a.finished_ms,
        outcome=a.outcome,
        error=error_reply(a.error_class, a.error_message, a.error_stack),
        log_url=log_url(a.task_id, a.lease_id, logged),
    )


def log_url(task_id: str, lease_id: int, logged: set[int]) -> str | None:
    """Where the attempt's captured output is, if it left any."""
    return f"/v1/tasks/{task_id}/logs/{lease_id}" if lease_id in logged else None


def task_detail(
    task: Task,
    attempts: list[Attempt],
    *,
    payload: Any,
    result: Any,
    checkpoint: Any,
    logged: set[int],
) -> out.Task:
    """``logged``: the lease ids whose attempts left captured output."""
    rows = [attempt_row(a, logged) for a in attempts]
    in_row = task.status in (TaskStatus.LEASED, TaskStatus.SUCCEEDED)
    if in_row and all(a.attempt != task.attempt for a in attempts):
        # The attempt under way, and the one that succeeded, live in the task row only.
        done = task.status == TaskStatus.SUCCEEDED
        rows.append(
            out.AttemptRow(
                attempt=task.attempt,
                worker=task.agent_id,
                started_ms=task.leased_ms,
                finished_ms=task.finished_ms if done else None,
                outcome=task.status.value if done else None,
                error=None,
                log_url=log_url(task.task_id, task.lease_id, logged),
            )
        )
    return out.Task(
        **_summary_fields(task),
        payload=payload,
        result=result,
        checkpoint=checkpoint,
        attempts=rows,
        resume=cast("Literal['latest', 'pinned']", task.resume),
        app_version=task.app_version,
        waiting_for=waiting_for(task),
        compensating=task.compensating,
    )


def waiting_for(task: Task) -> str | None:
    """What a pinned task that is ready but can only go to agents of its version waits for
    (``store/lanes.py``, rule 3)."""
    pinned = task.resume == RESUME_PINNED and task.app_version is not None
    if not (pinned and task.status == TaskStatus.ENQUEUED):
        return None
    return f"an agent serving version {task.app_version!r} of app {task.app!r} (resume=pinned)"


def as_json(reply: out.Reply) -> dict[str, Any]:
    """A reply model as the JSON object it is sent as, for a reply still built as a dict."""
    body: dict[str, Any] = msgspec.to_builtins(reply)
    return body


def version_json(task: Task) -> dict[str, Any]:
    """The resume policy, the recorded app version, and what a pinned task waits for
    (``waiting_for``)."""
    return {
        "resume": task.resume,
        "app_version": task.app_version,
        "waiting_for": waiting_for(task),
        # canceled, and running its compensations before it ends (``conveyor.steps`` rule 6)
        "compensating": task.compensating,
    }


def utc(ms: int) -> str:
    """An epoch-ms instant as ISO 8601 UTC, to the second, for messages."""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def waiting(
    task: Task, wait: EventWait | None, open_fans: list[Barrier]
) -> tuple[str | None, out.EventWaiting | None]:
    """What a WAITING workflow waits for: the event of its ``ctx.wait_for_event`` (name and
    deadline, from the partition's wait row) or the children of its open ``ctx.parallel``;
    in words (None: nothing to add to ``waiting_for``) and as the event. Nothing for a task
    in any other state (``waiting_for`` says why a ready one waits)."""
    if task.status != TaskStatus.WAITING:
        return None, None
    if wait is not None:
        until = "" if wait.deadline_ms is None else f" until {utc(wait.deadline_ms)}"
        event = out.EventWaiting(name=wait.name, step=wait.identity, deadline_ms=wait.deadline_ms)
        return f"event {wait.name!r}{until} (ctx.wait_for_event)", event
    if open_fans:
        steps = ", ".join(repr(b.identity) for b in open_fans)
        return f"the children of parallel step {steps} (ctx.parallel)", None
    return None, None


def waiting_json(task: Task, wait: EventWait | None, open_fans: list[Barrier]) -> dict[str, Any]:
    """``waiting`` as the keys of a workflow's JSON: ``waiting_for`` when there are words,
    ``waiting_for_event`` always."""
    why, event = waiting(task, wait, open_fans)
    body: dict[str, Any] = {"waiting_for_event": None if event is None else as_json(event)}
    if why is not None:
        body["waiting_for"] = why
    return body


def enqueue_reply(reply: Reply) -> out.EnqueueReply:
    status = None if reply.status is None else STATUS[reply.status]
    return out.EnqueueReply(
        task_id=reply.task_id, created=reply.created, status=cast("out.Status", status)
    )


def lease_json(lease: Lease, *, payload: Any, checkpoint: Any) -> dict[str, Any]:
    return {
        "task_id": lease.task_id,
        "lease_id": lease.lease_id,
        "attempt": lease.attempt,
        "task_type": lease.task_type,
        "queue": lease.queue,
        "payload": payload,
        "checkpoint": checkpoint,
        "lease_ms": lease.lease_ms,
        "start_to_close_ms": lease.start_to_close_ms,
        "steps": [step_json(row) for row in lease.steps],
        "started_ms": lease.started_ms,
        "run_key": lease.run_key,
        "compensating": lease.compensating,
        "trace_context": None if lease.trace_context is None else json.loads(lease.trace_context),
    }


def step_json(row: StepRow) -> dict[str, Any]:
    return {
        "identity": row.identity,
        "position": row.position,
        "claims": row.claims,
        "committed": row.value is not None,
        "value": None if row.value is None else json.loads(row.value),
        "wake_at_ms": row.wake_at_ms,
    }
