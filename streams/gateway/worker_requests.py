"""Worker API requests (host agents): checked field by field, like ``validation``.

A poll names the task types its agent takes now (``task_types``): only tasks of those types are
dealt to it (``processor/pool.py``, Task types, says why the poll carries them rather than the
node looking them up). Absent or null, the agent takes any type of its app, as agents that do
not send it always did. ``open_breakers`` lists the types the agent's circuit breaker keeps out
of its polls (``agents/breaker.py``): the node shows them, it does not act on them.

A signals call (``Signals``) is the agent's one long-poll for cancels of the leases it holds
(``processor/signals.py``); it names only the agent: the node knows which leases are its.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from conveyor.contract.limits import (
    DURATION_MS_MAX,
    IDENTITY_BYTES_MAX,
    INT_MAX,
    LEASE_MS_MAX,
    LEASE_MS_MIN,
    QUEUES_MAX,
    SIGNALS_WAIT_MS_MAX,
    TASK_TYPES_MAX,
    WAIT_MS_MAX,
)
from conveyor.frozen import frozen
from conveyor.schemas.limits import (
    ATTEMPT_LOG_BYTES_MAX,
    ERROR_CLASS_BYTES_MAX,
    ERROR_MESSAGE_BYTES_MAX,
    ERROR_STACK_BYTES_MAX,
    POLL_CAPACITY_MAX,
    WORKER_ITEMS_MAX,
)
from conveyor.schemas.steps import (
    PARALLEL_CHILDREN_MAX,
    STEP_NAME_BYTES_MAX,
    STEPS_MAX,
)
from conveyor.schemas.types import (
    Completion,
    LeaseRef,
    Outcome,
    ParallelMode,
    SleepStep,
    StepOp,
    WaitStep,
)
from conveyor.streams.gateway.fields import Fields, check_task_id, describe, invalid
from conveyor.streams.gateway.payloads import check_not_marker


@frozen(kw_only=True)
class Register:
    agent_id: str
    app: str
    version: str | None
    task_types: list[str]
    pinned: list[str] | None = None  # workflow types with resume="pinned"; None: not told
    deploy: int | None = None  # the deploy number (registry.py, rule 2); None: not told
    definitions: Any = None  # the types' definitions, checked by ``registry/definitions.py``


def parse_register(body: Any) -> Register:
    f = Fields(
        body, "", {"agent_id", "app", "version", "task_types", "pinned", "deploy", "definitions"}
    )
    if not isinstance(f.raw("task_types"), list):
        f.items("task_types", 0, TASK_TYPES_MAX)  # raises, naming the field
    return Register(
        agent_id=f.req_str("agent_id"),
        app=f.req_name("app"),
        version=f.opt_str("version"),
        task_types=f.names("task_types", TASK_TYPES_MAX),
        pinned=None if f.raw("pinned") is None else f.names("pinned", TASK_TYPES_MAX),
        deploy=f.opt_int("deploy", 0, INT_MAX),
        definitions=f.raw("definitions"),
    )


@frozen(kw_only=True)
class Poll:
    agent_id: str
    app: str
    queues: list[str]
    capacity: int
    wait_ms: int
    lease_ms: int
    version: str | None = None  # the app version the agent serves: pinned workflows need it
    task_types: frozenset[str] | None = None  # the types it takes now; None: any
    open_breakers: list[str] = dataclasses.field(default_factory=list)


POLL_FIELDS = {"agent_id", "app", "version", "queues", "capacity", "wait_ms", "lease_ms"}


def parse_poll(body: Any) -> Poll:
    f = Fields(body, "", POLL_FIELDS | {"task_types", "open_breakers"})
    types = None if f.raw("task_types") is None else f.strs("task_types", TASK_TYPES_MAX)
    return Poll(
        agent_id=f.req_str("agent_id"),
        app=f.req_str("app"),
        version=f.opt_str("version"),
        queues=f.strs("queues", QUEUES_MAX),
        capacity=f.int_or("capacity", 1, POLL_CAPACITY_MAX, 8),
        wait_ms=f.int_or("wait_ms", 0, WAIT_MS_MAX, 20_000),
        lease_ms=f.int_or("lease_ms", LEASE_MS_MIN, LEASE_MS_MAX, 30_000),
        task_types=None if types is None else frozenset(types),
        open_breakers=f.strs("open_breakers", TASK_TYPES_MAX),
    )


@frozen(kw_only=True)
class Signals:
    agent_id: str
    app: str
    wait_ms: int


def parse_signals(body: Any) -> Signals:
    f = Fields(body, "", {"agent_id", "app", "wait_ms"})
    return Signals(
        agent_id=f.req_str("agent_id"),
        app=f.req_str("app"),
        wait_ms=f.int_or("wait_ms", 0, SIGNALS_WAIT_MS_MAX, 20_000),
    )


def _lease_ref(item: Any, path: str, extra: frozenset[str]) -> tuple[Fields, LeaseRef]:
    f = Fields(item, path, {"task_id", "lease_id"} | extra)
    task_id = check_task_id(f.raw("task_id"), f.at("task_id"))
    return f, LeaseRef(task_id=task_id, lease_id=f.req_int("lease_id", 0, INT_MAX))


def parse_heartbeat(body: Any) -> list[LeaseRef]:
    f = Fields(body, "", {"leases"})
    items = f.items("leases", 1, WORKER_ITEMS_MAX)
    return [_lease_ref(item, f"leases[{i}]", frozenset())[1] for i, item in enumerate(items)]


@frozen(kw_only=True)
class CompletionRequest:
    path: str
    task_id: str
    lease_id: int
    outcome: Outcome
    result: Any  # JSON; None when absent or null
    error_class: str | None
    error_message: str | None
    error_stack: str | None
    retry_after_ms: int | None
    sleep: SleepStep | None = None
    log: str | None = None  # the tail of what the attempt printed
    fan_out: FanOutRequest | None = None
    wait: WaitStep | None = None


@frozen(kw_only=True)
class FanOutRequest:
    """A FAN_OUT outcome's parallel step. ``children`` are enqueue bodies, checked by the
    gateway service against the workflow (its app is their default): a bad child fails the
    workflow (``bad_fan_out``) instead of refusing the agent's whole batch."""

    identity: str
    position: int
    mode: ParallelMode
    children: list[Any]


