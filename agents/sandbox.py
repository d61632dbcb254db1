"""Where an attempt runs: the ``Executor`` and ``Sandbox`` protocols the host agent drives.

Two executors exist: ``pool.GuestPool`` (guest processes: the production one) and
``inline.InlineExecutor`` (in-process, for ``conveyor.testing``). A sandbox only ever learns a
``Job`` (no lease id, no credentials) and reports through ``Hooks``; the agent owns the lease.
"""

from __future__ import annotations

from dataclasses import field
from typing import Any, Protocol

from conveyor.frozen import frozen
from conveyor.steps import StepAck

GUEST_CRASHED = "GuestCrashed"


@frozen(kw_only=True)
class Job:
    task_id: str
    task_type: str
    attempt: int
    payload: Any
    checkpoint: Any
    steps: list[dict[str, Any]] = field(default_factory=list)  # the lease's step snapshot
    started_ms: int = 0  # when the lease was granted (platform time)
    run_key: str | None = None
    compensating: bool = False  # a canceled workflow's attempt: run its compensations
    trace_context: dict[str, str] | None = None  # the enqueue's, for the attempt's span


@frozen(kw_only=True)
class AttemptResult:
    outcome: str  # SUCCEEDED | FAILED | FATAL | CANCELED | ... | RELEASED (never_started)
    result: Any = None
    error_class: str | None = None
    error_message: str | None = None
    error_stack: str | None = None
    retry_after_ms: int | None = None
    log_ref: str | None = None
    crashed: bool = False  # the sandbox died on its own (counts for the circuit breaker)
    sleep: dict[str, Any] | None = None  # outcome SLEEP: identity, position, sleep_ms, wake_at_ms
    # outcome FAN_OUT: identity, position, mode, children (enqueue bodies)
    fan_out: dict[str, Any] | None = None
    wait: dict[str, Any] | None = None  # outcome WAIT_EVENT: identity, position, name, timeout_ms


TRUNCATED = "[... earlier output not kept ...]\n"


def read_log(log_ref: str) -> str:
    """The output of one attempt from its ``log_ref`` (``path`` or ``path#start-end``)."""
    return read_log_tail(log_ref, None)


def read_log_tail(log_ref: str, bytes_max: int | None) -> str:
    """At most ``bytes_max`` bytes (as UTF-8) of an attempt's output: its end, marked when cut;
    "" when the output is gone (a guest's log file is the agent's, and may have been removed)."""
    path, _, span = log_ref.partition("#")
    try:
        with open(path, "rb") as fh:
            start, end = (int(n) for n in span.split("-")) if span else (0, fh.seek(0, 2))
            first = start if bytes_max is None else max(start, end - bytes_max)
            fh.seek(first)
            text = fh.read(end - first).decode(errors="replace")
    except OSError:
        return ""
    if bytes_max is None:
        return text
    body = text.encode()
    if first == start and len(body) <= bytes_max:
        return text
    # Cut at the front (a replaced byte may have grown to three): keep the newest output.
    return TRUNCATED + body[len(body) - (bytes_max - len(TRUNCATED)) :].decode(errors="ignore")


def never_started(why: str) -> AttemptResult:
    """An attempt taken back before its handler started (the agent is stopping, the lease
    was lost, or it was canceled while waiting): the node puts the task back in its queue
    without counting an attempt. A stop reason, if any, still decides (``final_result``)."""
    return AttemptResult(
        outcome="RELEASED", error_class="Killed", error_message=f"{why}; never started"
    )


def crashed(message: str, log_ref: str | None = None) -> AttemptResult:
    return AttemptResult(
        outcome="FAILED",
        error_class=GUEST_CRASHED,
        error_message=message,
        log_ref=log_ref,
        crashed=True,
    )


class Hooks(Protocol):
    """What a running attempt reports to the agent; called on the agent's event loop."""

    def on_heartbeat(self, progress: Any) -> None: ...

    def on_checkpoint(self, value: Any) -> None: ...

    async def on_step(self, op: str, identity: str, position: int, value: Any) -> StepAck:
        """A step claim or commit; answered once the platform made it durable or refused."""
        ...


class Sandbox(Protocol):
    pid: int | None

    @property
    def queued(self) -> bool:
        """Taken, but not started: it waits behind another attempt in the same process."""
        ...

    async def wait(self) -> AttemptResult:
        """The attempt's result. After ``kill`` it still returns (a crashed result)."""
        ...

    def cancel(self) -> None:
        """Ask the handler to stop: ``ctx.cancelled`` becomes True."""
        ...

    def kill(self, reason: str) -> None:
        """Stop the attempt now, whatever it is doing."""
        ...


class Executor(Protocol):
    # Attempts it takes beyond the agent's concurrency, each queued behind a running one.
    queued_max: int

    async def start(self) -> None: ...

    async def launch(self, job: Job, hooks: Hooks) -> Sandbox: ...

    async def close(self) -> None: ...
