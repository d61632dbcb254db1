"""The Postgres projector: the events stream -> the query snapshot (``conveyor.store.postgres``).

    events log p0 --read(follow)--> decode --+
    events log p1 --read(follow)--> decode --+--> queue --> fold per task --> ONE transaction:
    ...                                      |              (chunk)           upserts + watermarks
    events log pN --read(follow)--> decode --+

Rules, and why:

1. Resume from the watermark. Each partition's reader starts at the ``next_offset`` stored
   with the rows, so a restart (or a crash mid-chunk, whose transaction never committed)
   re-reads exactly what is not yet projected.
2. At-least-once in, exactly-once in effect: the outbox may ship a batch twice and a restart
   may re-read one; the per-row version guard (store/postgres/projection.py) makes that a no-op.
3. Batched: readers decode while the previous transaction is in flight; the writer folds all
   that is queued (up to ``CHUNK_EVENTS_MAX``) into one row per task and writes it at once. A
   small chunk lingers up to ``LINGER_MS`` for more: a trickle of single enqueues then costs a
   transaction per linger instead of one per event (400 sequential enqueues to an idle node,
   when the projector still shared the node's event loop: p99 7.3 -> 5.6-6.4 ms). The
   snapshot lags by at most that much more. A node runs it in a process of its own
   (``projector_process.py``); tools that catch up or rebuild run it in theirs.
4. The projector never blocks the processors: it only reads the events log. If Postgres is
   down it retries with a backoff, and the lag metrics show how far behind it is.
5. A row whose newest event is TaskLeased is held back up to ``HOLD_LEASED_MS`` (with its
   attempt), and folded with the events that come meanwhile: a task that ends within that time
   costs one row version and one attempt insert instead of two of each (every version of a
   task row updates each of its indexes). Its steps wait with it, so the snapshot shows a
   task's rows as of one moment; a listing by status shows a lease that much later. Held rows
   keep their partition's watermark at the read they came in, so a crash or a restart
   re-reads them (rule 1). Catching up holds nothing.
6. The same transaction folds the chunk's events into the queue history (per tenant, minute,
   queue and task type: counts and latency histograms, ``store/postgres/history.py``). Those
   rows are added to, not versioned, so that fold skips events at or below the record offset
   its own marks say it counted: a re-read (rule 1, rule 5) or a batch shipped twice adds
   nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Protocol

import asyncpg

from conveyor.frozen import frozen
from conveyor.schemas.codec import EVENT_BATCH
from conveyor.schemas.types import EventBatch, EventKind
from conveyor.store.postgres import history, projection, queries
from conveyor.streams.clock import Clock, SystemClock
from conveyor.streams.log.api import LogRecord
from conveyor.streams.sinks.metrics import Metrics

log = logging.getLogger("conveyor.projector")

READ_BATCH = 32  # events-log records per read (~8k events): keeps reads and writes overlapping
QUEUE_MAX = 64  # decoded read batches waiting for the writer: bounds memory when behind
CHUNK_EVENTS_MAX = 10_000  # events folded into one transaction
LINGER_EVENTS = 256  # a chunk smaller than this waits for more (rule 3)...
LINGER_MS = 25.0  # ...this long at most
HOLD_LEASED_MS = 500.0  # rule 5
RETRY_MS = 1_000.0  # pause after a failed transaction
GAUGE_REFRESH_MS = 15_000.0  # how often the tasks-by-state gauge may be refreshed...
# ...but the tasks-by-state count scans every task row (seconds at 10^7 rows): it is redone
# only when its last run is at most this share of the time since.
COUNT_SHARE_MAX = 0.01


@frozen
class _Read:
    partition: int
    offset: int  # the offset of the first record of this read
    next_offset: int  # the offset after the last record of this read
    batches: list[EventBatch]


@frozen
class _Held:
    since_ms: float  # held since (monotonic)
    partition: int
    offset: int  # the read it came in: its partition's watermark stays at or below it


@frozen
class _Failed:
    error: Exception


class _Due:
    """A held row is due to be written (rule 5)."""


_DUE = _Due()
_Item = _Read | _Failed | None  # None: a reader reached the end (catch-up only)
_LEASED = EventKind.TaskLeased.value


class Events(Protocol):
    """What a projector reads of the events log: a ``Log``, or what the node ships to a
    projector process (``projector_process.ShippedLog``)."""

    @property
    def partitions(self) -> int: ...

    def end_offset(self, partition: int) -> int: ...

    def read(
        self, partition: int, from_offset: int, *, follow: bool = False, max_batch: int = 1024
    ) -> AsyncIterator[list[LogRecord]]: ...


class Progress:
    """How far a projection has come, and the gauges that show it: per events partition the
    next offset to project, the events projected, and the stamp of the newest one. The
    projector keeps it; so does the node for a projector in a process of its own."""

    def __init__(
        self,
        events: Events,
        pool: asyncpg.Pool,
        *,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.events = events
        self.pool = pool
        self.metrics = metrics
        self.clock = clock or SystemClock()
        self.next_offsets: dict[int, int] = {}
        self.events_projected = 0
        self.last_event_ms: int | None = None
        if metrics is not None:
            metrics.projection = self  # its lag gauges read this one

    def lag_records(self) -> dict[int, int]:
        """Per partition, events-log records not yet projected."""
        return {
            p: max(0, self.events.end_offset(p) - self.next_offsets.get(p, 0))
            for p in range(self.events.partitions)
        }

    def lag_s(self) -> float:
        """0 when caught up; else how old the newest projected event is (an upper bound on the
        age of the oldest waiting one)."""
        if not any(self.lag_records().values()):
            return 0.0
        if self.last_event_ms is None:
            return 0.0
        return max(0.0, (self.clock.now_ms() - self.last_event_ms) / 1000)

    async def refresh_gauges(self) -> None:
        """Forever: now and then, the tasks-by-state counts."""
        assert self.metrics is not None
        count_at = self.clock.monotonic_ms()
        while True:
            started = self.clock.monotonic_ms()
            if started >= count_at:
                try:
                    async with self.pool.acquire() as conn:
                        self.metrics.set_task_counts(await queries.tasks_by_state(conn))
                except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                    log.warning("tasks-by-state refresh failed: %s", exc)
                took = self.clock.monotonic_ms() - started
                count_at = started + max(GAUGE_REFRESH_MS, took / COUNT_SHARE_MAX)
            await self.clock.sleep_ms(GAUGE_REFRESH_MS)


class Projector(Progress):
    def __init__(
        self,
        events: Events,
        pool: asyncpg.Pool,
        *,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
        on_write: Callable[[float], None] | None = None,
    ) -> None:
        super().__init__(events, pool, metrics=metrics, clock=clock)
        self.on_write = on_write  # called after each write with its seconds
        self._read_to: dict[int, int] = {}  # per partition, the offset after the last read
        self._held = projection.Fold.empty()  # rule 5: rows not written yet...
        self._held_at: dict[str, _Held] = {}  # ...and since when, from which read
        self._hints = history.Hints()  # ready and lease times between chunks (history.py)

    # -- running ------------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow every partition forever (until cancelled)."""
        await self._project(follow=True)

    async def catch_up(self) -> int:
        """Project everything in the events log now; the number of events projected."""
        before = self.events_projected
        await self._project(follow=False)
        return self.events_projected - before

    async def rebuild(self) -> int:
        """Truncate the snapshot and project the whole events log again."""
        async with self.pool.acquire() as conn:
            await projection.truncate(conn)
        return await self.catch_up()

    async def _project(self, *, follow: bool) -> None:
        async with self.pool.acquire() as conn:
            self.next_offsets = await projection.watermarks(conn)
        self._read_to = dict(self.next_offsets)
        self._held, self._held_at = projection.Fold.empty(), {}  # re-read from the watermarks
        queue: asyncio.Queue[_Item] = asyncio.Queue(QUEUE_MAX)
        readers = [
            asyncio.create_task(self._read(p, queue, follow), name=f"project-read-{p}")
            for p in range(self.events.partitions)
        ]
        side = [asyncio.create_task(self.refresh_gauges())] if follow and self.metrics else []
        try:
            await self._write_loop(queue, len(readers), hold=follow)
            for reader in readers:
                await reader  # surfaces a reader's failure
        finally:
            for task in readers + side:
                task.cancel()
            for task in readers + side:
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _read(self, partition: int, queue: asyncio.Queue[_Item], follow: bool) -> None:
        start = self.next_offsets.get(partition, 0)
        try:
            async for records in self.events.read(
                partition, start, follow=follow, max_batch=READ_BATCH
            ):
                batches = [EVENT_BATCH.decode(r.data) for r in records]
                read = _Read(partition, records[0].offset, records[-1].offset + 1, batches)
                await queue.put(read)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # hand it to the writer, which stops the projector with it
            await queue.put(_Failed(exc))
            return
        await queue.put(None)  # this reader is done

    async def _write_loop(self, queue: asyncio.Queue[_Item], readers: int, hold: bool) -> None:
        while readers:
            reads: list[_Read] = []
            events = 0
            item = await self._next_or_due(queue)
            if item is _DUE:
                await self._write_with_retry(reads, hold)
                continue
            linger_until = self.clock.monotonic_ms() + LINGER_MS
            while True:
                if isinstance(item, _Failed):
                    raise item.error
                if item is None:
                    readers -= 1
                elif isinstance(item, _Read):
                    reads.append(item)
                    events += sum(len(b.events) for b in item.batches)
                if events >= CHUNK_EVENTS_MAX:
                    break
                if queue.empty():
                    left = linger_until - self.clock.monotonic_ms()
                    if events >= LINGER_EVENTS or left <= 0 or not readers:
                        break
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(left / 1000):
                            item = await queue.get()
                            continue
                    break
                item = queue.get_nowait()
            if reads:
                await self._write_with_retry(reads, hold)

    async def _next_or_due(self, queue: asyncio.Queue[_Item]) -> _Item | _Due:
        """The next item; ``_DUE`` if a held row is due before one comes (rule 5)."""
        if not self._held_at:
            return await queue.get()
        due = min(h.since_ms for h in self._held_at.values()) + HOLD_LEASED_MS
        try:
            async with asyncio.timeout(max(0.0, due - self.clock.monotonic_ms()) / 1000):
                return await queue.get()
        except TimeoutError:
            return _DUE

    async def _write_with_retry(self, reads: Sequence[_Read], hold: bool) -> None:
        fold, marks = self._chunk(reads, hold)
        batches = [batch for r in reads for batch in r.batches]
        while True:
            started = self.clock.monotonic_ms()
            try:
                async with self.pool.acquire() as conn:
                    counted = history.HistoryFold(batches, self._hints)
                    await projection.write(conn, fold, marks, counted)
                break
            except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
                log.warning("projection write failed, retrying: %s", exc)
                await self.clock.sleep_ms(RETRY_MS)
        self.next_offsets.update(marks)
        self._after_write(reads, (self.clock.monotonic_ms() - started) / 1000)

    def _chunk(self, reads: Sequence[_Read], hold: bool) -> tuple[projection.Fold, dict[int, int]]:
        """The rows to write now (the held ones with this chunk's events folded onto them,
        less those held further) and the watermarks that cover them."""
        fold = _fold(reads, self._held)
        for r in reads:
            self._read_to[r.partition] = max(self._read_to.get(r.partition, 0), r.next_offset)
        if hold:
            self._held, self._held_at = _take_held(
                fold, self._held_at, reads, self.clock.monotonic_ms()
            )
        else:
            self._held, self._held_at = projection.Fold.empty(), {}
        marks = dict(self._read_to)
        for held in self._held_at.values():
            marks[held.partition] = min(marks[held.partition], held.offset)
        return fold, marks

    def _after_write(self, reads: Sequence[_Read], write_s: float) -> None:
        count = 0
        for r in reads:
            for batch in r.batches:
                count += len(batch.events)
                if batch.events:
                    self.last_event_ms = max(self.last_event_ms or 0, batch.events[-1].ts_ms)
        self.events_projected += count
        if self.on_write is not None:
            self.on_write(write_s)
        if self.metrics is not None:
            self.metrics.projected_events.inc(count)
            self.metrics.projection_batch.observe(write_s)


