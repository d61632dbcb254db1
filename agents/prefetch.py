"""How many leases an agent holds beyond its guests: fixed, or adapted to how fast it works.

Leases held ready (prefetched) keep every guest busy across a poll's round trip and let polls
and grants come in batches; but a held lease is one no other agent can run. The right number
depends on the work: ~1,000 for no-op tasks (a guest ends one every ~100 µs), a handful for
tasks of a second. ``conveyor agent`` adapts it unless ``--prefetch`` fixes it:

Rules, and why:

1. Hold about ``WINDOW_MS`` of work: the rate at which the agent ended attempts over the last
   tick(s), times the window. The agent asks again once a quarter of it is free, so the rest
   must last a poll's round trip, which grows to 0.2-0.3 s while batches of enqueues keep a
   node busy: with 100 ms, no-op tasks held ~400 leases and ran 2,617-2,756 tasks/s against
   3,000-3,786 with one full poll (``bench e2e``, alternating). A lease waits here at most
   about that long for a guest.
2. Never below ``floor`` (the guests' number, what a fixed default held before), never above
   ``cap`` (what one poll may ask for, less the guests).
3. The rate is measured per tick of ``TICK_MS`` and halves its weight every tick, so a pause
   (no attempt ends) brings the size back towards the floor within a few ticks: work that
   arrives after a pause, slow or fast, finds a small prefetch first and grows it.
4. Pure arithmetic over the times it is given: the agent passes its own clock's readings.

What it does not know: which task type the next lease will be. A workload that turns from
fast tasks to slow ones at once can find up to ``cap`` slow leases held by one agent, until
they run; fix ``--prefetch`` where that matters.
"""

from __future__ import annotations

import math

from conveyor.schemas.limits import POLL_CAPACITY_MAX

WINDOW_MS = 500.0  # rule 1
TICK_MS = 100.0  # rule 3


class Prefetch:
    def __init__(self, floor: int, cap: int) -> None:
        """``floor == cap``: a fixed prefetch."""
        if not 0 <= floor <= cap:
            raise ValueError(f"prefetch bounds must satisfy 0 <= floor <= cap, not {floor}, {cap}")
        self.floor, self.cap = floor, cap
        self._rate = 0.0  # attempts ended per ms, weighted over past ticks
        self._tick_ms: float | None = None  # when the current tick began
        self._ended = 0  # attempts ended in the current tick

    @classmethod
    def of(cls, concurrency: int, prefetch: int | None) -> Prefetch:
        """``prefetch`` leases beyond ``concurrency`` guests; ``None``: adapted (rules 1-2)."""
        if prefetch is not None:
            return cls(prefetch, prefetch)
        cap = max(0, POLL_CAPACITY_MAX - concurrency)
        return cls(min(concurrency, cap), cap)

    @property
    def fixed(self) -> bool:
        return self.floor == self.cap

    def ended(self, now_ms: float) -> None:
        """An attempt ended (rule 1's rate)."""
        self._roll(now_ms)
        self._ended += 1

    def size(self, now_ms: float) -> int:
        """The leases to hold beyond the guests now."""
        if self.fixed:
            return self.floor
        self._roll(now_ms)
        want = math.ceil(self._rate * WINDOW_MS)
        return max(self.floor, min(self.cap, want))

    def _roll(self, now_ms: float) -> None:
        """Close the ticks that ``now_ms`` has passed, weighing each at half the one after."""
        if self._tick_ms is None:
            self._tick_ms = now_ms
            return
        ticks = int((now_ms - self._tick_ms) // TICK_MS)
        if ticks <= 0:
            return
        self._rate = (self._rate + self._ended / TICK_MS) / 2
        self._rate /= 2 ** min(ticks - 1, 64)  # the ticks after it ended nothing
        self._ended = 0
        self._tick_ms += ticks * TICK_MS
