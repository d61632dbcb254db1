"""Small asyncio helpers shared by the leader duties."""

from __future__ import annotations

import asyncio
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
    """A wake-up flag: ``poke()`` from anywhere, ``wait(ms)`` returns on a poke or a timeout.

    A poke resolves the very future its waiter awaits, so the waiter runs at the loop's next
    step: on a busy loop every callback between a poke and its waiter costs a whole round of
    the loop's ready queue (a dispatcher woken for a grant is on an agent's critical path).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._poked = False
        self._waiter: asyncio.Future[None] | None = None

    def poke(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)
        else:
            self._poked = True

    async def wait(self, timeout_ms: float | None) -> None:
        if self._poked:
            self._poked = False
            return
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        sleeper = None
        if timeout_ms is not None:
            sleeper = asyncio.ensure_future(self._clock.sleep_ms(timeout_ms))
            sleeper.add_done_callback(lambda _: _wake(waiter))
        try:
            await waiter
        finally:
            self._waiter = None
            if sleeper is not None and not sleeper.done():
                sleeper.cancel()
        self._poked = False


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


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
