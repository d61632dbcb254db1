"""A node: every partition of one data dir, in one process.

    home/
      log/        the record log (LocalLog, P partitions)
      events/     the events stream (LocalLog, P partitions), fed by the outboxes
      state/pNNNN RocksDB per partition
      node.json   partition count, fixed at creation

On Kafka (``Node.open_kafka``) the two logs are topics of the cluster (``<cluster>-log`` and
``<cluster>-events``) and only ``state/`` is local. Which partitions this node leads is then
decided by the cluster's membership (``streams/cluster/``), through ``start_partition``,
``pause_partition`` and ``stop_partition``; ``start`` leads them all (one node, or the
local log).

The node routes by task id or idempotency key, turns batches into one record per partition,
and fans agents' polls out over the partitions' dispatchers.
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import shutil
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from conveyor.errors import ContractError, InvariantError, NotFound, TransientError
from conveyor.schemas import codec
from conveyor.schemas.types import (
    CancelTasks,
    Checkpoint,
    CompleteAttempts,
    Completion,
    DeleteSchedule,
    EnqueueTasks,
    PauseQueue,
    PauseSchedule,
    Record,
    RecordSteps,
    RetryFailed,
    SaveCheckpoints,
    Schedule,
    SendEvents,
    StepWrite,
    Task,
    TaskEvent,
    TaskSpec,
    UpsertSchedule,
    WorkflowEvent,
)
from conveyor.store import keys
from conveyor.store.api import KV
from conveyor.store.memory import MemoryKV
from conveyor.store.state_schemas import open_state
from conveyor.store.tables import Tables, TaskCache
from conveyor.streams.clock import Clock, SystemClock
from conveyor.streams.log.api import Log
from conveyor.streams.log.local import LocalLog
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.machine import Reply
from conveyor.streams.processor.leases import CONTINUE
from conveyor.streams.processor.loop import PartitionProcessor, Settings
from conveyor.streams.processor.pool import Lease, WaitingPool
from conveyor.streams.processor.signals import CancelSignals
from conveyor.streams.routing import partition_for_key, partition_for_schedule, partition_of

log = logging.getLogger("conveyor.node")
T = TypeVar("T", TaskSpec, Completion, StepWrite, Checkpoint)
DEFAULT_PARTITIONS = 8
TASK_CACHE_MAX = 262_144
NOT_LED_RETRY_MS = 500


class Node:
    def __init__(
        self,
        log_: Log,
        events: Log,
        stores: Sequence[KV],
        *,
        clock: Clock | None = None,
        settings: Settings | None = None,
        node_id: str = "node",
    ) -> None:
        self.log = log_
        self.events = events
        self.stores = list(stores)
        self.clock = clock or SystemClock()
        self.pool = WaitingPool(self.clock)
        self.signals = CancelSignals(self.clock)  # cancels pushed to their agents
        # One bound for the whole node: a decoded task costs ~1.3 KB of Python heap.
        self.cache = TaskCache(TASK_CACHE_MAX)
        self.partitions = log_.partitions
        self.node_id = node_id
        self._settings = settings
        self._observers: list[Callable[[int, Sequence[TaskEvent]], None]] = []
        self.processors = [self._new_processor(p) for p in range(self.partitions)]
        self._open: set[int] = set()  # partitions whose processor runs (leading or paused)
        self._paused: set[int] = set()  # open, not leading: being handed over
        self._refusals: dict[int, TransientError] = {}  # closed: owned by another node

    def _new_processor(self, p: int) -> PartitionProcessor:
        processor = PartitionProcessor(
            p,
            self.log,
            self.stores[p],
            clock=self.clock,
            leader_id=self.node_id,
            events_log=self.events,
            settings=self._settings,
            pool=self.pool,
            cache=self.cache,
        )
        processor.observers.extend(self._observers)
        processor.leases.signals = self.signals
        return processor

    @classmethod
    async def open(
        cls,
        home: str | Path,
        *,
        partitions: int | None = None,
        clock: Clock | None = None,
        settings: Settings | None = None,
    ) -> Node:
        home = Path(home)
        partitions = _partition_count(home, partitions)
        log_ = await LocalLog.open(home / "log", partitions)
        events = await LocalLog.open(home / "events", partitions)
        (home / "state").mkdir(parents=True, exist_ok=True)
        stores = [open_state(home / "state" / f"p{p:04d}") for p in range(partitions)]
        return cls(log_, events, stores, clock=clock, settings=settings)

    @classmethod
    async def open_kafka(
        cls,
        home: str | Path,
        bootstrap: str,
        *,
        node_id: str,
        cluster: str = "conveyor",
        partitions: int | None = None,
        clock: Clock | None = None,
        settings: Settings | None = None,
    ) -> Node:
        """A node of ``cluster`` on the Kafka at ``bootstrap``: the record log and the events
        stream are the topics ``<cluster>-log`` and ``<cluster>-events`` (created when
        missing), RocksDB per partition stays in ``home/state``. Nothing is led yet."""
        from conveyor.streams.log.kafka import KafkaLog  # aiokafka only where Kafka is used

        home = Path(home)
        partitions = _partition_count(home, partitions)
        log_ = await KafkaLog.open(bootstrap, partitions, topic=f"{cluster}-log")
        try:
            events = await KafkaLog.open(bootstrap, partitions, topic=f"{cluster}-events")
        except BaseException:
            await log_.close()
            raise
        (home / "state").mkdir(parents=True, exist_ok=True)
        stores = [_state_of(home, p, log_.end_offset(p)) for p in range(partitions)]
        node = cls(log_, events, stores, clock=clock, settings=settings, node_id=node_id)
        for p in range(partitions):  # until the cluster gives it partitions (or ``start``)
            refusal = TransientError(
                f"partition {p} is not led by this node (yet); try again",
                retry_after_ms=NOT_LED_RETRY_MS,
            )
            node._refusals[p] = refusal
            node.processors[p].refuse(refusal)
        return node

    @classmethod
    def in_memory(
        cls, partitions: int = 2, *, clock: Clock | None = None, settings: Settings | None = None
    ) -> Node:
        return cls(
            MemoryLog(partitions),
            MemoryLog(partitions),
            [MemoryKV() for _ in range(partitions)],
            clock=clock,
            settings=settings,
        )

    async def start(self) -> None:
        """Lead every partition."""
        self._open.update(range(self.partitions))
        self._refusals.clear()
        await asyncio.gather(*(p.start() for p in self.processors))

    # -- one partition at a time (the cluster's ownership) -----------------------------------

    def is_open(self, p: int) -> bool:
        return p in self._open

    async def start_partition(self, p: int, *, epoch_floor: int = 0) -> None:
        """Lead partition ``p`` at a new epoch (at least ``epoch_floor``). A paused processor
        leads again as it is; a
        closed one is made anew over the local store and replays the log from its applied
        offset (another node may have led ``p`` meanwhile: the rows it cached are stale)."""
        if p not in self._open:
            self._forget_cached(p)
            processor = self.processors[p] = self._new_processor(p)
            try:
                await processor.start(lead=False)
            except BaseException:  # cancelled mid-replay (revoked): nothing of it runs on
                await processor.stop()
                raise
            self._open.add(p)
            self._refusals.pop(p, None)
        await self.processors[p].lead(epoch_floor=epoch_floor)
        self._paused.discard(p)

    async def pause_partition(self, p: int) -> None:
        """Stop leading ``p`` (no dispatch, no duty runs once this returns); its processor
        stays open and applies what the log brings, so leading it again costs no replay."""
        if p in self._open:
            self._paused.add(p)
            await self.processors[p].resign(f"partition {p} is being handed over")

    async def stop_partition(self, p: int, refusal: TransientError) -> None:
        """Close ``p``'s processor: another node owns it. Its waiters and every later call
        get ``refusal``."""
        self._open.discard(p)
        self._paused.discard(p)
        self._refusals[p] = refusal
        processor = self.processors[p]
        await processor.stop()
        processor.refuse(refusal)

    def serving(self, p: int) -> PartitionProcessor:
        """The processor of ``p``, for a read or a call; the refusal if another node owns it
        (its local state is stale)."""
        refusal = self._refusals.get(p)
        if refusal is not None:
            raise refusal
        return self.processors[p]

    def _forget_cached(self, p: int) -> None:
        rows = self.cache.rows
        for task_id in [t for t in rows if self.partition_of(t) == p]:
            del rows[task_id]
        paused = self.cache.paused  # its paused queues too (``Tables.paused_queues``)
        for key in [k for k, (store, _) in paused.items() if store is self.stores[p]]:
            del paused[key]

    def on_events(self, observe: Callable[[int, Sequence[TaskEvent]], None]) -> None:
        """``observe(partition, events)`` with the events of each batch a processor commits
        while running (not those of a replay at start: they were seen before, if ever)."""
        self._observers.append(observe)
        for processor in self.processors:
            processor.observers.append(observe)

    @staticmethod
    def tune_gc() -> None:
        """For a process whose main job is this node. The task cache keeps ~10^5 decoded rows
        alive and Python's cyclic collector walks every tracked object on each full pass: tens
        of milliseconds of stop-the-world per pass, straight into dispatch latency. Our rows
        hold no reference cycles, so collect young objects rarely and old ones almost never."""
        gc.collect()
        gc.freeze()
        gc.set_threshold(100_000, 50, 1_000)

    async def stop(self) -> None:
        await asyncio.gather(*(p.stop() for p in self.processors))
        await self.log.close()
        await self.events.close()
        for store in self.stores:
            store.close()

    # -- routing ----------------------------------------------------------------------------

    def partition_of(self, task_id: str) -> int:
        return partition_of(task_id, self.partitions)

    def partition_for_unkeyed(self, turn: int) -> int:
        """The ``turn``-th partition (cyclically) of those this node leads, for a task that may
        live on any partition (no key routes it): a node of a cluster keeps it local."""
        led = [p for p in range(self.partitions) if p not in self._refusals]
        return led[turn % len(led)] if led else turn % self.partitions

    def route(self, tenant: str, idempotency_key: str | None, task_id: str | None) -> int:
        if task_id is not None:
            return self.partition_of(task_id)
        if idempotency_key is not None:
            return partition_for_key(tenant, idempotency_key, self.partitions)
        raise ContractError("an enqueue needs a task id or an idempotency key")

    # -- client operations ------------------------------------------------------------------

    async def _fan_out(
        self,
        items: Sequence[T],
        task_id: Callable[[T], str],
        record: Callable[[list[T]], Record],
        specs: Sequence[TaskSpec] | None = None,
        isolate: bool = False,
    ) -> list[Reply]:
        """One record per partition, appended concurrently; one reply per item, in the order
        of ``items`` (the machine answers item i of a record with ``Reply.index == i``).
        ``specs``: the items, when they are the specs an EnqueueTasks encodes (its processor
        applies them as they are, ``processor/loop.py`` rule 5). ``isolate``: a partition that
        refuses its record for now (``TransientError``) answers its own items with
        ``retry_after_ms`` instead of failing the whole call, so one halted partition does not
        hold back the reports of every other."""
        positions: dict[int, list[int]] = defaultdict(list)
        for i, item in enumerate(items):
            positions[self.partition_of(task_id(item))].append(i)

        async def one(p: int, ix: list[int]) -> list[tuple[int, Reply]]:
            batch = [items[i] for i in ix]
            decoded = None if specs is None else [specs[i] for i in ix]
            try:
                replies = await self.processors[p].submit(
                    record(batch), task_id(batch[0]), specs=decoded
                )
            except TransientError as exc:
                if not isolate:
                    raise
                return [
                    (i, _later(task_id(items[i]), k, str(exc), exc.retry_after_ms))
                    for k, i in enumerate(ix)
                ]
            return [(ix[r.index], r) for r in replies]

        if len(positions) == 1:  # no gather: its tasks would add loop steps to every call
            ((p, ix),) = positions.items()
            results = [await one(p, ix)]
        else:
            results = await asyncio.gather(*(one(p, ix) for p, ix in positions.items()))
        ordered: list[Reply | None] = [None] * len(items)
        for pairs in results:
            for i, reply in pairs:
                ordered[i] = reply
        if any(r is None for r in ordered):
            raise InvariantError("an enqueued item got no reply from its partition")
        return [r for r in ordered if r is not None]

    async def enqueue(self, specs: Sequence[TaskSpec]) -> list[Reply]:
        """Durably enqueue ``specs`` (ids already minted on their partitions)."""
        return await self._fan_out(
            specs,
            _task_id,
            lambda b: EnqueueTasks(tasks=[codec.TASK_SPEC.encode(s) for s in b]),
            specs=specs,
        )

    async def cancel(self, tenant: str, task_id: str, reason: str) -> Reply:
        p = self.partition_of(task_id)
        replies = await self.processors[p].submit(
            CancelTasks(tenant=tenant, task_ids=[task_id], reason=reason), task_id
        )
        return replies[0]

    async def send_event(self, tenant: str, task_id: str, name: str, payload: bytes) -> Reply:
        """An event for a workflow: it wakes the workflow if it waits for ``name``, else it is
        kept for its next wait (``machine/handlers/events.py``)."""
        item = WorkflowEvent(task_id=task_id, name=name, payload=payload)
        p = self.partition_of(task_id)
        replies = await self.processors[p].submit(SendEvents(tenant=tenant, items=[item]), task_id)
        return replies[0]

    async def cancel_many(self, tenant: str, task_ids: Sequence[str], reason: str) -> list[Reply]:
        """One CancelTasks record per partition, appended concurrently; one reply per task."""
        by_partition: dict[int, list[str]] = defaultdict(list)
        for task_id in task_ids:
            by_partition[self.partition_of(task_id)].append(task_id)
        results = await asyncio.gather(
            *(
                self.processors[p].submit(
                    CancelTasks(tenant=tenant, task_ids=ids, reason=reason), ids[0]
                )
                for p, ids in by_partition.items()
            )
        )
        return [r for replies in results for r in replies]

    async def retry_failed(self, tenant: str, task_ids: Sequence[str]) -> list[Reply]:
        """Replies name the NEW tasks (one per task that was still dead-lettered)."""
        by_partition: dict[int, list[str]] = defaultdict(list)
        for task_id in task_ids:
            by_partition[self.partition_of(task_id)].append(task_id)
        results = await asyncio.gather(
            *(
                self.processors[p].submit(RetryFailed(tenant=tenant, task_ids=ids), ids[0])
                for p, ids in by_partition.items()
            )
        )
        return [r for replies in results for r in replies]

    def get(self, tenant: str, task_id: str) -> Task:
        task = self.serving(self.partition_of(task_id)).read_task(task_id)
        if task is None or task.tenant != tenant:
            raise NotFound(f"no task {task_id}", field="task_id")
        return task

    def tables(self, partition: int) -> Tables:
        return Tables(self.stores[partition])

    async def wait_finished(self, tenant: str, task_id: str, timeout_ms: float) -> Task:
        self.get(tenant, task_id)
        task = await self.processors[self.partition_of(task_id)].wait_finished(task_id, timeout_ms)
        if task is None:
            raise InvariantError(f"task {task_id} was found, then vanished")
        return task

    # -- schedules --------------------------------------------------------------------------

    def partition_of_schedule(self, tenant: str, schedule_id: str) -> int:
        return partition_for_schedule(tenant, schedule_id, self.partitions)

    async def upsert_schedule(self, record: UpsertSchedule) -> Reply:
        p = self.partition_of_schedule(record.tenant, record.schedule_id)
        (reply,) = await self.processors[p].submit(record, f"schedule/{record.schedule_id}")
        return reply

    async def delete_schedule(self, tenant: str, schedule_id: str) -> Reply:
        p = self.partition_of_schedule(tenant, schedule_id)
        record = DeleteSchedule(tenant=tenant, schedule_id=schedule_id)
        (reply,) = await self.processors[p].submit(record, f"schedule/{schedule_id}")
        return reply

    async def pause_schedule(self, tenant: str, schedule_id: str, *, paused: bool) -> Reply:
        """Pause (``paused``) or resume a schedule; not ok if there is no such schedule."""
        p = self.partition_of_schedule(tenant, schedule_id)
        record = PauseSchedule(tenant=tenant, schedule_id=schedule_id, paused=paused)
        (reply,) = await self.processors[p].submit(record, f"schedule/{schedule_id}")
        return reply

    # -- queues ------------------------------------------------------------------------------

    async def pause_queue(self, tenant: str, queue: str, *, paused: bool) -> None:
        """Pause (``paused``) or resume dispatch from ``queue`` of ``tenant``: a PauseQueue
        record on every partition, each waited for until applied (a queue spans partitions;
        ``machine/handlers/queues.py``). Sent again after a failure, it changes nothing where
        it was applied already. A resume deals the queue's ready tasks at once."""
        record = PauseQueue(tenant=tenant, queue=queue, paused=paused)
        await asyncio.gather(*(p.submit(record, f"queue/{queue}") for p in self.processors))
        if not paused:
            for p in self.processors:
                if p.leader:
                    p.dispatch.poke()

    def paused_queues(self, tenant: str) -> dict[str, int]:
        """The tenant's paused queues, with the number of partitions each is paused on (all of
        them but after a pause or resume that failed part way)."""
        counts: dict[str, int] = {}
        for p in self.processors:
            for queue in p.reader().paused_queues(tenant):
                counts[queue] = counts.get(queue, 0) + 1
        return counts

    def get_schedule(self, tenant: str, schedule_id: str) -> Schedule:
        p = self.partition_of_schedule(tenant, schedule_id)
        row = self.processors[p].reader().schedule(tenant, schedule_id)
        if row is None:
            raise NotFound(f"no schedule {schedule_id!r}", field="schedule_id")
        return row

    def list_schedules(self, tenant: str) -> list[Schedule]:
        """A tenant's schedules, by id. Schedules are few: every partition is scanned."""
        rows = [row for p in self.processors for row in p.reader().schedules(tenant)]
        return sorted(rows, key=lambda row: row.schedule_id)

    # -- agent operations -------------------------------------------------------------------

    async def poll(
        self,
        *,
        agent_id: str,
        app: str,
        tenants: list[str],
        queues: list[str],
        capacity: int,
        lease_ms: int = 30_000,
        wait_ms: float = 20_000,
        app_version: str | None = None,
        slots: int | None = None,
        task_types: frozenset[str] | None = None,
    ) -> list[Lease]:
        return await self.pool.poll(
            agent_id=agent_id,
            app=app,
            tenants=tenants,
            queues=queues,
            capacity=capacity,
            lease_ms=lease_ms,
            wait_ms=wait_ms,
            app_version=app_version,
            slots=slots,
            task_types=task_types,
        )

    def heartbeat(self, task_id: str, lease_id: int) -> str:
        p = self.partition_of(task_id)
        processor = self.serving(p)
        if p in self._paused:
            # Its next leader (this node or another) gives every running lease a fresh
            # interval: LOST now would kill work that a hand-over of a second does not end.
            return CONTINUE
        return processor.leases.heartbeat(task_id, lease_id)

    async def complete(self, items: Sequence[Completion]) -> list[Reply]:
        """Report attempt outcomes. Stale leases are rejected; the items of a partition that
        cannot take them now answer ``retry_after_ms``."""
        return await self._fan_out(
            items, _task_id, lambda b: CompleteAttempts(items=b), isolate=True
        )

    async def steps(self, items: Sequence[StepWrite]) -> list[Reply]:
        """Record step claims and commits, fenced by lease. The replies come once the records
        are applied: a commit is durable before its step's caller goes on."""
        return await self._fan_out(items, _task_id, lambda b: RecordSteps(items=b))

    async def checkpoint(self, items: Sequence[Checkpoint]) -> list[Reply]:
        return await self._fan_out(
            items, _task_id, lambda b: SaveCheckpoints(items=b), isolate=True
        )


