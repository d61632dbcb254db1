"""Typed tables over a KV, with the pending changes of the batch being applied.

The state machine reads and writes through ``Tables``; nothing reaches the KV until the
processor calls ``take_changes()`` and writes them, with the applied offset, in one batch.
Reads see the batch's own earlier writes. Dirty ``Task`` rows stay decoded until the batch is
taken, so a task touched by several records of one batch is encoded once.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from conveyor.errors import InvariantError
from conveyor.schemas import codec
from conveyor.schemas.types import (
    Attempt,
    Barrier,
    ChildLink,
    ChildResult,
    EventWait,
    IdempotencyEntry,
    Schedule,
    StepRow,
    StepTotals,
    Task,
    TaskSpec,
    TimerRef,
)
from conveyor.store import keys
from conveyor.store.api import KV
from conveyor.store.lanes import ready_lane


class TaskCache:
    """Decoded committed ``Task`` rows, most recently written last; bounded.

    Every transition reads a task, and decoding Avro costs more than the rest of the transition.
    The processor is the only writer of its partition, so after each commit the cache holds
    exactly the committed rows it has seen. Rows in it must not be edited outside a batch.
    """

    def __init__(self, size_max: int = 100_000) -> None:
        self.size_max = size_max
        self.rows: dict[str, Task] = {}
        # Per (store, tenant), the committed paused queues: read by every count of ready work
        # and every pick, changed by a PauseQueue record only (dropped when one commits). A
        # node's partitions share one cache: the key is the store's id, and the entry holds
        # the store itself (so that id is not reused while the entry lives).
        self.paused: dict[tuple[int, str], tuple[object, frozenset[str]]] = {}

    def get(self, task_id: str) -> Task | None:
        return self.rows.get(task_id)

    def put(self, task: Task) -> None:
        rows = self.rows
        rows.pop(task.task_id, None)
        rows[task.task_id] = task
        if len(rows) > self.size_max:
            del rows[next(iter(rows))]

    def clear(self) -> None:
        self.rows.clear()
        self.paused.clear()


class Tables:
    def __init__(self, kv: KV, cache: TaskCache | None = None) -> None:
        self.kv = kv
        self.cache = cache if cache is not None else TaskCache(0)
        self._pending: dict[bytes, bytes | None] = {}
        self._tasks: dict[str, Task] = {}  # decoded this batch
        self._dirty: set[str] = set()  # put this batch: encoded at take_changes
        self._new: set[str] = set()  # created this batch: their head row is written too
        self.earliest_timer_ms: int | None = None  # earliest timer armed since last taken
        self.messages_written = False  # a message row was put since last taken
        self._paused_changed: set[str] = set()  # tenants whose pauses this batch changed

    # -- raw access with the overlay ----------------------------------------------------------

    def _get(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key]
        return self.kv.get(key)

    def _put(self, key: bytes, value: bytes | None) -> None:
        self._pending[key] = value

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Committed pairs merged with pending ones, in key order, deletions hidden."""
        lo = start or prefix
        mine = sorted((k, v) for k, v in self._pending.items() if k.startswith(prefix) and k >= lo)
        if not mine:
            yield from self.kv.scan(prefix, start)
            return
        pending = dict(mine)
        committed = ((k, v) for k, v in self.kv.scan(prefix, start) if k not in pending)
        for key, value in heapq.merge(committed, mine, key=lambda kv: kv[0]):
            if value is not None:
                yield key, value

    def take_changes(self) -> dict[bytes, bytes | None]:
        """Everything written since the last call, encoded; the overlay starts empty again."""
        pending, task_codec, cache = self._pending, codec.TASK, self.cache
        for task_id in self._dirty:
            task = self._tasks[task_id]
            pending[keys.task(task_id)] = task_codec.encode_state(task)
            if task_id in self._new:
                pending[keys.head(task_id)] = task_codec.encode_head(task)
            detail = task_codec.detail_of(task)
            if detail != task.detail_written:
                # A new task writes a detail row only when it holds something: a value that
                # is not its default (None, or False for the compensation flags).
                if task.detail_written is not None or any(
                    v is not None and v is not False for v in detail
                ):
                    pending[keys.detail(task_id)] = task_codec.encode_detail(task)
                task.detail_written = detail
            cache.put(task)
        for tenant in self._paused_changed:
            cache.paused.pop((id(self.kv), tenant), None)  # committed with these: read again
        self._paused_changed = set()
        self._pending = {}
        self._tasks = {}
        self._dirty = set()
        self._new = set()
        return pending

    @property
    def dirty(self) -> bool:
        return bool(self._pending or self._dirty)

    # -- tasks and specs ----------------------------------------------------------------------

    def task(self, task_id: str) -> Task | None:
        found = self._tasks.get(task_id) or self.cache.get(task_id)
        if found is not None:
            self._tasks[task_id] = found
            return found
        state = self._get(keys.task(task_id))
        if state is None:
            return None
        head = self._get(keys.head(task_id))
        if head is None:
            raise InvariantError(f"task {task_id} has a state row but no head row")
        task = codec.TASK.decode(head, state, self._get(keys.detail(task_id)))
        # Handlers edit the row in place and then put it; keep the same object for the batch.
        self._tasks[task_id] = task
        if keys.task(task_id) not in self._pending:
            self.cache.put(task)
        return task

    def put_task(self, task: Task, *, new: bool = False) -> None:
        self._tasks[task.task_id] = task
        self._dirty.add(task.task_id)
        if new:
            self._new.add(task.task_id)

    def tasks(self) -> Iterator[Task]:
        """Every task of the partition, in task id order (for listings and checks)."""
        for key, _ in self.scan(keys.TASKS):
            task = self.task(key[1:].decode())
            if task is None:
                raise InvariantError(f"task row {key!r} vanished during a scan")
            yield task

    def spec(self, task_id: str) -> TaskSpec | None:
        raw = self._get(keys.spec(task_id))
        return None if raw is None else codec.TASK_SPEC.decode(raw)

    def put_spec(
        self, task_id: str, raw: bytes, payload: bytes, trace_context: str | None = None
    ) -> None:
        """The spec as enqueued, and its payload and trace context apart, so a lease reads
        them without decoding it."""
        self._put(keys.spec(task_id), raw)
        self._put(keys.payload(task_id), payload)
        if trace_context is not None:
            self._put(keys.trace(task_id), trace_context.encode())

    def trace_context(self, task_id: str) -> str | None:
        raw = self._get(keys.trace(task_id))
        return None if raw is None else raw.decode()

    def payload(self, task_id: str) -> bytes | None:
        return self._get(keys.payload(task_id))

    # -- attempts -----------------------------------------------------------------------------

    def put_attempt(self, attempt: Attempt) -> None:
        self._put(keys.attempt(attempt.task_id, attempt.attempt), codec.ATTEMPT.encode(attempt))

    def attempts(self, task_id: str) -> list[Attempt]:
        return [codec.ATTEMPT.decode(v) for _, v in self.scan(keys.attempts_of(task_id))]

    # -- steps ------------------------------------------------------------------------------

    def step(self, task_id: str, identity: str) -> StepRow | None:
        raw = self._get(keys.step(task_id, identity))
        return None if raw is None else codec.STEP_ROW.decode(raw)

    def put_step(self, task_id: str, row: StepRow) -> None:
        totals = keys.steps_of(task_id)
        if self._get(totals) is None:  # ``drop_steps`` finds the rows through it
            self._put(totals, codec.STEP_TOTALS.encode(StepTotals(count=0, bytes=0)))
        self._put(keys.step(task_id, row.identity), codec.STEP_ROW.encode(row))

    def steps(self, task_id: str) -> list[StepRow]:
        """Every step row of a task (claimed or committed), in identity order."""
        prefix = keys.steps_of(task_id) + b"/"
        return [codec.STEP_ROW.decode(v) for _, v in self.scan(prefix)]

    def step_totals(self, task_id: str) -> StepTotals:
        raw = self._get(keys.steps_of(task_id))
        return StepTotals(count=0, bytes=0) if raw is None else codec.STEP_TOTALS.decode(raw)

    def put_step_totals(self, task_id: str, totals: StepTotals) -> None:
        self._put(keys.steps_of(task_id), codec.STEP_TOTALS.encode(totals))

    def drop_steps(self, task_id: str) -> None:
        """Delete a task's step rows and totals. Every task with a step row has a totals row
        (``put_step`` makes sure), so a task without steps costs one point read."""
        totals = keys.steps_of(task_id)
        if self._get(totals) is None:
            return
        for key, _ in list(self.scan(totals + b"/")):
            self._put(key, None)
        self._put(totals, None)

    # -- idempotency --------------------------------------------------------------------------

    def idempotency(self, tenant: str, app: str, key: str) -> IdempotencyEntry | None:
        raw = self._get(keys.idempotency(tenant, app, key))
        return None if raw is None else codec.IDEMPOTENCY.decode(raw)

    def put_idempotency(self, tenant: str, app: str, key: str, entry: IdempotencyEntry) -> None:
        self._put(keys.idempotency(tenant, app, key), codec.IDEMPOTENCY.encode(entry))

    def delete_idempotency(self, tenant: str, app: str, key: str) -> None:
        self._put(keys.idempotency(tenant, app, key), None)

    # -- schedules ---------------------------------------------------------------------------

    def schedule(self, tenant: str, schedule_id: str) -> Schedule | None:
        raw = self._get(keys.schedule(tenant, schedule_id))
        return None if raw is None else codec.SCHEDULE.decode(raw)

    def put_schedule(self, row: Schedule) -> None:
        self._put(keys.schedule(row.tenant, row.schedule_id), codec.SCHEDULE.encode(row))

    def delete_schedule(self, tenant: str, schedule_id: str) -> None:
        self._put(keys.schedule(tenant, schedule_id), None)

    def schedules(self, tenant: str) -> Iterator[Schedule]:
        """A tenant's schedules on this partition, in schedule id order."""
        for _, value in self.scan(keys.schedules_of(tenant)):
            yield codec.SCHEDULE.decode(value)

    # -- workflows: barriers of ctx.parallel, their striped counters, child links -------------

    def barrier(self, parent_id: str, identity: str) -> Barrier | None:
        raw = self._get(keys.barrier(parent_id, identity))
        return None if raw is None else codec.BARRIER.decode(raw)

    def put_barrier(self, parent_id: str, row: Barrier) -> None:
        self._put(keys.barrier(parent_id, row.identity), codec.BARRIER.encode(row))

    def barriers(self, parent_id: str) -> list[Barrier]:
        """Every barrier of a workflow, in identity order."""
        return [codec.BARRIER.decode(v) for _, v in self.scan(keys.barriers_of(parent_id))]

    def stripe(self, parent_id: str, identity: str, n: int) -> int:
        raw = self._get(keys.stripe(parent_id, identity, n))
        return 0 if raw is None else keys.read_u64(raw)

    def put_stripe(self, parent_id: str, identity: str, n: int, count: int) -> None:
        self._put(keys.stripe(parent_id, identity, n), keys.u64(count) if count else None)

    def child_result(self, parent_id: str, identity: str, index: int) -> ChildResult | None:
        raw = self._get(keys.child_result(parent_id, identity, index))
        return None if raw is None else codec.CHILD_RESULT.decode(raw)

    def put_child_result(self, parent_id: str, identity: str, index: int, row: ChildResult) -> None:
        self._put(keys.child_result(parent_id, identity, index), codec.CHILD_RESULT.encode(row))

    def child_results(self, parent_id: str, identity: str) -> Iterator[tuple[int, ChildResult]]:
        """The landed children of a barrier, in child order."""
        prefix = keys.child_results_of(parent_id, identity)
        for key, value in self.scan(prefix):
            yield keys.read_u32(key, len(prefix)), codec.CHILD_RESULT.decode(value)

    def child_link(self, child_id: str) -> ChildLink | None:
        raw = self._get(keys.child(child_id))
        return None if raw is None else codec.CHILD_LINK.decode(raw)

    def put_child_link(self, child_id: str, link: ChildLink) -> None:
        self._put(keys.child(child_id), codec.CHILD_LINK.encode(link))

    # -- workflows: event waits and the events kept for them ------------------------------------

    def event_wait(self, task_id: str) -> EventWait | None:
        raw = self._get(keys.wait(task_id))
        return None if raw is None else codec.EVENT_WAIT.decode(raw)

    def put_event_wait(self, task_id: str, row: EventWait | None) -> None:
        self._put(keys.wait(task_id), None if row is None else codec.EVENT_WAIT.encode(row))

    def kept_events(self, task_id: str, name: str) -> Iterator[tuple[bytes, bytes]]:
        """(key, payload) of the events kept for ``name``, oldest first."""
        return self.scan(keys.inbox_of(task_id, name))

    def keep_event(self, task_id: str, name: str, seq: int, payload: bytes) -> None:
        self._put(keys.inbox(task_id, name, seq), payload)

    def drop_kept_event(self, key: bytes) -> None:
        self._put(key, None)

    # -- ready queues -----------------------------------------------------------------------
    #
    # A ready queue is consumed from its head, so its head is a trail of tombstones that every
    # seek would walk over. Three small indexes keep dispatch off that trail: a count of ready
    # tasks per (app, tenant) and per (app, tenant, task type, queue), and a head cursor per
    # queue with the rule "no live ready key of the queue sorts below its cursor". Taking from
    # the head moves the cursor up; a new key below it (a higher priority) moves it down.
    # A queue is per task type, so an agent takes only the types it serves: a task of a type
    # no waiting agent serves stays ready without standing in front of the others.

    def _bump(self, key: bytes, delta: int) -> None:
        raw = self._get(key)
        n = (0 if raw is None else keys.read_u64(raw)) + delta
        if n < 0:
            raise InvariantError(f"ready count below zero at {key!r}")
        self._put(key, keys.u64(n) if n else None)

    def add_ready(self, task: Task) -> None:
        queue = keys.queue_keys(ready_lane(task), task.tenant, task.task_type, task.queue)
        key = queue.ready(task.priority, task.ready_seq)
        self._put(key, task.task_id.encode())
        self._bump(queue.tenant_count, 1)
        self._bump(queue.queue_count, 1)
        cursor = self._get(queue.head)
        if cursor is not None and key < cursor:
            self._put(queue.head, key)

    def remove_ready(self, task: Task, *, taken: bool = False) -> None:
        """Drop a task from its ready queue; ``taken`` when dispatch took it from the head."""
        queue = keys.queue_keys(ready_lane(task), task.tenant, task.task_type, task.queue)
        key = queue.ready(task.priority, task.ready_seq)
        self._put(key, None)
        self._bump(queue.tenant_count, -1)
        self._bump(queue.queue_count, -1)
        if taken:
            head = queue.head
            cursor = self._get(head)
            if cursor is None or key > cursor:
                self._put(head, key)

    def ready_tenants(self, app: str) -> list[str]:
        """Tenants with ready work in lane ``app`` (``lanes.py``), in name order."""
        prefix = keys.ready_count_of(app)
        return [key[len(prefix) :].decode() for key, _ in self.scan(prefix)]

    def count_ready(self, app: str, tenant: str) -> int:
        raw = self._get(keys.ready_count(app, tenant))
        return 0 if raw is None else keys.read_u64(raw)

    def ready_queues(self, app: str, tenant: str) -> list[tuple[str, str, int]]:
        """(task type, queue, ready count) of the tenant's non-empty queues in lane ``app``,
        but for its paused queues: their tasks are not ready to be dispatched."""
        prefix = keys.queue_count_of(app, tenant)
        paused = self.paused_queues(tenant)
        out = []
        for key, value in self.scan(prefix):
            task_type, at = keys.read_lp(key, len(prefix))
            queue = key[at:].decode()
            if queue not in paused:
                out.append((task_type, queue, keys.read_u64(value)))
        return out

    # -- paused queues (PauseQueue): a tenant's queues not dispatched from ---------------------

    def paused_queues(self, tenant: str) -> frozenset[str]:
        """Read on every count and pick of ready work: from the cache unless this batch
        changed the tenant's pauses (then its pending rows count too)."""
        memo = (id(self.kv), tenant)
        if tenant not in self._paused_changed:
            held = self.cache.paused.get(memo)
            if held is not None and held[0] is self.kv:
                return held[1]
        prefix = keys.paused_queues_of(tenant)
        found = frozenset(key[len(prefix) :].decode() for key, _ in self.scan(prefix))
        if tenant not in self._paused_changed:
            self.cache.paused[memo] = (self.kv, found)
        return found

    def pause_queue(self, tenant: str, queue: str, *, paused: bool) -> None:
        self._paused_changed.add(tenant)
        self._put(keys.paused_queue(tenant, queue), b"" if paused else None)

    def ready_types(self, app: str, tenant: str) -> dict[str, int]:
        """Task type -> ready tasks of the tenant in lane ``app``."""
        counts: dict[str, int] = {}
        for task_type, _, n in self.ready_queues(app, tenant):
            counts[task_type] = counts.get(task_type, 0) + n
        return counts

    def ready_heads(
        self,
        app: str,
        tenant: str,
        queues: list[str],
        limit: int,
        task_types: list[str] | None = None,
    ) -> list[tuple[bytes, str]]:
        """Up to ``limit`` ready (key, task id) of one tenant, by priority then age, across
        ``queues`` (all when empty) and ``task_types`` (all when None). One seek per non-empty
        (type, queue) taken, found in the count index: no walk over other types' tasks."""
        wanted_queues = set(queues)
        wanted_types = None if task_types is None else set(task_types)
        streams = []
        for task_type, queue, _ in self.ready_queues(app, tenant):
            if wanted_queues and queue not in wanted_queues:
                continue
            if wanted_types is not None and task_type not in wanted_types:
                continue
            prefix = keys.ready_queue(app, tenant, task_type, queue)
            head = self._get(keys.queue_head(app, tenant, task_type, queue))
            streams.append(self.scan(prefix, head))
        merged = heapq.merge(*streams, key=lambda kv: keys.ready_order(kv[0]))
        out: list[tuple[bytes, str]] = []
        for key, value in merged:
            out.append((key, value.decode()))
            if len(out) >= limit:
                break
        return out

    # -- timers -------------------------------------------------------------------------------

    def add_timer(self, ref: TimerRef) -> None:
        self._put(keys.timer(ref), b"")
        if self.earliest_timer_ms is None or ref.fire_at_ms < self.earliest_timer_ms:
            self.earliest_timer_ms = ref.fire_at_ms

    def remove_timer(self, ref: TimerRef) -> None:
        self._put(keys.timer(ref), None)

    def timer_exists(self, ref: TimerRef) -> bool:
        return self._get(keys.timer(ref)) is not None

    def due_timers(self, now_ms: int, limit: int, from_ms: int = 0) -> list[TimerRef]:
        """Timers due at ``now_ms``; ``from_ms`` skips the fired ones' tombstones below it."""
        bound = keys.timers_until(now_ms)
        out: list[TimerRef] = []
        for key, _ in self.scan(keys.TIMERS, keys.timers_until(from_ms - 1)):
            if key >= bound or len(out) >= limit:
                break
            out.append(keys.parse_timer(key))
        return out

    def next_timer_ms(self, from_ms: int = 0) -> int | None:
        first = next(self.scan(keys.TIMERS, keys.timers_until(from_ms - 1)), None)
        return None if first is None else keys.read_u64(first[0], 1)

    # -- leased index, dead letters, meta -----------------------------------------------------

    def set_leased(self, task_id: str, lease_id: int, lease_ms: int) -> None:
        """Index a task's lease: its id and the interval its agent asked for. Heartbeat
        deadlines live in the leader's memory only, so a new leader restarts every running
        lease from this row; with the node's default interval instead, a lease heartbeated on
        time inside a longer one would lapse."""
        self._put(keys.leased(task_id), keys.u64(lease_id) + keys.u64(lease_ms))

    def clear_leased(self, task_id: str) -> None:
        self._put(keys.leased(task_id), None)

    def leased(self) -> Iterator[tuple[str, int, int | None]]:
        """(task id, lease id, interval) of every live lease; the interval is None in a row
        written before rows kept it."""
        for key, value in self.scan(keys.LEASED):
            lease_ms = keys.read_u64(value, 8) if len(value) >= 16 else None
            yield key[1:].decode(), keys.read_u64(value), lease_ms

    def add_dead(self, tenant: str, task_id: str) -> None:
        self._put(keys.dead(tenant, task_id), b"")

    def remove_dead(self, tenant: str, task_id: str) -> None:
        self._put(keys.dead(tenant, task_id), None)

    def is_dead(self, tenant: str, task_id: str) -> bool:
        return self._get(keys.dead(tenant, task_id)) is not None

    def dead(self, tenant: str) -> Iterator[str]:
        prefix = keys.dead_of(tenant)
        for key, _ in self.scan(prefix):
            yield key[len(prefix) :].decode()

    def meta_int(self, key: bytes) -> int | None:
        raw = self._get(key)
        return None if raw is None else keys.read_u64(raw)

    def put_meta_int(self, key: bytes, value: int) -> None:
        self._put(key, keys.u64(value))

    def meta_str(self, key: bytes) -> str | None:
        raw = self._get(key)
        return None if raw is None else raw.decode()

    def put_meta_str(self, key: bytes, value: str) -> None:
        self._put(key, value.encode())

    def put_message(self, offset: int, seq: int, partition: int, data: bytes) -> None:
        """An encoded record for another partition's log, shipped after commit (``messages``)."""
        self._put(keys.message(offset, seq), keys.message_value(partition, data))
        self.messages_written = True

    def get_raw(self, key: bytes) -> bytes | None:
        """A row of a table kept by its own module (``store/catalog.py``), with the overlay."""
        return self._get(key)

    def put_raw(self, key: bytes, value: bytes | None) -> None:
        """For the processor's own rows (outbox, applied offset) in the same batch."""
        self._put(key, value)
