"""Run one handler call and turn what happened into an ``AttemptResult``.

Shared by the guest stub and the in-process executor, so a handler behaves the same in
``conveyor.testing`` and in production. The mapping:

    returned a JSON value           SUCCEEDED (a value JSON cannot carry is FATAL: a retry
                                    of the same code returns the same kind of value); with
                                    the app's codec, the payload is decoded before the call
                                    (a CodecError fails the attempt) and the result encoded
    raised FatalError               FATAL
    raised a non_retryable error    FATAL (matched by class, so subclasses count)
    raised RetryableError           FAILED, with retry_after_ms when it gave retry_after
    raised ctx's Cancelled          CANCELED
    raised anything else            FAILED; the platform retries per policy
    step.sleep                      SLEEP (the attempt ends; no retry is spent)
    ctx.parallel (first call)       FAN_OUT (the attempt ends; the children run; no retry spent)
    ctx.wait_for_event (no event)   WAIT_EVENT (the attempt ends until the event; no retry spent)
    a step divergence or overlap    FATAL (the same code would do it again)
    a lost lease (a refused step)   FAILED; the agent drops it anyway
    swallowed one of those three    FATAL, naming what was swallowed, whatever it returned

A compensating attempt (a canceled workflow, ``conveyor.steps`` rule 6) ends however its replay
ended; then its compensations run and it reports CANCELED, or FAILED (FATAL when the cause is
a ``FatalError``) as ``CompensationFailed`` when one raised. A lost lease stays a lost lease.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import inspect
import json
import sys
import traceback
from typing import Any

from conveyor.agents.sandbox import AttemptResult
from conveyor.app import App, TaskType
from conveyor.codecs import CodecError, decode_value, encode_value
from conveyor.context import Cancelled, Context, running
from conveyor.errors import ContractError, FatalError, RetryableError
from conveyor.loops import run_awaitable
from conveyor.signals import (
    ClaimLost,
    CompensationFailed,
    FanOut,
    Sleep,
    StepSignal,
    WaitEvent,
)

STACK_CHARS_MAX = 16 * 1024
MESSAGE_CHARS_MAX = 4 * 1024
UNKNOWN_TASK_TYPE = "UnknownTaskType"


def load_app(ref: str) -> App:
    """The App named by ``"package.module:attr"``."""
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ContractError(f"app reference {ref!r} is not 'module:attr'", field="app")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, App):
        raise ContractError(f"{ref} is a {type(obj).__name__}, not a conveyor.App", field="app")
    return obj


def app_ref_of(app: App) -> str | None:
    """A ``module:attr`` a fresh process can import to find ``app``, if there is one."""
    module = sys.modules.get(app.module)
    if module is None or app.module == "__main__":
        return None
    for name, value in vars(module).items():
        if value is app:
            return f"{app.module}:{name}"
    return None


def unknown_type(app: App, task_type: str) -> AttemptResult:
    # FAILED, not FATAL: another agent with a newer version of the app may know the type.
    return AttemptResult(
        outcome="FAILED",
        error_class=UNKNOWN_TASK_TYPE,
        error_message=f"app {app.name} version {app.version} has no task type {task_type!r}",
    )


def run_sync(task: TaskType[Any, Any], ctx: Context, payload: Any) -> AttemptResult:
    """Call the handler in this thread (an async handler runs on the thread's long-lived
    event loop, ``conveyor.loops``: the same loop for every attempt of this guest)."""
    result = _run_sync(task, ctx, payload)
    return compensated(task, ctx, result) if ctx.step.compensating else result


def _run_sync(task: TaskType[Any, Any], ctx: Context, payload: Any) -> AttemptResult:
    try:
        with running(ctx):
            value = task.invoke(ctx, decode_value(ctx.codec, payload))
            if inspect.isawaitable(value):
                value = run_awaitable(value)
    except StepSignal as exc:
        return signal_of(ctx, exc)
    except Cancelled as exc:
        return latched(ctx) or canceled(str(exc))
    except (Exception, SystemExit) as exc:
        return latched(ctx) or failed(task, exc)
    return latched(ctx) or succeeded(ctx, value)


async def run_async(task: TaskType[Any, Any], ctx: Context, payload: Any) -> AttemptResult:
    """Call an async handler in the running loop (its compensations in a thread)."""
    result = await _run_async(task, ctx, payload)
    if ctx.step.compensating:
        return await asyncio.to_thread(compensated, task, ctx, result)
    return result


async def _run_async(task: TaskType[Any, Any], ctx: Context, payload: Any) -> AttemptResult:
    try:
        with running(ctx):
            value = task.invoke(ctx, decode_value(ctx.codec, payload))
            if inspect.isawaitable(value):
                value = await value
    except StepSignal as exc:
        return signal_of(ctx, exc)
    except Cancelled as exc:
        return latched(ctx) or canceled(str(exc))
    except (Exception, SystemExit) as exc:
        return latched(ctx) or failed(task, exc)
    return latched(ctx) or succeeded(ctx, value)


def compensated(task: TaskType[Any, Any], ctx: Context, replayed: AttemptResult) -> AttemptResult:
    """The end of a compensating attempt whose replay ended as ``replayed``."""
    if isinstance(ctx.step.signal, ClaimLost):
        return replayed  # the lease is gone: the next attempt compensates
    try:
        count = ctx.step.compensate_all()
    except StepSignal as exc:
        return signal_result(exc)
    except CompensationFailed as exc:
        result = failed(task, exc.cause)
        return dataclasses.replace(
            result, error_class="CompensationFailed", error_message=str(exc)[:MESSAGE_CHARS_MAX]
        )
    except Exception as exc:  # a refused or unreachable step
        return failed(task, exc)
    return canceled(f"canceled after {count} compensation(s)")


def signal_of(ctx: Context, raised: StepSignal) -> AttemptResult:
    """The signal that unwound the body, unless the body had swallowed an earlier one."""
    signal = ctx.step.signal
    if signal is None or raised is signal:
        return signal_result(raised)
    return swallowed(signal)


def latched(ctx: Context) -> AttemptResult | None:
    """A body that caught a step signal and went on (returned, or raised something else)
    fails naming what it swallowed; None when no signal was raised."""
    signal = ctx.step.signal
    return None if signal is None else swallowed(signal)


def swallowed(signal: StepSignal) -> AttemptResult:
    return AttemptResult(
        outcome="FATAL",
        error_class="SwallowedSignal",
        error_message=(
            f"the task body swallowed {type(signal).__name__} ({signal}) and went on; "
            "step signals must unwind the body: do not catch BaseException around steps"
        )[:MESSAGE_CHARS_MAX],
    )


def signal_result(signal: StepSignal) -> AttemptResult:
    if isinstance(signal, FanOut):
        return AttemptResult(
            outcome="FAN_OUT",
            fan_out={
                "identity": signal.identity,
                "position": signal.position,
                "mode": signal.mode,
                "children": signal.children,
            },
        )
    if isinstance(signal, WaitEvent):
        wait = {"identity": signal.identity, "position": signal.position, "name": signal.name}
        return AttemptResult(outcome="WAIT_EVENT", wait={**wait, "timeout_ms": signal.timeout_ms})
    if isinstance(signal, Sleep):
        return AttemptResult(
            outcome="SLEEP",
            sleep={
                "identity": signal.identity,
                "position": signal.position,
                "sleep_ms": signal.sleep_ms,
                "wake_at_ms": signal.wake_at_ms,
            },
        )
    return AttemptResult(
        outcome="FAILED" if isinstance(signal, ClaimLost) else "FATAL",
        error_class=signal.error_class,
        error_message=str(signal)[:MESSAGE_CHARS_MAX],
    )


def succeeded(ctx: Context | None, value: Any) -> AttemptResult:
    if ctx is not None:
        ctx.step.finished()
    try:
        json.dumps(value, allow_nan=False)  # NaN and the infinities are not JSON
    except (TypeError, ValueError) as exc:
        return AttemptResult(
            outcome="FATAL",
            error_class="ResultNotSerializable",
            error_message=f"the handler returned a {type(value).__name__}, not JSON: {exc}",
        )
    if ctx is not None and ctx.codec is not None:
        try:
            value = encode_value(ctx.codec, value)
        except CodecError as exc:  # the key provider failed: another attempt may succeed
            return AttemptResult(outcome="FAILED", error_class="CodecError", error_message=str(exc))
    return AttemptResult(outcome="SUCCEEDED", result=value)


def canceled(message: str) -> AttemptResult:
    return AttemptResult(outcome="CANCELED", error_class="Canceled", error_message=message)


def failed(task: TaskType[Any, Any], exc: BaseException) -> AttemptResult:
    fatal = isinstance(exc, FatalError) or task.options.retry.matches(exc)
    retry_after_ms = None
    if isinstance(exc, RetryableError) and exc.retry_after is not None:
        retry_after_ms = max(0, round(exc.retry_after * 1000))
    stack = "".join(traceback.format_exception(exc))
    message = str(exc)
    if isinstance(exc, MemoryError) and not message:
        message = "out of memory (the guest's memory limit, if one is set)"
    return AttemptResult(
        outcome="FATAL" if fatal else "FAILED",
        error_class=type(exc).__name__,
        error_message=message[:MESSAGE_CHARS_MAX],
        error_stack=stack[-STACK_CHARS_MAX:],
        retry_after_ms=retry_after_ms,
    )