_OUTCOMES = {o.value: o for o in Outcome}  # looked up per completion: built once
_COMPLETION_FIELDS = frozenset(
    {"outcome", "result", "error", "retry_after_ms", "sleep", "log", "fan_out", "wait"}
)


def parse_complete(body: Any) -> list[CompletionRequest]:
    f = Fields(body, "", {"completions"})
    items = f.items("completions", 1, WORKER_ITEMS_MAX)
    return [_completion(item, f"completions[{i}]") for i, item in enumerate(items)]


def _completion(item: Any, path: str) -> CompletionRequest:
    f, ref = _lease_ref(item, path, _COMPLETION_FIELDS)
    raw = f.raw("outcome")
    outcome = _OUTCOMES.get(raw) if isinstance(raw, str) else None
    if outcome is None:
        raise invalid(f.at("outcome"), f"must be one of {'|'.join(_OUTCOMES)}, got {describe(raw)}")
    error = f.obj("error", {"class", "message", "stack"})
    check_not_marker(f.raw("result"), f.at("result"))
    return CompletionRequest(
        path=path,
        task_id=ref.task_id,
        lease_id=ref.lease_id,
        outcome=outcome,
        result=f.raw("result"),
        error_class=error.opt_text("class", bytes_max=ERROR_CLASS_BYTES_MAX) if error else None,
        error_message=error.opt_text("message", bytes_max=ERROR_MESSAGE_BYTES_MAX)
        if error
        else None,
        error_stack=error.opt_text("stack", bytes_max=ERROR_STACK_BYTES_MAX) if error else None,
        retry_after_ms=f.opt_int("retry_after_ms", 0, DURATION_MS_MAX),
        sleep=_sleep(f),
        log=f.opt_text("log", bytes_max=ATTEMPT_LOG_BYTES_MAX),
        fan_out=_fan_out(f),
        wait=_wait(f),
    )


def _wait(f: Fields) -> WaitStep | None:
    s = f.obj("wait", {"identity", "position", "name", "timeout_ms"})
    if s is None:
        if f.raw("outcome") == Outcome.WAIT_EVENT:
            raise invalid(f.at("wait"), "is required with outcome WAIT_EVENT")
        return None
    identity = s.opt_text("identity", bytes_max=IDENTITY_BYTES_MAX, nul_ok=False)
    name = s.opt_text("name", bytes_max=STEP_NAME_BYTES_MAX)
    if not identity or not name:
        raise invalid(s.at("identity" if not identity else "name"), "is required")
    return WaitStep(
        identity=identity,
        position=s.req_int("position", -1, STEPS_MAX),
        name=name,
        timeout_ms=s.opt_int("timeout_ms", 0, DURATION_MS_MAX),
    )


