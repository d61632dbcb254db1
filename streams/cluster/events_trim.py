"""The events topic is trimmed below what every node's readers still need, and no newer than
``keep_ms``.

    events partition p   trimmed | kept ...........................................| end
                                 ^ min over the cards of events_needed[p], and no event
                                   younger than keep_ms below it

Each node reads every partition of ``<cluster>-events`` twice over: its Postgres projector
(its watermark, kept in its own Postgres) and its webhook deliverer (its cursor, kept in its
own SQLite). Neither position is visible to another node, so each node says it in its card
(``directory.py``): ``events_needed`` maps a partition to the lowest offset one of its readers
will read next. The rules:

1. The owner of record partition ``p`` trims events partition ``p`` (its outbox writes it),
   every ``interval_ms``, below the lowest ``events_needed[p]`` of every card in the
   directory. A node that is down keeps its last card (a node killed never tombstones it),
   so its readers' positions hold the trim back until it comes back and moves them. A card
   without ``events_needed`` (a node of an older build) holds every trim back.
2. ``keep_ms``: an event younger than that is never trimmed, whatever the cards say: clients
   of ``GET /v1/events`` hold cursors no card knows of, and that is how long theirs stay
   good (an older one is refused, 400, naming the partition trimmed past it).
3. A reader that finds its position below the topic's start (a node that left cleanly,
   whose card was tombstoned, and came back after a trim; a node that joins a cluster whose
   topic was trimmed) starts at the topic's start with a warning: its projector lists the
   tasks whose events are still there (``sinks/projector_process.py``), its deliverer
   delivers from the newest events on (``webhooks/deliver.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from conveyor.errors import TransientError
from conveyor.streams.clock import Clock

log = logging.getLogger("conveyor.cluster")

INTERVAL_MS = 30_000
KEEP_MS_DEFAULT = 7 * 24 * 3_600_000
NEEDED = "events_needed"


class EventsLog(Protocol):
    """What the trimmer needs of the events log (a ``KafkaLog``)."""

    async def trim(self, partition: int, up_to: int) -> None: ...

    def start_offset(self, partition: int) -> int: ...

    async def offset_for_time(self, partition: int, ts_ms: int) -> int: ...


def floor(cards: Mapping[str, Mapping[str, Any]], partition: int) -> int | None:
    """The lowest offset of ``partition`` a node's reader still needs (rule 1); None: no card
    says, or one card cannot (an older node), so nothing is trimmed."""
    lowest: int | None = None
    for card in cards.values():
        needed = card.get(NEEDED)
        if not isinstance(needed, dict):
            return None
        at = needed.get(str(partition))
        if at is not None:
            lowest = int(at) if lowest is None else min(lowest, int(at))
    return lowest


def needed(readers: list[Mapping[int, int]], partitions: int) -> dict[str, int]:
    """``events_needed`` of this node's card: per partition, the lowest next offset of its
    readers (a reader that has no position for a partition reads it from 0)."""
    if not readers:
        return {}
    return {str(p): min(r.get(p, 0) for r in readers) for p in range(partitions)}


class EventsTrimmer:
    def __init__(
        self,
        events: EventsLog,
        cards: Callable[[], Mapping[str, Mapping[str, Any]]],
        leading: Callable[[int], bool],
        partitions: int,
        *,
        clock: Clock,
        interval_ms: int = INTERVAL_MS,
        keep_ms: int = KEEP_MS_DEFAULT,
    ) -> None:
        self.events = events
        self.cards = cards
        self.leading = leading
        self.partitions = partitions
        self.clock = clock
        self.interval_ms = interval_ms
        self.keep_ms = keep_ms
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="events-trim")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            await self.clock.sleep_ms(self.interval_ms)
            for p in range(self.partitions):
                if self.leading(p):
                    try:
                        await self.trim(p)
                    except TransientError as exc:
                        log.warning("events partition %d: not trimmed now: %s", p, exc)

    async def trim(self, p: int) -> int | None:
        """Trim events partition ``p`` as far as rules 1 and 2 allow; the new start, or None
        when nothing is to be trimmed."""
        up_to = floor(self.cards(), p)
        if up_to is None or up_to <= self.events.start_offset(p):
            return None  # nothing to trim: no call to the broker
        if self.keep_ms > 0:
            young = await self.events.offset_for_time(p, self.clock.now_ms() - self.keep_ms)
            up_to = min(up_to, young)
        await self.events.trim(p, up_to)
        return up_to
