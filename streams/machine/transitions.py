"""The task lifecycle as data. Every status change goes through ``move``.

Rule 1: terminal states (SUCCEEDED, FAILED, CANCELED, EXPIRED) are final. A dead-letter retry
makes a new task; it never revives the FAILED one.
Rule 2: a move that is not in the table is a broken invariant: ``move`` raises
``InvariantError`` (an explicit check, kept under ``python -O``), and the processor stops
rather than write a forked history.

``conveyor docs lifecycle`` prints the table as a Mermaid state diagram.
"""

from __future__ import annotations

from conveyor.errors import InvariantError
from conveyor.schemas.types import Task, TaskStatus

E, L, R = TaskStatus.ENQUEUED, TaskStatus.LEASED, TaskStatus.RETRY_WAIT
Z = TaskStatus.SLEEPING
W = TaskStatus.WAITING
S, F, C, X = TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELED, TaskStatus.EXPIRED

TRANSITIONS: dict[tuple[TaskStatus | None, TaskStatus], str] = {
    (None, E): "enqueued",
    (E, L): "lease granted",
    (E, C): "canceled",
    (E, X): "schedule_to_start or schedule_to_close passed",
    (L, S): "attempt succeeded",
    (L, R): "attempt failed or lease expired, attempts left",
    # An attempt its agent hands back before it started is not an attempt: ready again
    # (handlers/complete.py). A canceled workflow with compensations gets one more attempt
    # that runs them (lifecycle.begin_compensation); the other waiting states reach it
    # through their own edge to ENQUEUED.
    (L, E): "handed back unstarted (its agent stopping); or canceled, compensations to run",
    (L, F): "fatal error or attempts exhausted",
    (L, C): "cancel grace over, or the handler stopped on cancel",
    (L, X): "schedule_to_close passed while running",
    (R, E): "backoff over",
    (R, C): "canceled",
    (R, X): "schedule_to_close passed",
    # A durable sleep ends an attempt without failing it: its own state, so that RETRY_WAIT
    # keeps meaning "an attempt failed" and the retry budget is visibly untouched.
    (L, Z): "the attempt slept (step.sleep)",
    (Z, E): "sleep over",
    (Z, C): "canceled",
    (Z, X): "schedule_to_close passed",
    # A workflow's fan-out (ctx.parallel) ends the attempt and holds no lease or timer while
    # its children run; the fan-in wakes it exactly once.
    (L, W): "the attempt fanned out (ctx.parallel)",
    (W, E): "the parallel step committed (every child landed, or fail_fast)",
    (W, F): "the parallel step's results are over the task's step bytes limit",
    (W, C): "canceled (cascades to the children)",
    (W, X): "schedule_to_close passed (cascades to the children)",
}


def move(task: Task, to: TaskStatus) -> None:
    if (task.status, to) not in TRANSITIONS:
        raise InvariantError(f"illegal move {task.status} -> {to} of {task}")
    task.status = to


def mermaid() -> str:
    lines = ["stateDiagram-v2"]
    for (src, dst), why in TRANSITIONS.items():
        lines.append(f"    {src.value if src else '[*]'} --> {dst.value}: {why}")
    for terminal in (S, F, C, X):
        lines.append(f"    {terminal.value} --> [*]")
    return "\n".join(lines)
