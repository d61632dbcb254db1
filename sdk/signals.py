"""What unwinds a task body, and the step errors (``conveyor.steps`` rules 5 and 6).

Signals are BaseException, so ``except Exception`` in user code cannot swallow them; each ends
the attempt on the platform's behalf (a sleep, a fan-out, a wait, a divergence, a lost lease,
compensating mode). The errors are ordinary exceptions with the platform's retry semantics.
"""

from __future__ import annotations

from typing import Any

from conveyor.errors import FatalError, TransientError

# -- signals: BaseException, so ``except Exception`` in user code cannot swallow them ---------


class StepSignal(BaseException):
    """Unwinds the task body on the platform's behalf."""

    error_class = "StepSignal"


class Sleep(StepSignal):
    """``step.sleep`` ends the attempt; the task comes back at the deadline."""

    error_class = "Sleep"

    def __init__(
        self, identity: str, position: int, *, sleep_ms: int | None, wake_at_ms: int | None
    ) -> None:
        super().__init__(f"sleeping at step {identity!r}")
        self.identity = identity
        self.position = position
        self.sleep_ms = sleep_ms
        self.wake_at_ms = wake_at_ms


class FanOut(StepSignal):
    """``ctx.parallel`` ends the attempt; the task comes back when the children are done."""

    error_class = "FanOut"

    def __init__(
        self, identity: str, position: int, *, mode: str, children: list[dict[str, Any]]
    ) -> None:
        super().__init__(f"fanning out at step {identity!r} to {len(children)} children")
        self.identity = identity
        self.position = position
        self.mode = mode
        self.children = children


class WaitEvent(StepSignal):
    """``ctx.wait_for_event`` ends the attempt; the task comes back with the event."""

    error_class = "WaitEvent"

    def __init__(self, identity: str, position: int, *, name: str, timeout_ms: int | None) -> None:
        super().__init__(f"waiting for event {name!r} at step {identity!r}")
        self.identity = identity
        self.position = position
        self.name = name
        self.timeout_ms = timeout_ms


class Divergence(StepSignal):
    error_class = "StepDivergence"


class StepsOverlapped(StepSignal):
    error_class = "StepsOverlapped"


class ClaimLost(StepSignal):
    error_class = "LeaseLost"


class Compensate(StepSignal):
    """Compensating mode (rule 6): the replay reached the first step the canceled task had not
    committed; the body stops there and the compensations run."""

    error_class = "Compensate"

    def __init__(self, identity: str) -> None:
        super().__init__(f"canceled: compensating before step {identity!r}")
        self.identity = identity


# -- ordinary errors ---------------------------------------------------------------------------


class StepRefused(FatalError):
    """A step the code asked for cannot be: a bad name or key, a duplicate identity, a value
    too large or not JSON. The same code would ask again, so the task fails without retries."""


class StepUnavailable(TransientError):
    """The step store could not be reached; the attempt fails and is retried."""


class CompensationFailed(Exception):
    """The compensation of a committed step raised (rule 6). The attempt fails and is retried
    per the task's retry policy (at once FATAL when the cause is a ``FatalError``); the task
    ends FAILED, with this message, when the retries run out."""

    def __init__(self, identity: str, cause: BaseException) -> None:
        super().__init__(
            f"compensation of step {identity!r} failed: {type(cause).__name__}: {cause}"
        )
        self.identity = identity
        self.cause = cause