def _task_id(item: TaskSpec | Completion | StepWrite | Checkpoint) -> str:
    return item.task_id


def _later(task_id: str, index: int, why: str, retry_after_ms: int) -> Reply:
    return Reply(
        offset=-1, index=index, ok=False, task_id=task_id, reason=why, retry_after_ms=retry_after_ms
    )


def _state_of(home: Path, p: int, log_end: int) -> KV:
    """Partition ``p``'s local store, emptied when it applied offsets its log never had: it
    was written from another log (a cluster or a topic made anew). It replays from the log."""
    path = home / "state" / f"p{p:04d}"
    store = open_state(path)
    applied = Tables(store).meta_int(keys.META_APPLIED)
    if applied is None or applied < log_end:
        return store
    log.warning(
        "%s applied offset %d but its log ends at %d: it was written from another log; "
        "rebuilding it from this one",
        path,
        applied,
        log_end,
    )
    store.close()
    shutil.rmtree(path)
    return open_state(path)


def _partition_count(home: Path, asked: int | None) -> int:
    home.mkdir(parents=True, exist_ok=True)
    meta = home / "node.json"
    if meta.exists():
        fixed = int(json.loads(meta.read_text())["partitions"])
        if asked is not None and asked != fixed:
            raise ContractError(
                f"{home} was created with {fixed} partitions; it cannot be opened with {asked}",
                field="partitions",
            )
        return fixed
    count = asked or DEFAULT_PARTITIONS
    meta.write_text(json.dumps({"partitions": count}))
    return count