def _fold(reads: Sequence[_Read], held: projection.Fold) -> projection.Fold:
    """The events of ``reads`` folded onto the ``held`` rows (rule 5: as if one chunk)."""
    fold = held
    for r in reads:
        for batch in r.batches:
            for event in batch.events:
                fold.add(r.partition, event)
            for step in batch.steps:
                fold.add_step(step)
            for schedule in batch.schedules:
                fold.add_schedule(schedule)
    return fold


def _take_held(
    fold: projection.Fold, held_at: dict[str, _Held], reads: Sequence[_Read], now_ms: float
) -> tuple[projection.Fold, dict[str, _Held]]:
    """Take out of ``fold`` the rows to hold on (rule 5), with their attempts and steps (the
    snapshot shows a task's rows as of one moment): newest event TaskLeased, held for less
    than ``HOLD_LEASED_MS`` so far."""
    first: dict[int, int] = {}  # per partition, the offset of this chunk's first read
    for r in reads:
        first[r.partition] = min(first.get(r.partition, r.offset), r.offset)
    held = projection.Fold.empty()
    since: dict[str, _Held] = {}
    for task_id, row in fold.tasks.items():
        if row.last_event == _LEASED:
            at = held_at.get(task_id) or _Held(now_ms, row.partition, first[row.partition])
            if now_ms - at.since_ms < HOLD_LEASED_MS:
                held.tasks[task_id] = row
                since[task_id] = at
    for task_id in held.tasks:
        del fold.tasks[task_id]
    for key in [key for key in fold.attempts if key[0] in since]:
        held.attempts[key] = fold.attempts.pop(key)
    for step in [key for key in fold.steps if key[0] in since]:
        held.steps[step] = fold.steps.pop(step)
        if step in fold.step_started:  # the earliest time seen goes with it
            held.step_started[step] = fold.step_started.pop(step)
    return held, since
