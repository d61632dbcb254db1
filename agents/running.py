"""One attempt as the host agent tracks it: its lease, its sandbox, its stop and kill times.

The lease id lives here and never goes further: the sandbox reports through this object
(``Hooks``), and the agent turns those reports into calls that carry the lease.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from enum import Enum
from typing import Any, Final

from conveyor.agents.sandbox import AttemptResult, Sandbox
from conveyor.agents.worker_api import CompletionItem, LeaseOffer
from conveyor.schemas.limits import (
    ERROR_CLASS_BYTES_MAX,
    ERROR_MESSAGE_BYTES_MAX,
    ERROR_STACK_BYTES_MAX,
)
from conveyor.steps import StepAck


class _Nothing(Enum):
    NOTHING = "NOTHING"


NOTHING: Final = _Nothing.NOTHING  # "no checkpoint pending" (None is a valid checkpoint)

DAY_MS = 86_400_000

# A CANCEL seen this close to the local start_to_close deadline is the platform's timeout,
# not a user's cancel: our clock started a little after the platform's, never before.
STC_SLACK_MS = 1_000


# How the agent records a step for an attempt: (run, op, identity, position, value) -> ack.
StepWriter = Callable[["Running", str, str, int, Any], Awaitable[StepAck]]


async def _no_steps(run: Running, op: str, identity: str, position: int, value: Any) -> StepAck:
    return StepAck(ok=False, transient=True, reason="this agent records no steps")


class Running:
    def __init__(
        self,
        offer: LeaseOffer,
        *,
        started_ms: float,
        grace_ms: int,
        step_writer: StepWriter = _no_steps,
    ) -> None:
        self.offer = offer
        self._step_writer = step_writer
        self.started_ms = started_ms
        self.grace_ms = grace_ms
        stc = offer.start_to_close_ms
        self.deadline_ms: float | None = None if stc is None else started_ms + stc
        self.sandbox: Sandbox | None = None
        self.stop_reason: str | None = None  # CANCEL | START_TO_CLOSE
        self.stopped_ms: float | None = None
        self.kill_at_ms: float | None = None
        self.kill_reason: str | None = None
        self.lost = False
        self.checkpoint: Any = NOTHING  # newest value not yet sent
        self.progress: Any = None

    # -- Hooks: called by the sandbox -------------------------------------------------------

    def on_heartbeat(self, progress: Any) -> None:
        self.progress = progress

    def on_checkpoint(self, value: Any) -> None:
        self.checkpoint = value

    async def on_step(self, op: str, identity: str, position: int, value: Any) -> StepAck:
        return await self._step_writer(self, op, identity, position, value)

    # -- driven by the agent ----------------------------------------------------------------

    def attach(self, sandbox: Sandbox) -> None:
        """The sandbox is up: deliver a stop or kill that came while it was starting."""
        self.sandbox = sandbox
        if self.kill_reason is not None:
            sandbox.kill(self.kill_reason)
        elif self.stop_reason is not None:
            sandbox.cancel()

    @property
    def started(self) -> bool:
        """Its handler may be running: a sandbox took it, with no attempt ahead of it."""
        return self.sandbox is not None and not self.sandbox.queued

    def stop(self, reason: str, now_ms: float) -> bool:
        """Ask the handler to stop; the kill comes after the grace. False if already asked."""
        if self.stop_reason is not None or self.kill_reason is not None:
            return False
        self.stop_reason = reason
        self.stopped_ms = now_ms
        self.kill_at_ms = now_ms + self.grace_ms
        self.deadline_ms = None
        if self.sandbox is not None:
            self.sandbox.cancel()
        return True

    def kill(self, reason: str) -> None:
        if self.kill_reason is not None:
            return
        self.kill_reason = reason
        self.kill_at_ms = None
        self.deadline_ms = None
        if self.sandbox is not None:
            self.sandbox.kill(reason)

    def next_deadlines(self) -> list[float]:
        return [t for t in (self.deadline_ms, self.kill_at_ms) if t is not None]

    def completion(self, result: AttemptResult) -> CompletionItem:
        # What a guest reports is untrusted: clip it to the protocol's limits so one bad
        # report cannot get a whole batch of completions rejected.
        retry_after = result.retry_after_ms
        return CompletionItem(
            task_id=self.offer.task_id,
            lease_id=self.offer.lease_id,
            outcome=result.outcome,
            result=result.result,
            error_class=clip(result.error_class, ERROR_CLASS_BYTES_MAX),
            error_message=clip(result.error_message, ERROR_MESSAGE_BYTES_MAX),
            error_stack=clip(result.error_stack, ERROR_STACK_BYTES_MAX, keep_end=True),
            retry_after_ms=None if retry_after is None else min(max(0, retry_after), DAY_MS * 365),
            log_ref=result.log_ref,
            sleep=result.sleep if result.outcome == "SLEEP" else None,
            fan_out=result.fan_out if result.outcome == "FAN_OUT" else None,
            wait=result.wait if result.outcome == "WAIT_EVENT" else None,
        )


def clip(text: str | None, bytes_max: int, *, keep_end: bool = False) -> str | None:
    """``text`` cut to ``bytes_max`` bytes of UTF-8 (a stack keeps its end: the raise)."""
    if text is None:
        return None
    raw = text.encode("utf-8", "replace")
    if len(raw) <= bytes_max:
        return text
    cut = raw[-bytes_max:] if keep_end else raw[:bytes_max]
    return cut.decode("utf-8", "ignore")


def final_result(run: Running, result: AttemptResult) -> AttemptResult:
    """What to report: once the attempt was asked to stop, the reason decides, not the
    handler (it may have returned, raised, or been killed); a canceled handler's return value
    goes with the CANCELED outcome."""
    if run.stop_reason is None or run.stopped_ms is None:
        return result
    stc = run.offer.start_to_close_ms
    killed = run.kill_reason is not None
    timed_out = run.stop_reason == "START_TO_CLOSE" or (
        stc is not None and run.stopped_ms - run.started_ms >= stc - STC_SLACK_MS
    )
    if timed_out:
        how = "killed after the cancel grace" if killed else "stopped when asked"
        return AttemptResult(
            outcome="FAILED",
            error_class="StartToCloseTimeout",
            error_message=f"the attempt ran past start_to_close ({stc} ms); {how}",
            log_ref=result.log_ref,
        )
    how = "killed after the cancel grace" if killed else "the handler stopped"
    return AttemptResult(
        outcome="CANCELED",
        # What a handler returned when it stopped on the cancel (say, how far it got) is kept
        # with the canceled task.
        result=result.result if result.outcome == "SUCCEEDED" and not killed else None,
        error_class="Canceled",
        error_message=f"canceled while running; {how}",
        log_ref=result.log_ref,
    )
