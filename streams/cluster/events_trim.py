"""The events topic is trimmed below what every node's readers and the task events relay
still need, and no newer than ``keep_ms``.

    events partition p   trimmed | kept ...........................................| end
                                 ^ min over the cards of events_needed[p] and the relay's
                                   committed offset in p, and no event younger than keep_ms
                                   below it

Each node reads every partition of ``<cluster>-events`` twice over: its Postgres projector
(its watermark, kept in its own Postgres) and its webhook deliverer (its cursor, kept in its
own SQLite). Neither position is visible to another node, so each node says it in its card
(``directory.py``): ``events_needed`` maps a partition to the lowest offset one of its readers
will read next. The rules:

1. The owner of record partition ``p`` trims events partition ``p`` (its outbox writes it),
   every ``interval_ms``, below the lowest ``events_needed[p]`` of every card in the
   directory, and below the relay's position (rule 4). A node that is down keeps its last
   card (a node killed never tombstones it), so its readers' positions hold the trim back
   until it comes back and moves them. A card without ``events_needed`` (a node of an older
   build) holds every trim back.
2. ``keep_ms``: an event younger than that is never trimmed, whatever the cards say: clients
   of ``GET /v1/events`` hold cursors no card knows of, and that is how long theirs stay
   good (an older one is refused, 400, naming the partition trimmed past it).
3. A reader that finds its position below the topic's start (a node that left cleanly,
   whose card was tombstoned, and came back after a trim; a node that joins a cluster whose
   topic was trimmed) starts at the topic's start with a warning: its projector lists the
   tasks whose events are still there (``sinks/projector_process.py``), its deliverer
   delivers from the newest events on (``webhooks/deliver.py``).
4. The task events relay (``sinks/task_events.py``) reads the topic too, as one consumer
   group of the nodes run with ``--task-events``, whose position is its committed offsets
   in the broker, not in any card. Once the cluster relays (a card says its node runs the
   relay, or the group has committed an offset in any partition of the topic), the trim
   stays below the group's committed offset in each partition, and a partition where it
   committed none is kept whole: the relay will read it from its start. So a relay that
   lags, or is stopped, loses nothing, however far behind it is. Each round the owner asks
   the broker for the group's offsets; a round that cannot ask trims nothing. A relay given
   up for good stops holding the trim when its offsets go: the broker deletes the offsets
   of a group that has had no member for its ``offsets.retention.minutes`` (7 days unless
   configured), and ``kafka-consumer-groups.sh --delete --group
   <cluster>-task-events-relay`` deletes them at once. No limit of Conveyor's own is set on
   top: a relay that comes back after the broker dropped its offsets starts at the topic's
   start anyway, so holding longer would keep events for no reader, and holding less would
   trim events from under a relay the broker still knows where to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Protocol

from conveyor.errors import TransientError
from conveyor.streams.clock import Clock

log = logging.getLogger("conveyor.cluster")

INTERVAL_MS = 30_000
KEEP_MS_DEFAULT = 7 * 24 * 3_600_000
NEEDED = "events_needed"
RELAYS = "task_events"  # a card's: its node runs the task events relay (rule 4)


class EventsLog(Protocol):
    """What the trimmer needs of the events log (a ``KafkaLog``)."""

    async def trim(self, partition: int, up_to: int) -> None: ...

    def start_offset(self, partition: int) -> int: ...

    async def offset_for_time(self, partition: int, ts_ms: int) -> int: ...

    async def committed(self, group: str) -> Mapping[int, int]: ...


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


def relay_floor(
    cards: Mapping[str, Mapping[str, Any]], committed: Mapping[int, int], partition: int
) -> int | None:
    """The lowest offset of ``partition`` the task events relay still needs (rule 4): the
    group's committed offset there; 0 where it committed none but the cluster relays (a card
    says so, or the group committed in another partition); None: the cluster relays nothing,
    so the relay holds nothing back."""
    at = committed.get(partition)
    if at is not None:
        return at
    relays = bool(committed) or any(card.get(RELAYS) is True for card in cards.values())
    return 0 if relays else None


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
        relay_group: str,
        clock: Clock,
        interval_ms: int = INTERVAL_MS,
        keep_ms: int = KEEP_MS_DEFAULT,
    ) -> None:
        self.events = events
        self.relay_group = relay_group  # the task events relay's consumer group (rule 4)
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
            await self._round()

    async def _round(self) -> None:
        asked: list[Mapping[int, int]] = []

        async def committed() -> Mapping[int, int]:
            """The relay's offsets, asked of the broker once a round, if at all."""
            if not asked:
                asked.append(await self.events.committed(self.relay_group))
            return asked[0]

        for p in range(self.partitions):
            if self.leading(p):
                try:
                    await self.trim(p, committed)
                except TransientError as exc:
                    log.warning("events partition %d: not trimmed now: %s", p, exc)

    async def trim(
        self, p: int, committed: Callable[[], Awaitable[Mapping[int, int]]] | None = None
    ) -> int | None:
        """Trim events partition ``p`` as far as rules 1, 2 and 4 allow; the new start, or
        None when nothing is to be trimmed. ``committed``: the relay group's offsets (asked
        of the events log when not given)."""
        cards = self.cards()
        up_to = floor(cards, p)
        if up_to is None or up_to <= self.events.start_offset(p):
            return None  # nothing to trim: no call to the broker
        offsets = await (committed or (lambda: self.events.committed(self.relay_group)))()
        relay = relay_floor(cards, offsets, p)
        if relay is not None:
            up_to = min(up_to, relay)
            if up_to <= self.events.start_offset(p):
                return None
        if self.keep_ms > 0:
            young = await self.events.offset_for_time(p, self.clock.now_ms() - self.keep_ms)
            up_to = min(up_to, young)
        await self.events.trim(p, up_to)
        return up_to
