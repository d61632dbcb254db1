"""Small asyncio helpers shared by the leader duties."""

from __future__ import annotations

import asyncio
import contextlib

from conveyor.streams.clock import Clock


class Poke:
    """A wake-up flag: ``poke()`` from anywhere, ``wait(ms)`` returns on a poke or a timeout."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._event = asyncio.Event()

    def poke(self) -> None:
        self._event.set()

    async def wait(self, timeout_ms: float | None) -> None:
        if self._event.is_set():
            self._event.clear()
            return
        waiter = asyncio.ensure_future(self._event.wait())
        sleeper = (
            None if timeout_ms is None else asyncio.ensure_future(self._clock.sleep_ms(timeout_ms))
        )
        try:
            await asyncio.wait(
                [f for f in (waiter, sleeper) if f is not None],
                return_when=asyncio.FIRST_COMPLETED,
            )
        finally:
            for future in (waiter, sleeper):
                if future is not None and not future.done():
                    future.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await future
        self._event.clear()