def _fan_out(f: Fields) -> FanOutRequest | None:
    s = f.obj("fan_out", {"identity", "position", "mode", "children"})
    if s is None:
        if f.raw("outcome") == Outcome.FAN_OUT:
            raise invalid(f.at("fan_out"), "is required with outcome FAN_OUT")
        return None
    identity = s.opt_text("identity", bytes_max=IDENTITY_BYTES_MAX, nul_ok=False)
    if not identity:
        raise invalid(s.at("identity"), "is required")
    mode = s.raw("mode")
    if mode not in (ParallelMode.COLLECT, ParallelMode.FAIL_FAST):
        raise invalid(s.at("mode"), f"must be COLLECT|FAIL_FAST, got {describe(mode)}")
    return FanOutRequest(
        identity=identity,
        position=s.req_int("position", -1, STEPS_MAX),
        mode=ParallelMode(mode),
        children=s.items("children", 1, PARALLEL_CHILDREN_MAX),
    )


def bad_fan_out(completion: Completion, why: str) -> Completion:
    """A fan-out whose children cannot be enqueued fails its workflow without retries: the same
    code would ask for the same children again."""
    return dataclasses.replace(
        completion,
        outcome=Outcome.FATAL,
        error_class="BadFanOut",
        error_message=f"ctx.parallel step: {why}",
        fan_out=None,
    )


def _sleep(f: Fields) -> SleepStep | None:
    s = f.obj("sleep", {"identity", "position", "sleep_ms", "wake_at_ms"})
    if s is None:
        if f.raw("outcome") == Outcome.SLEEP:
            raise invalid(f.at("sleep"), "is required with outcome SLEEP")
        return None
    identity = s.opt_text("identity", bytes_max=IDENTITY_BYTES_MAX, nul_ok=False)
    if not identity:
        raise invalid(s.at("identity"), "is required")
    return SleepStep(
        identity=identity,
        position=s.req_int("position", -1, STEPS_MAX),
        sleep_ms=s.opt_int("sleep_ms", 0, INT_MAX),
        wake_at_ms=s.opt_int("wake_at_ms", 0, INT_MAX),
    )


@frozen(kw_only=True)
class StepRequest:
    path: str
    task_id: str
    lease_id: int
    op: StepOp
    identity: str
    position: int
    value: Any  # JSON; COMMIT only


def parse_steps(body: Any) -> list[StepRequest]:
    f = Fields(body, "", {"steps"})
    items = f.items("steps", 1, WORKER_ITEMS_MAX)
    return [_step(item, f"steps[{i}]") for i, item in enumerate(items)]


def _step(item: Any, path: str) -> StepRequest:
    f, ref = _lease_ref(item, path, frozenset({"op", "identity", "position", "value"}))
    op = f.raw("op")
    if op not in (StepOp.CLAIM, StepOp.COMMIT):
        raise invalid(f.at("op"), f"must be CLAIM|COMMIT, got {describe(op)}")
    identity = f.opt_text("identity", bytes_max=IDENTITY_BYTES_MAX, nul_ok=False)
    if not identity:
        raise invalid(f.at("identity"), "is required")
    check_not_marker(f.raw("value"), f.at("value"))
    return StepRequest(
        path=path,
        task_id=ref.task_id,
        lease_id=ref.lease_id,
        op=StepOp(op),
        identity=identity,
        position=f.req_int("position", -1, STEPS_MAX),
        value=f.raw("value"),
    )


@frozen(kw_only=True)
class CheckpointRequest:
    path: str
    task_id: str
    lease_id: int
    value: Any


def parse_checkpoint(body: Any) -> list[CheckpointRequest]:
    f = Fields(body, "", {"checkpoints"})
    out = []
    for i, item in enumerate(f.items("checkpoints", 1, WORKER_ITEMS_MAX)):
        c, ref = _lease_ref(item, f"checkpoints[{i}]", frozenset({"value"}))
        check_not_marker(c.raw("value"), c.at("value"))
        out.append(
            CheckpointRequest(
                path=c.path, task_id=ref.task_id, lease_id=ref.lease_id, value=c.raw("value")
            )
        )
    return out
