"""Worker API requests (host agents): decoded through the contract's models, then checked for
what a type cannot state.

Each body is decoded by ``decode.model`` into its model in ``contract/requests.py`` (the one the
OpenAPI document is written from), so a refusal names the field as ``fields.py`` rule 2 says:
``completions[0].outcome: must be one of SUCCEEDED|..., got "DONE"``. What no type states is
checked after decoding, naming the field the same way: byte limits of non-ASCII text
(``conveyor.contract.shapes`` rule 2), blob markers in results and step values, and the step
an outcome needs (``Completion.rules``: SLEEP needs ``sleep``, FAN_OUT ``fan_out``,
WAIT_EVENT ``wait``). The handlers get the plain values below, as before.

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
from collections.abc import Iterable
from typing import Any

from conveyor.contract.limits import IDENTITY_BYTES_MAX
from conveyor.frozen import frozen
from conveyor.schemas.limits import (
    ATTEMPT_LOG_BYTES_MAX,
    ERROR_CLASS_BYTES_MAX,
    ERROR_MESSAGE_BYTES_MAX,
    ERROR_STACK_BYTES_MAX,
)
from conveyor.schemas.steps import STEP_NAME_BYTES_MAX
from conveyor.schemas.types import (
    Completion,
    LeaseRef,
    Outcome,
    ParallelMode,
    SleepStep,
    StepOp,
    WaitStep,
)
from conveyor.streams.gateway.contract import decode
from conveyor.streams.gateway.contract import requests as req
from conveyor.streams.gateway.contract.decode import (
    check_bytes,
    check_text,
)
from conveyor.streams.gateway.fields import invalid, join
from conveyor.streams.gateway.payloads import check_not_marker

POLL_CAPACITY_DEFAULT = 8
POLL_WAIT_MS_DEFAULT = 20_000
POLL_LEASE_MS_DEFAULT = 30_000
SIGNALS_WAIT_MS_DEFAULT = 20_000


def _bytes(text: str | None, path: str, bytes_max: int) -> None:
    """Free text and step identities: any character but U+0000 where stated, so only their
    byte limit is left to check (``conveyor.contract.shapes`` rule 2)."""
    if text is not None:
        check_bytes(text, path, bytes_max)


def _texts(values: Iterable[str] | None, path: str) -> None:
    for i, value in enumerate(values or ()):
        check_text(value, f"{path}[{i}]")


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
    m = decode.model(body, req.Register)
    check_text(m.agent_id, "agent_id")
    check_text(m.version, "version")
    return Register(
        agent_id=m.agent_id,
        app=m.app,
        version=m.version,
        task_types=m.task_types,
        pinned=m.pinned,
        deploy=m.deploy,
        definitions=m.definitions,
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


def parse_poll(body: Any) -> Poll:
    m = decode.model(body, req.Poll)
    check_text(m.agent_id, "agent_id")
    check_text(m.app, "app")
    check_text(m.version, "version")
    _texts(m.queues, "queues")
    _texts(m.task_types, "task_types")
    _texts(m.open_breakers, "open_breakers")
    return Poll(
        agent_id=m.agent_id,
        app=m.app,
        version=m.version,
        queues=m.queues or [],
        capacity=POLL_CAPACITY_DEFAULT if m.capacity is None else m.capacity,
        wait_ms=POLL_WAIT_MS_DEFAULT if m.wait_ms is None else m.wait_ms,
        lease_ms=POLL_LEASE_MS_DEFAULT if m.lease_ms is None else m.lease_ms,
        task_types=None if m.task_types is None else frozenset(m.task_types),
        open_breakers=m.open_breakers or [],
    )


@frozen(kw_only=True)
class Signals:
    agent_id: str
    app: str
    wait_ms: int


def parse_signals(body: Any) -> Signals:
    m = decode.model(body, req.SignalsRequest)
    check_text(m.agent_id, "agent_id")
    check_text(m.app, "app")
    return Signals(
        agent_id=m.agent_id,
        app=m.app,
        wait_ms=SIGNALS_WAIT_MS_DEFAULT if m.wait_ms is None else m.wait_ms,
    )


def parse_heartbeat(body: Any) -> list[LeaseRef]:
    m = decode.model(body, req.LeaseRefs)
    return [LeaseRef(task_id=r.task_id, lease_id=r.lease_id) for r in m.leases]


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
_NO_ERROR = req.ErrorInfo()


def parse_complete(body: Any) -> list[CompletionRequest]:
    m = decode.model(body, req.Completions)
    return [_completion(item, f"completions[{i}]") for i, item in enumerate(m.completions)]


def _completion(c: req.Completion, path: str) -> CompletionRequest:
    """``Completion.rules`` and the byte limits, then the plain values."""
    check_not_marker(c.result, join(path, "result"))
    error = c.error or _NO_ERROR
    _bytes(error.class_, join(path, "error.class"), ERROR_CLASS_BYTES_MAX)
    _bytes(error.message, join(path, "error.message"), ERROR_MESSAGE_BYTES_MAX)
    _bytes(error.stack, join(path, "error.stack"), ERROR_STACK_BYTES_MAX)
    _bytes(c.log, join(path, "log"), ATTEMPT_LOG_BYTES_MAX)
    return CompletionRequest(
        path=path,
        task_id=c.task_id,
        lease_id=c.lease_id,
        outcome=_OUTCOMES[c.outcome],
        result=c.result,
        error_class=error.class_,
        error_message=error.message,
        error_stack=error.stack,
        retry_after_ms=c.retry_after_ms,
        sleep=_sleep(c, path),
        log=c.log,
        fan_out=_fan_out(c, path),
        wait=_wait(c, path),
    )


def _needed(c: req.Completion, name: str, path: str) -> None:
    """The step an outcome needs is there (``Completion.rules``)."""
    if c.outcome == _NEEDS.get(name):
        raise invalid(join(path, name), f"is required with outcome {c.outcome}")


_NEEDS = {"sleep": Outcome.SLEEP, "fan_out": Outcome.FAN_OUT, "wait": Outcome.WAIT_EVENT}


def _wait(c: req.Completion, path: str) -> WaitStep | None:
    s = c.wait
    if s is None:
        _needed(c, "wait", path)
        return None
    _bytes(s.identity, join(path, "wait.identity"), IDENTITY_BYTES_MAX)
    _bytes(s.name, join(path, "wait.name"), STEP_NAME_BYTES_MAX)
    return WaitStep(identity=s.identity, position=s.position, name=s.name, timeout_ms=s.timeout_ms)


def _fan_out(c: req.Completion, path: str) -> FanOutRequest | None:
    s = c.fan_out
    if s is None:
        _needed(c, "fan_out", path)
        return None
    _bytes(s.identity, join(path, "fan_out.identity"), IDENTITY_BYTES_MAX)
    return FanOutRequest(
        identity=s.identity, position=s.position, mode=ParallelMode(s.mode), children=s.children
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


def _sleep(c: req.Completion, path: str) -> SleepStep | None:
    s = c.sleep
    if s is None:
        _needed(c, "sleep", path)
        return None
    _bytes(s.identity, join(path, "sleep.identity"), IDENTITY_BYTES_MAX)
    return SleepStep(
        identity=s.identity, position=s.position, sleep_ms=s.sleep_ms, wake_at_ms=s.wake_at_ms
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


_OPS = {o.value: o for o in StepOp}


def parse_steps(body: Any) -> list[StepRequest]:
    m = decode.model(body, req.Steps)
    return [_step(item, f"steps[{i}]") for i, item in enumerate(m.steps)]


def _step(s: req.StepItem, path: str) -> StepRequest:
    _bytes(s.identity, join(path, "identity"), IDENTITY_BYTES_MAX)
    check_not_marker(s.value, join(path, "value"))
    return StepRequest(
        path=path,
        task_id=s.task_id,
        lease_id=s.lease_id,
        op=_OPS[s.op],
        identity=s.identity,
        position=s.position,
        value=s.value,
    )


@frozen(kw_only=True)
class CheckpointRequest:
    path: str
    task_id: str
    lease_id: int
    value: Any


def parse_checkpoint(body: Any) -> list[CheckpointRequest]:
    m = decode.model(body, req.Checkpoints)
    out = []
    for i, c in enumerate(m.checkpoints):
        path = f"checkpoints[{i}]"
        check_not_marker(c.value, join(path, "value"))
        out.append(
            CheckpointRequest(path=path, task_id=c.task_id, lease_id=c.lease_id, value=c.value)
        )
    return out
