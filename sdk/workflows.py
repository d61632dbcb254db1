"""``ctx.parallel`` and ``ctx.wait_for_event``: wait without a process, resume with the results.

Rule 1 (a step): a parallel call is an unkeyed step, ``name#occurrence``, checked for
divergence like any other. The first time, it unwinds the body with ``FanOut`` (a
``StepSignal``, so user code cannot swallow it): the attempt ends, the platform enqueues the
children on the workflow's partition and holds the workflow in WAITING, with no lease and no
guest. When the fan-in fires the step is committed and the workflow runs again from the top;
this time the call returns at once from the committed step.
Rule 2 (results): ``mode="collect"`` returns one entry per child, in the order given: the
child's result, or a ``ChildError`` (not raised) for a child that ended FAILED, CANCELED or
EXPIRED. ``mode="fail_fast"`` returns the results when every child succeeded; the first child
that did not raises ``ChildFailed`` (a ``FatalError``: the same code would fail the same way)
and the siblings still running are canceled.
Rule 3 (children): a child is ``conveyor.Enqueue(task, payload, ...)`` or ``(task, payload)``,
with ``task`` a ``TaskType`` or a task type name (of the workflow's app unless ``app=`` says
otherwise). Options left unset take the task type's defaults. A child has no idempotency key:
its id derives from the workflow, the step and its index, so a replay never duplicates it.
Rule 4 (events): ``ctx.wait_for_event(name, timeout=)`` is the step ``event:<name>#<n>``. It
ends the attempt (the workflow waits in WAITING, no process) until an event ``name`` is sent
(``POST /v1/workflows/{id}/events``, ``client.send_event``) and returns its payload. An event
sent before the wait is kept and taken by the next wait of its name, in arrival order. After
``timeout`` it raises ``EventTimeout`` (a ``FatalError``: catch it to carry on).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from typing import Any

from conveyor.app import TaskType
from conveyor.errors import ContractError, FatalError
from conveyor.schemas import limits
from conveyor.schemas.steps import PARALLEL_CHILDREN_MAX, STEP_NAME_BYTES_MAX
from conveyor.wire import Enqueue, enqueue_body

MODES = {"collect": "COLLECT", "fail_fast": "FAIL_FAST"}
# The children of one fan-out travel in one completion (HTTP bodies are capped at 8 MiB).
FAN_OUT_BYTES_MAX = 4 * 1024 * 1024
_NO_APP = "\x00"  # stands in for "the workflow's app" while the body is built


class WorkflowRefused(ContractError, FatalError):
    """A ``ctx.parallel`` or ``ctx.wait_for_event`` call that cannot be (a bad mode, child or
    name; children too large). The same code would ask again: the workflow fails without
    retries."""


class ChildError(Exception):
    """A child that did not succeed, in the results of ``mode="collect"`` (returned, not
    raised)."""

    def __init__(
        self, *, index: int, task_id: str, status: str, error_class: str | None, message: str | None
    ) -> None:
        super().__init__(f"child {index} ({task_id}) ended {status}: {error_class}: {message}")
        self.index = index
        self.task_id = task_id
        self.status = status
        self.error_class = error_class
        self.message = message


class ChildFailed(FatalError):
    """``mode="fail_fast"``: a child ended FAILED, CANCELED or EXPIRED; its siblings were
    canceled. Raised from ``ctx.parallel``; uncaught, it fails the workflow without retries."""

    def __init__(self, child: ChildError) -> None:
        super().__init__(
            f"parallel child {child.index} ({child.task_id}) ended {child.status}: "
            f"{child.error_class}: {child.message}"
        )
        self.child = child
        self.task_id = child.task_id
        self.index = child.index
        self.status = child.status
        self.error_class = child.error_class
        self.message = child.message


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise WorkflowRefused(
            f"ctx.parallel mode must be 'collect' or 'fail_fast', got {mode!r}", field="mode"
        )
    return MODES[mode]


def child_bodies(children: Iterable[Any]) -> list[dict[str, Any]]:
    """The enqueue bodies of the children (rule 3), without idempotency keys; a child without
    an app leaves ``app`` out (the platform takes the workflow's)."""
    bodies = [_body(i, child) for i, child in enumerate(children)]
    if not 1 <= len(bodies) <= PARALLEL_CHILDREN_MAX:
        raise WorkflowRefused(
            f"ctx.parallel takes 1..{PARALLEL_CHILDREN_MAX} children, got {len(bodies)}",
            field="children",
        )
    size = len(json.dumps(bodies, separators=(",", ":"), default=str).encode())
    if size > FAN_OUT_BYTES_MAX:
        raise WorkflowRefused(
            f"ctx.parallel children take {size} bytes of JSON; a fan-out carries at most "
            f"{FAN_OUT_BYTES_MAX}: give children handles to big payloads",
            field="children",
        )
    return bodies


def _body(index: int, child: Any) -> dict[str, Any]:
    if isinstance(child, tuple) and len(child) == 2:
        child = Enqueue(child[0], child[1])
    if not isinstance(child, Enqueue) or not isinstance(child.task, TaskType | str):
        raise WorkflowRefused(
            f"ctx.parallel child {index}: give conveyor.Enqueue(task, payload, ...) or "
            f"(task, payload), got {type(child).__name__}",
            field="children",
        )
    if child.idempotency_key is not None:
        raise WorkflowRefused(
            f"ctx.parallel child {index}: children take no idempotency_key (their ids derive "
            "from the workflow and the step)",
            field="children",
        )
    named_app = child.app or (child.task.app.name if isinstance(child.task, TaskType) else None)
    body = enqueue_body(dataclasses.replace(child, app=named_app or _NO_APP), None)
    body.pop("idempotency_key", None)
    if named_app is None:
        del body["app"]
    return body


def results_of(value: Any) -> list[Any]:
    """The committed value of a parallel step as ``ctx.parallel`` returns it (rule 2)."""
    if not isinstance(value, dict):
        raise ContractError(f"a parallel step holds {type(value).__name__}, not its results")
    failed = value.get("failed")
    if isinstance(failed, dict):
        raise ChildFailed(_child_error(int(failed.get("index", -1)), failed))
    results = list(value.get("results") or [])
    for key, error in (value.get("errors") or {}).items():
        index = int(key)
        results[index] = _child_error(index, error)
    return results


def _child_error(index: int, raw: dict[str, Any]) -> ChildError:
    return ChildError(
        index=index,
        task_id=str(raw.get("task_id")),
        status=str(raw.get("status")),
        error_class=raw.get("error_class"),
        message=raw.get("message"),
    )


# -- ctx.wait_for_event --------------------------------------------------------------------

EVENT_NAME_BYTES_MAX = STEP_NAME_BYTES_MAX - len("event:")


class EventTimeout(FatalError):
    """``ctx.wait_for_event`` waited ``timeout`` and no event came. Catch it to carry on;
    uncaught, it fails the workflow without retries (a retry would time out the same way)."""

    def __init__(self, name: str) -> None:
        super().__init__(f"no event {name!r} came before the wait's timeout")
        self.name = name


def event_step_name(name: str) -> str:
    """The step a wait is: ``event:<name>``, so its identity is ``event:<name>#<occurrence>``."""
    fault = limits.name_fault(name, EVENT_NAME_BYTES_MAX)  # what the events API takes
    if fault is not None:
        raise WorkflowRefused(f"an event name {fault}", field="name")
    return f"event:{name}"


def event_of(name: str, value: Any) -> Any:
    """The committed value of a wait as ``ctx.wait_for_event`` returns it."""
    if isinstance(value, dict) and value.get("timeout") is True:
        raise EventTimeout(name)
    if not isinstance(value, dict) or "payload" not in value:
        raise ContractError(f"a wait step holds {type(value).__name__}, not an event")
    return value["payload"]
