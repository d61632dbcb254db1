"""Clocks injected into everything outside the state machine.

``SystemClock`` is the real one; ``FakeClock`` moves only when told, so tests and
``conveyor.testing.Engine.advance()`` fire timers without waiting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds: stamped on proposed records."""
        ...

    def monotonic_ms(self) -> float:
        """For local deadlines (heartbeats); never written to the log."""
        ...

    async def sleep_ms(self, ms: float) -> None: ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0

    async def sleep_ms(self, ms: float) -> None:
        await asyncio.sleep(max(0.0, ms) / 1000.0)


class FakeClock:
    """Time stands still until ``advance``; sleepers wake when their deadline is passed."""

    def __init__(self, start_ms: int = 1_700_000_000_000) -> None:
        self._now = float(start_ms)
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now_ms(self) -> int:
        """Wall-clock milliseconds: the start plus every ``advance``."""
        return int(self._now)

    def monotonic_ms(self) -> float:
        """The same instant on the monotonic axis (it moves only by ``advance``)."""
        return self._now

    async def sleep_ms(self, ms: float) -> None:
        """Return once ``advance`` has moved the clock ``ms`` past now."""
        if ms <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now + ms, future))
        await future

    def advance(self, ms: float) -> None:
        """Move time forward by ``ms`` and wake every sleeper whose deadline passed."""
        self._now += ms
        keep = []
        for deadline, future in self._sleepers:
            if deadline <= self._now:
                if not future.done():
                    future.set_result(None)
            else:
                keep.append((deadline, future))
        self._sleepers = keep
