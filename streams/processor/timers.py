"""The timer scanner (a leader duty): due timers become FireTimers records.

Timers live in the ``timers`` table ordered by fire time. The scanner reads committed state,
proposes the due ones it has not proposed yet, and sleeps until the next fire time or a poke.
A timer proposed twice is harmless: the machine fires only timers that still exist.
"""

from __future__ import annotations

from conveyor.errors import TransientError
from conveyor.schemas.types import FireTimers
from conveyor.streams.log.api import LogSealed
from conveyor.streams.processor.duties import Partition
from conveyor.streams.processor.waiting import Poke, back_off

IDLE_TICK_MS = 1_000.0


class TimerScanner:
    def __init__(self, partition: Partition, batch: int) -> None:
        self._p = partition
        self._batch = batch  # due timers per FireTimers record
        self._poke = Poke(partition.clock)
        self.fired = 0
        self.lag_ms = 0.0  # how late the last due timer was proposed
        self._wake_at_ms = 0.0  # when the scanner plans to look again
        # No live timer fires before the floor: scans start there, above the tombstones of
        # fired timers. Arming an earlier timer lowers it; a new leader starts from zero.
        self._floor_ms = 0

    def poke(self) -> None:
        self._poke.poke()

    def armed(self, fire_at_ms: int) -> None:
        """A timer was armed: wake the scanner only if it fires before the planned wake-up."""
        self._floor_ms = min(self._floor_ms, fire_at_ms)
        if fire_at_ms < self._wake_at_ms:
            self._poke.poke()

    async def run(self) -> None:
        while self._p.leader:
            now = self._p.clock.now_ms()
            due = self._p.reader().due_timers(now, self._batch, self._floor_ms)
            if due:
                self._floor_ms = due[0].fire_at_ms
                self.lag_ms = max(0, now - due[0].fire_at_ms)
                try:
                    offset = await self._p.propose(FireTimers(timers=due))
                    await self._p.wait_applied(offset)
                    self.fired += len(due)
                except LogSealed:
                    pass
                except TransientError as exc:
                    await back_off(self._p.clock, exc, f"partition {self._p.partition} timers")
                continue
            sleep_ms = self._sleep_ms(now)
            self._wake_at_ms = now + sleep_ms
            await self._poke.wait(sleep_ms)
            self._wake_at_ms = 0.0

    def _sleep_ms(self, now: int) -> float:
        upcoming = self._p.reader().next_timer_ms(self._floor_ms)
        if upcoming is None:
            self._floor_ms = now
            return IDLE_TICK_MS
        self._floor_ms = upcoming
        return max(1.0, min(IDLE_TICK_MS, upcoming - now))
