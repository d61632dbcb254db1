"""A circuit breaker per (app, task type), tripped by guest crashes: a poison task that crashes
its guest again and again pauses dispatch of its type to this agent, and of nothing else.

    CLOSED --(crashes_max crashes within window_s)--> OPEN --(cooldown_s)--> HALF_OPEN
    HALF_OPEN --(an attempt of the type ends without a crash)--> CLOSED
    HALF_OPEN --(a crash)--> OPEN again

While a type's breaker is OPEN the agent's polls leave the type out (a poll names the types it
takes: ``streams/processor/pool.py``) and name it in ``open_breakers``, so the node shows it
(``conveyor_agent_breaker_open`` on ``/metrics``, the dashboard's queues view); its other types
go on being claimed. A lease of an open type that reaches the agent anyway (granted to a poll
sent before the breaker opened) is handed back unstarted (RELEASED: no attempt spent). An agent
serves one app, so its breakers are keyed by task type. Every change of state is logged.
Handler exceptions are not crashes: retries handle those.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from enum import StrEnum

from conveyor.frozen import frozen

log = logging.getLogger("conveyor.agent.breaker")


class BreakerState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@frozen(kw_only=True)
class BreakerPolicy:
    crashes_max: int = 3
    window_s: float = 60.0
    cooldown_s: float = 30.0


@dataclass(slots=True)
class Breaker:
    app: str
    task_type: str
    state: BreakerState = BreakerState.CLOSED
    crashes: deque[float] = field(default_factory=deque)  # crash times, ms
    opened_ms: float | None = None
    reason: str | None = None  # why it last opened
    trips: int = 0


class Breakers:
    def __init__(self, policy: BreakerPolicy, app: str = "") -> None:
        self.policy = policy
        self.app = app
        self.by_type: dict[str, Breaker] = {}

    def record(self, task_type: str, *, crashed: bool, why: str, now_ms: float) -> None:
        """An attempt of ``task_type`` ended; ``crashed`` if its guest died on its own."""
        breaker = self.by_type.get(task_type)
        if breaker is None:
            breaker = self.by_type[task_type] = Breaker(self.app, task_type)
        if not crashed:
            if breaker.state == BreakerState.HALF_OPEN:
                self._close(breaker)
            return
        window_ms = self.policy.window_s * 1000
        breaker.crashes.append(now_ms)
        while breaker.crashes and breaker.crashes[0] < now_ms - window_ms:
            breaker.crashes.popleft()
        if breaker.state == BreakerState.HALF_OPEN or (
            breaker.state == BreakerState.CLOSED and len(breaker.crashes) >= self.policy.crashes_max
        ):
            self._open(breaker, why, now_ms)

    def is_open(self, task_type: str, now_ms: float) -> bool:
        """Whether ``task_type`` is held back now (see ``open_now``)."""
        breaker = self.by_type.get(task_type)
        if breaker is None or breaker.state != BreakerState.OPEN:
            return False
        return any(b is breaker for b in self.open_now(now_ms))

    def open_now(self, now_ms: float) -> list[Breaker]:
        """The breakers whose types the agent's polls leave out now (OPEN ones still cooling
        down); cooled-down ones move to HALF_OPEN here."""
        cooldown_ms = self.policy.cooldown_s * 1000
        out = []
        for breaker in self.by_type.values():
            if breaker.state != BreakerState.OPEN:
                continue
            if breaker.opened_ms is not None and now_ms >= breaker.opened_ms + cooldown_ms:
                breaker.state = BreakerState.HALF_OPEN
                log.warning(
                    "breaker %s/%s half-open: claiming the task type again",
                    breaker.app,
                    breaker.task_type,
                )
            else:
                out.append(breaker)
        return out

    def reopens_at_ms(self) -> float | None:
        times = [
            b.opened_ms + self.policy.cooldown_s * 1000
            for b in self.by_type.values()
            if b.state == BreakerState.OPEN and b.opened_ms is not None
        ]
        return min(times) if times else None

    def _open(self, breaker: Breaker, why: str, now_ms: float) -> None:
        breaker.state = BreakerState.OPEN
        breaker.opened_ms = now_ms
        breaker.trips += 1
        breaker.reason = (
            f"{len(breaker.crashes)} guest crash(es) within {self.policy.window_s:g}s; last: {why}"
        )
        log.error(
            "breaker %s/%s OPEN: %s; the type is not claimed for %gs, the others go on",
            breaker.app,
            breaker.task_type,
            breaker.reason,
            self.policy.cooldown_s,
        )

    def _close(self, breaker: Breaker) -> None:
        breaker.state = BreakerState.CLOSED
        breaker.crashes.clear()
        log.warning(
            "breaker %s/%s closed: an attempt ended without a crash", breaker.app, breaker.task_type
        )
