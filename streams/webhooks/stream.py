"""Reading the events log from a cursor: what ``GET /v1/events`` and the webhook deliverer share.

    events log p0 --read(follow)--> decode --+
    events log p1 --read(follow)--> decode --+--> bounded queue --> Tail.next() --> (event, cursor)
    ...                                      |
    events log pN --read(follow)--> decode --+

Rules, and why:

1. One source: the events log itself (durable records only, ``LocalLog`` rule 9), never a
   second copy. An event a reader was shown is durable; nothing is shown that a crash undoes.
2. A cursor is a position per partition of the events log: ``(next, skip, seen)``, the
   offset of the next record to read, how many events of that record were already taken,
   and the highest ``version`` taken (the record-log offset that caused the event).
   It is opaque to clients (``c1.`` + base64url of JSON), versioned by its prefix, and checked
   against this log (partition count, offsets within the retained log): a bad one is a
   ``ContractError`` (400) saying what to do.
3. Nothing skipped, nothing repeated: every event taken moves its partition's position past
   it, and the cursor handed out with an event is the position just after it. A partition's
   events come in ``version`` order, but the same fact may come twice: the outbox may ship a
   batch twice (``processor/outbox.py``: a crash between its append and its delete), and a
   processor killed before its store flushed replays records and emits their events again,
   grouped into other batches. A copy has a version at or below ``seen`` and is skipped, so a
   reader resuming from any cursor sees each event once.
4. Bounded: the per-partition readers put decoded batches into a queue of ``QUEUE_MAX``
   entries and wait when it is full, so a slow consumer (an SSE client that does not read)
   holds at most that many batches, not the log.
5. An event's id is ``evt_<partition>_<version>_<n>``, the n-th event of the record at that
   offset: the machine is deterministic, so every copy of a fact (rule 3) has the same id;
   it names the fact, not where it was read.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import json
from collections.abc import Sequence
from typing import Any

from conveyor.errors import ContractError
from conveyor.frozen import frozen
from conveyor.schemas.codec import EVENT_BATCH
from conveyor.schemas.types import EventBatch, EventKind, TaskEvent
from conveyor.streams.log.api import Log

CURSOR_PREFIX = "c1."
QUEUE_MAX = 16  # decoded batches waiting for the consumer (rule 4)
READ_BATCH = 64  # events-log records per read
CURSOR_CHARS_MAX = 16_384

# The event kinds by the names clients see (``type`` in JSON, ``event:`` in SSE, webhooks).
TYPE_OF_KIND: dict[EventKind, str] = {
    EventKind.TaskEnqueued: "task.enqueued",
    EventKind.TaskLeased: "task.leased",
    EventKind.TaskSucceeded: "task.succeeded",
    EventKind.AttemptFailed: "task.attempt_failed",
    EventKind.TaskRetryScheduled: "task.retry_scheduled",
    EventKind.TaskFailed: "task.failed",
    EventKind.TaskCanceled: "task.canceled",
    EventKind.TaskExpired: "task.expired",
    EventKind.CancelRequested: "task.cancel_requested",
    EventKind.CheckpointSaved: "task.checkpoint_saved",
    EventKind.LeaseExpired: "task.lease_expired",
    EventKind.TaskRequeued: "task.requeued",
    EventKind.TaskSleeping: "task.sleeping",
    EventKind.TaskWaiting: "task.waiting",
}
EVENT_TYPES = frozenset(TYPE_OF_KIND.values())


@frozen
class Position:
    next: int  # the events-log offset of the next record to read
    skip: int  # events of that record already taken
    seen: int  # the batch offset (record-log offset) of the last batch taken; -1: none


@frozen
class Event:
    """One task event as read, with where it came from."""

    id: str
    partition: int
    event: TaskEvent

    @property
    def type(self) -> str:
        return TYPE_OF_KIND[self.event.kind]

    def body(self) -> dict[str, Any]:
        """The event as clients see it (the tenant is the caller's own: not repeated)."""
        e = self.event
        body: dict[str, Any] = {
            "id": self.id,
            "type": self.type,
            "task_id": e.task_id,
            "app": e.app,
            "task_type": e.task_type,
            "queue": e.queue,
            "status": e.status,
            "attempt": e.attempt,
            "ts_ms": e.ts_ms,
        }
        if e.agent_id is not None:
            body["agent_id"] = e.agent_id
        if e.error_class is not None or e.error_message is not None:
            body["error"] = {"class": e.error_class, "message": e.error_message}
        return body


def encode_cursor(positions: Sequence[Position]) -> str:
    raw = json.dumps([[p.next, p.skip, p.seen] for p in positions], separators=(",", ":"))
    return CURSOR_PREFIX + base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def _bad(why: str) -> ContractError:
    return ContractError(
        f"cursor: {why}; pass a cursor this node's /v1/events returned (an event's id in SSE, "
        "'cursor' in JSON), or none to start at the newest events",
        field="after",
    )


def decode_cursor(cursor: str, log: Log) -> list[Position]:
    """The positions a cursor names, checked against ``log`` (rule 2)."""
    if len(cursor) > CURSOR_CHARS_MAX:
        raise _bad(f"{len(cursor)} characters, over the limit of {CURSOR_CHARS_MAX}")
    if not cursor.startswith(CURSOR_PREFIX):
        raise _bad(f"not a cursor of this version (it must start with {CURSOR_PREFIX!r})")
    body = cursor[len(CURSOR_PREFIX) :]
    try:
        raw = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        raise _bad("malformed (not the encoding this node writes)") from None
    if not isinstance(raw, list) or len(raw) != log.partitions:
        raise _bad(f"not a cursor of this node's {log.partitions} events partitions")
    positions = []
    for p, item in enumerate(raw):
        ok = isinstance(item, list) and len(item) == 3
        ok = ok and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
        if not ok or item[0] < 0 or item[1] < 0 or item[2] < -1:
            raise _bad(f"malformed position for partition {p}")
        if item[0] > log.end_offset(p):
            raise _bad(f"partition {p} is past the end of this node's events log")
        if item[0] < log.start_offset(p):
            raise _bad(f"the events of partition {p} before it were trimmed")
        positions.append(Position(next=item[0], skip=item[1], seen=item[2]))
    return positions


async def tail_positions(log: Log) -> list[Position]:
    """The positions just after the newest event of every partition."""
    return [await _tail(log, p) for p in range(log.partitions)]


async def _tail(log: Log, p: int) -> Position:
    end = log.end_offset(p)
    seen = -1
    if end > log.start_offset(p):  # the last batch's offset: a re-shipped copy is skipped
        async for records in log.read(p, end - 1, max_batch=1):
            seen = EVENT_BATCH.decode(records[-1].data).offset  # no event shipped is newer
            break
    return Position(next=end, skip=0, seen=seen)


@frozen
class _Read:
    partition: int
    offset: int
    batch: EventBatch


class Tail:
    """The events after ``positions``, in order per partition (partitions interleaved), each
    with the cursor just after it. Use as an async context manager; ``positions`` is the
    position of what was taken so far."""

    def __init__(self, log: Log, positions: Sequence[Position], queue_max: int = QUEUE_MAX) -> None:
        self._log = log
        self.positions = list(positions)
        self._queue: asyncio.Queue[_Read | BaseException] = asyncio.Queue(queue_max)
        self._readers: list[asyncio.Task[None]] = []
        self._pending: list[Event] = []
        self._pending_positions: list[Position] = []

    async def __aenter__(self) -> Tail:
        for p, pos in enumerate(self.positions):
            self._readers.append(asyncio.create_task(self._read(p, pos.next)))
        return self

    async def __aexit__(self, *_: object) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _read(self, p: int, start: int) -> None:
        try:
            async for records in self._log.read(p, start, follow=True, max_batch=READ_BATCH):
                for record in records:
                    batch = EVENT_BATCH.decode(record.data)
                    await self._queue.put(_Read(partition=p, offset=record.offset, batch=batch))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a failed read ends the tail with its reason
            await self._queue.put(exc)

    def cursor(self) -> str:
        return encode_cursor(self.positions)

    def reached(self, ends: Sequence[int]) -> bool:
        """Whether every partition was read up to ``ends`` (end offsets taken earlier)."""
        return not self._pending and all(
            pos.next >= end for pos, end in zip(self.positions, ends, strict=True)
        )

    async def next(self, timeout_s: float | None) -> Event | None:
        """The next event, or None if none came within ``timeout_s`` (0: only if one is
        already read). The positions move past it (rule 3)."""
        while not self._pending:
            item: _Read | BaseException
            if timeout_s == 0:
                try:
                    item = self._queue.get_nowait()
                except asyncio.QueueEmpty:
                    return None
            else:
                try:
                    item = await asyncio.wait_for(self._queue.get(), timeout_s)
                except TimeoutError:
                    return None
            if isinstance(item, BaseException):
                raise item
            self._take(item)
        self.positions[self._pending[0].partition] = self._pending_positions.pop(0)
        return self._pending.pop(0)

    def _take(self, read: _Read) -> None:
        """Queue the events of ``read`` not taken before, with the position after each."""
        p, pos, events = read.partition, self.positions[read.partition], read.batch.events
        if read.offset < pos.next:  # a partial record resumed is the one at pos.next
            return
        partial = read.offset == pos.next and pos.skip > 0
        per_version: dict[int, int] = {}
        seen = pos.seen
        for i, event in enumerate(events):
            n = per_version[event.version] = per_version.get(event.version, -1) + 1
            if (i < pos.skip) if partial else (event.version <= pos.seen):
                continue  # taken before, or a copy of one taken before (rule 3)
            seen = max(seen, event.version)
            event_id = f"evt_{read.batch.partition}_{event.version}_{n}"
            self._pending.append(Event(id=event_id, partition=p, event=event))
            last = i + 1 == len(events)
            self._pending_positions.append(
                Position(next=read.offset + 1, skip=0, seen=seen)
                if last
                else Position(next=read.offset, skip=i + 1, seen=seen)
            )
        if not self._pending:  # nothing new in it: move past it at once
            self.positions[p] = Position(next=read.offset + 1, skip=0, seen=pos.seen)
