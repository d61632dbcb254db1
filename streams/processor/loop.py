"""PartitionProcessor: one per partition. Read -> apply -> ONE write batch -> then actions.

Rule 1: state changes, the outbox row of the batch's events and the applied offset go into one
KV write batch. Nothing else writes partition state.
Rule 2: actions run only after that batch is written, and only on the leader. They are
idempotent and can be rebuilt from state (a new leader rebuilds its lease table from the
``leased`` index and gives every running lease a fresh interval).
Rule 3: on start the processor replays the log from the offset after the applied one; every
record is applied to state exactly once.
Rule 4: a corrupt log (``LogCorruption``, at start or later) halts this partition only: nothing
after the bad record is applied, waiters get a retryable error, the other partitions go on.
Rule 5: a record this processor appends is applied from the objects it encoded, found by its
bytes, not decoded back from the log (decoding was a seventh of the apply loop's time). Those
objects are what decoding the bytes gives (``tests/unit/test_codec.py`` holds the round trips),
so this is a memo of the decoder and changes no outcome; a replay, and any record appended
elsewhere, is decoded.
Rule 6: leader duties are supervised. One that fails on an error none of them expects (a bug)
ends them all, and after a pause (doubling, at most ``RELEAD_MAX_MS``) this processor leads
again as a new leader would: a fresh epoch, the running leases taken over. Left dead, the
partition would take work and never dispatch it, with nothing said.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from conveyor.errors import TransientError
from conveyor.frozen import frozen
from conveyor.schemas import codec
from conveyor.schemas.types import (
    AnnounceEpoch,
    EventBatch,
    EventKind,
    GrantLeases,
    Record,
    RetryFailed,
    ScheduleEvent,
    StepEvent,
    Task,
    TaskEvent,
    TaskSpec,
)
from conveyor.store import keys
from conveyor.store.api import KV
from conveyor.store.tables import Tables, TaskCache
from conveyor.streams.clock import Clock
from conveyor.streams.log.api import Log, LogCorruption, LogRecord, LogSealed
from conveyor.streams.machine import (
    Action,
    CancelLease,
    LeaseEnded,
    Meta,
    Offer,
    Reply,
    TaskFinished,
    apply,
    current_epoch,
)
from conveyor.streams.processor import leadership
from conveyor.streams.processor.dispatch import Dispatcher
from conveyor.streams.processor.leases import LeaseTracker
from conveyor.streams.processor.messages import MessageShipper
from conveyor.streams.processor.outbox import OutboxShipper
from conveyor.streams.processor.pool import WaitingPool
from conveyor.streams.processor.timers import TimerScanner

log = logging.getLogger("conveyor.processor")
UNAPPLIED_STAMPS_MAX = 65_536  # appended-not-applied stamps kept for the lag metric

QUARANTINE = b"q"  # q u64:offset -> reason: records that could not be decoded
# Replies of offsets nobody waits for yet: a submitter registers right after its append
# returns, so a short window suffices. Kept in offset (= insertion) order.
EARLY_KEEP = 16_384
RELEAD_MIN_MS, RELEAD_MAX_MS = 1_000, 30_000  # rule 6: the pause before leading again
APPENDED_KEEP = 4_096  # records appended here and not yet applied, kept decoded (rule 5)
READY_EVENTS = frozenset({EventKind.TaskEnqueued, EventKind.TaskRequeued, EventKind.TaskLeased})


@frozen
class _Appended:
    """A record as this processor encoded it (rule 5)."""

    epoch: int
    ts_ms: int
    record: Record
    specs: Sequence[TaskSpec] | None  # an EnqueueTasks' items, before they were encoded


@dataclass(slots=True)
class Settings:
    lease_ms: int = 30_000
    read_batch: int = 256
    timer_batch: int = 1_000


class PartitionProcessor:
    def __init__(
        self,
        partition: int,
        log_: Log,
        kv: KV,
        *,
        clock: Clock,
        leader_id: str = "node",
        events_log: Log | None = None,
        settings: Settings | None = None,
        pool: WaitingPool | None = None,
        cache: TaskCache | None = None,
    ) -> None:
        self.partition = partition
        self.log = log_
        self.kv = kv
        self.clock = clock
        self.leader_id = leader_id
        self.settings = settings or Settings()
        self.cache = cache if cache is not None else TaskCache()
        self.tables = Tables(kv, self.cache)
        applied = self.reader().meta_int(keys.META_APPLIED)
        self.applied = -1 if applied is None else applied
        self.epoch = 0
        self.leader = False
        self.records_applied = 0
        # For the processor-lag metric (lag_s): (offset, stamp) of the records appended here
        # and not yet applied, oldest first; the stamp of the last record applied; and when
        # the processor last had applied everything appended.
        self._unapplied: deque[tuple[int, int]] = deque()
        self.applied_ts_ms = 0
        self.caught_up_ms = self.clock.now_ms()
        self._replies: dict[int, asyncio.Future[list[Reply]]] = {}
        self._early: dict[int, list[Reply]] = {}
        self._finished: dict[str, list[asyncio.Future[None]]] = defaultdict(list)
        self._applied_waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._appended: dict[bytes, _Appended] = {}
        # The leader duties reach this processor through the ``Partition`` protocol only
        # (``duties.py``), and their other collaborators are handed to them here.
        self.pool = pool or WaitingPool(clock)
        self.leases = LeaseTracker(self, self.pool.ledger, self.settings.lease_ms)
        self.dispatch = Dispatcher(self, self.pool, self.leases)
        self.timers = TimerScanner(self, self.settings.timer_batch)
        self.outbox = OutboxShipper(self, kv, events_log)
        self.messages = MessageShipper(self, kv, log_)
        self._tasks: list[asyncio.Task[None]] = []
        self._duties: list[asyncio.Task[None]] = []  # the leader's (rule 6)
        self.duty_failures = 0
        self._failed: BaseException | None = None
        self._refusal: TransientError | None = None  # set by ``refuse``
        self._supervisor: asyncio.Task[None] | None = None
        # Called with (partition, events) after each live batch (``Node.on_events``).
        self.observers: list[Callable[[int, Sequence[TaskEvent]], None]] = []

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self, *, lead: bool = True) -> None:
        try:
            await self._replay()
        except LogCorruption as exc:  # rule 4: halted, but the node starts
            self._failed = exc
            log.error("partition %d halted: %s", self.partition, exc)
            return
        self._tasks.append(asyncio.create_task(self._apply_loop(), name=f"apply-{self.partition}"))
        if lead:
            await self.lead()

    async def lead(self, *, epoch_floor: int = 0) -> None:
        """Become the leader at a new epoch (at least ``epoch_floor``) and run the duties
        (supervised, rule 6)."""
        await self._become_leader(epoch_floor)
        self._supervisor = asyncio.create_task(self._supervise(), name=f"lead-{self.partition}")
        self._tasks.append(self._supervisor)

    async def resign(self, why: str) -> None:
        """Stop leading: once this returns no duty runs and nothing is dispatched. Records go
        on being applied; ``lead`` makes this processor the leader again."""
        self.step_down(why, expected=True)
        await self._end_duties()
        if self._supervisor is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor

    def refuse(self, error: TransientError) -> None:
        """Serve nothing more (another node owns this partition now): every waiter and every
        later call gets ``error``. For a stopped processor."""
        self._refusal = error
        self._fail_waiters(error, error)

    async def _replay(self) -> None:
        end = self.log.end_offset(self.partition)
        if self.applied + 1 >= end:
            return
        async for batch in self.log.read(self.partition, self.applied + 1, follow=False):
            self._apply_batch(batch, live=False)

    async def _become_leader(self, epoch_floor: int = 0) -> None:
        self.epoch = await leadership.mint(self.log, self.partition, epoch_floor)
        self.leader = True
        offset = await self.propose(AnnounceEpoch(leader_id=self.leader_id))
        await self.wait_applied(offset)
        self.leases.take_over(self.reader())
        duties = (
            self.dispatch.run(),
            self.leases.run(),
            self.timers.run(),
            self.outbox.run(),
            self.messages.run(),
        )
        self._duties = [asyncio.create_task(duty) for duty in duties]
        self.dispatch.poke()  # polls that waited through a change of leader: count for them
        log.info("partition %d: leader at epoch %d", self.partition, self.epoch)

    async def _supervise(self) -> None:
        """Rule 6."""
        pause_ms: float = RELEAD_MIN_MS
        while self._duties:
            done, _ = await asyncio.wait(self._duties, return_when=asyncio.FIRST_COMPLETED)
            failed = next((t for t in done if not t.cancelled() and t.exception()), None)
            await self._end_duties()
            if failed is None or not self.leader:
                return  # stepped down (fenced): the duties ended with the leadership
            self.duty_failures += 1
            log.error(
                "partition %d: a leader duty failed; leading again in %d ms",
                self.partition,
                pause_ms,
                exc_info=failed.exception(),
            )
            self.step_down("a leader duty failed")
            pause_ms = await self._lead_again(pause_ms)

    async def _lead_again(self, pause_ms: float) -> float:
        """After pauses from ``pause_ms`` (doubling), lead again; the next pause. Gives up
        (no duties) when the partition halted or another leader fenced it meanwhile."""
        while not self._duties:
            await self.clock.sleep_ms(pause_ms)
            pause_ms = min(2 * pause_ms, RELEAD_MAX_MS)
            if self._failed is not None:
                break  # halted: nothing to lead
            try:
                await self._become_leader()
            except LogSealed:
                break  # another leader took over meanwhile: it leads
            except TransientError as exc:
                log.warning("partition %d: leading again failed: %s", self.partition, exc)
                self.step_down("leading again failed")
        return pause_ms

    async def _end_duties(self) -> None:
        duties, self._duties = self._duties, []
        for task in duties:
            task.cancel()
        await asyncio.gather(*duties, return_exceptions=True)

    def step_down(self, why: str, *, expected: bool = False) -> None:
        """Fenced, halted or stopping: end every leader duty, drop every in-memory lease (a
        heartbeat answers LOST from now on)."""
        if not self.leader:
            return
        level = logging.INFO if expected else logging.WARNING
        log.log(level, "partition %d: stepping down: %s", self.partition, why)
        self.leader = False
        self.dispatch.clear()
        self.leases.clear()
        for duty in self._duties:  # a duty waiting for a poke would wait on for nothing
            duty.cancel()

    async def stop(self) -> None:
        self.step_down("stopping", expected=True)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        await self._end_duties()

    # -- proposing and submitting -------------------------------------------------------------

    def _encode(self, record: Record, epoch: int, key: str) -> tuple[bytes, int]:
        """The record's bytes, and the stamp they carry."""
        ts_ms = self.clock.now_ms()
        return codec.encode_record(record, epoch=epoch, ts_ms=ts_ms, key=key), ts_ms

    async def propose(self, record: Record) -> int:
        """Append a leader record under this leader's epoch; a fence means step down."""
        if not self.leader:
            raise LogSealed(f"partition {self.partition}: not the leader")
        epoch = self.epoch
        data, ts_ms = self._encode(record, epoch, f"leader/{self.partition}")
        try:
            (offset,) = await self._append(data, _Appended(epoch, ts_ms, record, None), epoch)
        except LogSealed as exc:
            self.step_down(str(exc))
            raise
        self._remember_stamp(offset, ts_ms)
        return offset

    async def submit(
        self, record: Record, key: str, *, specs: Sequence[TaskSpec] | None = None
    ) -> list[Reply]:
        """Append a client or agent record and wait until it is applied; its replies.
        ``specs``: for an EnqueueTasks, the specs its items encode (rule 5)."""
        self._check_alive()
        data, ts_ms = self._encode(record, 0, key)
        (offset,) = await self._append(data, _Appended(0, ts_ms, record, specs))
        self._remember_stamp(offset, ts_ms)
        return await self.replies(offset)

    async def _append(self, data: bytes, decoded: _Appended, epoch: int | None = None) -> list[int]:
        """Append one record, keeping it decoded for the apply loop (rule 5). Kept before
        the append: the apply loop reads a durable record before the appender resumes."""
        if len(self._appended) >= APPENDED_KEEP:  # the apply loop is far behind, or halted
            self._appended.clear()
        if 0 <= decoded.ts_ms < codec.TS_MS_END:  # else decoding quarantines it: so must we
            self._appended[data] = decoded
        try:
            return await self.log.append(self.partition, [data], epoch=epoch)
        except BaseException:
            self._appended.pop(data, None)
            raise

    async def replies(self, offset: int) -> list[Reply]:
        early = self._early.pop(offset, None)
        if early is not None:
            return early
        if offset <= self.applied:
            return []
        future = self._replies.get(offset)
        if future is None:
            # A partition that halted while this record was being appended failed every
            # waiter it had; a waiter made after that would wait forever.
            self._check_alive()
            future = self._replies[offset] = asyncio.get_running_loop().create_future()
        return await future

    async def wait_applied(self, offset: int) -> None:
        if offset <= self.applied:
            return
        self._check_alive()
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._applied_waiters.append((offset, future))
        await future

    async def wait_finished(self, task_id: str, timeout_ms: float) -> Task | None:
        task = self.read_task(task_id)
        if task is None or task.finished_ms is not None:
            return task
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._finished[task_id].append(future)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(future, timeout_ms / 1000)
        return self.read_task(task_id)

    def read_task(self, task_id: str) -> Task | None:
        return self.reader().task(task_id)

    def reader(self) -> Tables:
        """Committed state, for reads between batches (never for writes)."""
        return Tables(self.kv, self.cache)

    @property
    def halted(self) -> BaseException | None:
        """Why this partition stopped applying records (rule 4), or None while it runs."""
        return self._failed

    def _check_alive(self) -> None:
        if self._refusal is not None:
            raise self._refusal
        if self._failed is not None:
            raise TransientError(
                f"partition {self.partition} halted ({self._failed!r}); nothing was written. "
                "It stays halted until the node is restarted after the cause is fixed",
                retry_after_ms=5_000,
            ) from self._failed

    # -- lag --------------------------------------------------------------------------------

    def lag_records(self) -> int:
        """Records appended but not yet applied."""
        return max(0, self.log.end_offset(self.partition) - self.applied - 1)

    def lag_s(self) -> float:
        """Age of the oldest record appended but not applied; 0 when there is none.

        Records are stamped when this processor appends them (``submit``, ``propose``), so
        the oldest stamp it remembers above the applied offset is that age. A record it did
        not append (there is none with the local log; a restart forgets them) was appended
        after the processor was last caught up and stamped after the last record it applied:
        the later of the two bounds its age from above."""
        if not self.lag_records():
            return 0.0
        stamps = [ts for offset, ts in self._unapplied if offset > self.applied]
        since_ms = min(stamps) if stamps else max(self.caught_up_ms, self.applied_ts_ms)
        return max(0.0, (self.clock.now_ms() - since_ms) / 1000)

    def _remember_stamp(self, offset: int, ts_ms: int) -> None:
        if len(self._unapplied) < UNAPPLIED_STAMPS_MAX:  # beyond, the oldest are what matter
            self._unapplied.append((offset, ts_ms))

    def _note_progress(self) -> None:
        while self._unapplied and self._unapplied[0][0] <= self.applied:
            self._unapplied.popleft()
        if not self.lag_records():
            self.caught_up_ms = self.clock.now_ms()

    # -- the apply loop -----------------------------------------------------------------------

    async def _apply_loop(self) -> None:
        try:
            async for batch in self.log.read(
                self.partition, self.applied + 1, follow=True, max_batch=self.settings.read_batch
            ):
                self._apply_batch(batch)
                self._note_progress()
                await asyncio.sleep(0)  # let appenders and agents in between batches
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self._failed = exc
            log.exception("partition %d halted", self.partition)
            self._fail_waiters(exc)
            # Nothing it proposes would be applied: no grants, timers or expiries piling up
            # in the log, and agents learn their leases here are lost.
            self.step_down(f"the partition halted ({exc!r})")
            raise

    def _apply_batch(self, batch: list[LogRecord], *, live: bool = True) -> None:
        """Apply, commit, then act; ``live`` False while replaying (nobody waits for
        replies of records applied before this start)."""
        actions: list[Action] = []
        events: list[TaskEvent] = []
        steps: list[StepEvent] = []
        schedules: list[ScheduleEvent] = []
        # Events committed before a scan (below): _after_commit wakes the outbox and the
        # dispatcher for them too, or a task enqueued there waits uncounted.
        flushed: list[TaskEvent] = []
        for item in batch:
            appended = self._appended.pop(item.data, None) or self._decode(item)
            if appended is None:
                continue
            record = appended.record
            if isinstance(record, (GrantLeases, RetryFailed)) and self.tables.dirty:
                # Scans are cheapest over committed state: flush the batch so far first.
                self._commit(item.offset - 1, events, steps, schedules)
                flushed.extend(events)
                events, steps, schedules = [], [], []
            meta = Meta(
                partition=self.partition,
                offset=item.offset,
                epoch=appended.epoch,
                ts_ms=appended.ts_ms,
                partitions=self.log.partitions,
            )
            self.applied_ts_ms = appended.ts_ms
            outcome = apply(self.tables, record, meta, specs=appended.specs)
            actions.extend(outcome.actions)
            events.extend(outcome.events)
            steps.extend(outcome.steps)
            schedules.extend(outcome.schedules)
        self._commit(batch[-1].offset, events, steps, schedules)
        self.records_applied += len(batch)
        if self.leader and current_epoch(self.reader()) > self.epoch:
            self.step_down(f"a newer epoch {current_epoch(self.reader())} was announced")
        self._after_commit(actions, flushed + events, live=live)

    def _decode(self, item: LogRecord) -> _Appended | None:
        """The record at ``item``, or None: it does not decode, and is quarantined."""
        try:
            envelope = codec.decode_envelope(item.data)
            record = codec.decode_body(envelope)
        except codec.RecordDecodeError as exc:
            log.error("partition %d offset %d quarantined: %s", self.partition, item.offset, exc)
            self.tables.put_raw(QUARANTINE + keys.u64(item.offset), str(exc).encode())
            return None
        return _Appended(envelope.epoch, envelope.ts_ms, record, None)

    def _commit(
        self,
        offset: int,
        events: list[TaskEvent],
        steps: list[StepEvent] | None = None,
        schedules: list[ScheduleEvent] | None = None,
    ) -> None:
        changes = self.tables.take_changes()
        changes[keys.META_APPLIED] = keys.u64(offset)
        if events or steps or schedules:
            batch = EventBatch(
                partition=self.partition,
                offset=offset,
                events=events,
                steps=steps or [],
                schedules=schedules or [],
            )
            changes[keys.outbox(offset)] = codec.EVENT_BATCH.encode(batch, keep=True)
        self.kv.write(changes)
        self.applied = offset
        if (steps or schedules) and not events:
            self.outbox.poke()  # committed: ship it (a batch with task events pokes later)

    def _after_commit(
        self, actions: list[Action], events: list[TaskEvent], *, live: bool = True
    ) -> None:
        replies: dict[int, list[Reply]] = defaultdict(list)
        freed = False  # a lease of a tenant with a concurrency cap ended: deal again
        for action in actions:
            match action:
                case Reply():
                    replies[action.offset].append(action)
                case Offer():
                    if self.leader:
                        self.dispatch.deliver(action)
                case LeaseEnded():
                    tenant = self.leases.forget(action.task_id, action.lease_id)
                    freed |= tenant is not None and self.pool.caps(tenant) is not None
                case CancelLease():
                    self.leases.mark_cancel(action.task_id, action.lease_id)
                case TaskFinished():
                    for done in self._finished.pop(action.task_id, []):
                        if not done.done():
                            done.set_result(None)
        for offset, items in replies.items():
            waiter = self._replies.pop(offset, None)
            if waiter is not None:
                if not waiter.done():
                    waiter.set_result(items)
            elif live:
                self._early[offset] = items
        while len(self._early) > EARLY_KEEP:
            del self._early[next(iter(self._early))]
        for offset in [o for o in self._replies if o <= self.applied]:
            unanswered = self._replies.pop(offset)
            if not unanswered.done():
                unanswered.set_result([])
        self._wake_applied()
        if freed and self.leader:
            self.pool.deal()
        if events:
            self.outbox.poke()
            if live:
                self._observe(events)
            if self.leader and any(e.kind in READY_EVENTS for e in events):
                self.dispatch.poke()
        if self.tables.messages_written:  # committed: ship them to their partitions
            self.tables.messages_written = False
            self.messages.poke()
        # Not only after events: a schedule's pause, resume or upsert arms a timer silently,
        # and the scanner must lower its floor to see it.
        armed = self.tables.earliest_timer_ms
        if armed is not None:
            self.tables.earliest_timer_ms = None
            self.timers.armed(armed)

    def _observe(self, events: list[TaskEvent]) -> None:
        for observe in self.observers:
            try:
                observe(self.partition, events)
            except Exception:  # a metric must never halt the partition
                log.exception("partition %d: an events observer failed", self.partition)

    def _wake_applied(self) -> None:
        if not self._applied_waiters:
            return
        keep = []
        for offset, future in self._applied_waiters:
            if offset <= self.applied:
                if not future.done():
                    future.set_result(None)
            else:
                keep.append((offset, future))
        self._applied_waiters = keep

    def _fail_waiters(self, exc: BaseException, error: TransientError | None = None) -> None:
        error = error or TransientError(
            f"partition {self.partition} halted: {exc}", retry_after_ms=1_000
        )
        for waiter in self._replies.values():
            if not waiter.done():
                waiter.set_exception(error)
        for _, applied in self._applied_waiters:
            if not applied.done():
                applied.set_exception(error)
