"""Small asyncio helpers shared by the leader duties."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

from conveyor.errors import TransientError
from conveyor.streams.clock import Clock

log = logging.getLogger("conveyor.processor")


async def back_off(clock: Clock, exc: TransientError, duty: str) -> None:
    """A leader duty's append failed with a retryable error (the disk is full: ``LogFull``).

    The duty must not die with it: timers, lease expiries, lease grants or event shipping
    would stop for good, even after the error clears. Log, wait ``retry_after_ms``, go on.
    """
    log.warning("%s: %s; retrying in %d ms", duty, exc, exc.retry_after_ms)
    await clock.sleep_ms(exc.retry_after_ms)


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


async def ship_while(
    leading: Callable[[], bool],
    ship_once: Callable[[], Awaitable[bool]],
    poke: Poke,
    clock: Clock,
    duty: str,
    pause_ms: float = 0.0,
) -> None:
    """The loop of a duty that ships committed rows (the outbox, messages) while this
    processor leads: ``ship_once`` ships a round and says whether it shipped anything. A
    retryable failure leaves the rows where they are, to be shipped after a back-off; after a
    round it pauses ``pause_ms``, and with nothing to ship it waits for a poke (or a second)."""
    while leading():
        try:
            shipped = await ship_once()
        except TransientError as exc:
            await back_off(clock, exc, duty)
            continue
        if not shipped:
            await poke.wait(1_000)
        elif pause_ms:
            await clock.sleep_ms(pause_ms)
