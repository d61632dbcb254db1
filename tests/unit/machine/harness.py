"""A small driver over the pure state machine, committing like the processor does.

Every record gets the next offset; after ``apply`` the harness takes the table changes, adds
the applied offset and (when there are events) the outbox row, and writes them in ONE KV batch,
exactly as ``PartitionProcessor._commit`` does with a batch of one record. Records go through
the Avro codec first, so the machine sees what it would see in production.

The clock is the harness's ``now_ms``; it moves only when a test says so (``advance``,
``fire_due(now_ms)``, or ``ts_ms=`` on one record).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from conveyor.schemas import codec
from conveyor.schemas.types import (
    LEADER_RECORDS,
    AnnounceEpoch,
    CancelTasks,
    Checkpoint,
    CompleteAttempts,
    Completion,
    EnqueueTasks,
    EventBatch,
    ExpireLeases,
    FireTimers,
    GrantLeases,
    LeaseRef,
    LeaseRequest,
    Outcome,
    Record,
    RetryFailed,
    SaveCheckpoints,
    Task,
    TaskSpec,
    TimerRef,
)
from conveyor.store import keys
from conveyor.store.memory import MemoryKV
from conveyor.store.tables import Tables, TaskCache
from conveyor.streams.machine import Grant, Meta, Offer, apply
from conveyor.streams.machine import Outcome as MachineOutcome

START_MS = 1_700_000_000_000
APP = "app"


@dataclass
class Applied:
    """One record the harness applied, with where it sat and what it produced."""

    record: Record
    meta: Meta
    outcome: MachineOutcome
    raw: bytes  # the record as the log would hold it


@dataclass
class Harness:
    partition: int = 0
    partitions: int = 1  # of the node: where spilled children of a fan-out go
    now_ms: int = START_MS
    roundtrip: bool = True  # encode + decode every record, as the processor would see it
    kv: MemoryKV = field(default_factory=MemoryKV)
    cache: TaskCache = field(default_factory=TaskCache)
    offset: int = 0  # the offset the next record gets
    epoch: int = 0  # the epoch leader records are stamped with by default
    history: list[Applied] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tables = Tables(self.kv, self.cache)
        self._ids = itertools.count(1)

    # -- the core step ---------------------------------------------------------------------

    def apply(
        self, record: Record, *, ts_ms: int | None = None, epoch: int | None = None
    ) -> MachineOutcome:
        """Apply one record at the next offset and commit it in one write batch."""
        if epoch is None:
            epoch = self.epoch if isinstance(record, LEADER_RECORDS) else 0
        ts = self.now_ms if ts_ms is None else ts_ms
        raw = codec.encode_record(record, epoch=epoch, ts_ms=ts, key="harness")
        if self.roundtrip:
            record = codec.decode_body(codec.decode_envelope(raw))
        meta = Meta(
            partition=self.partition,
            offset=self.offset,
            epoch=epoch,
            ts_ms=ts,
            partitions=self.partitions,
        )
        outcome = apply(self.tables, record, meta)
        changes = self.tables.take_changes()
        changes[keys.META_APPLIED] = keys.u64(meta.offset)
        if outcome.events or outcome.steps or outcome.schedules:
            batch = EventBatch(
                partition=self.partition,
                offset=meta.offset,
                events=outcome.events,
                steps=outcome.steps,
                schedules=outcome.schedules,
            )
            changes[keys.outbox(meta.offset)] = codec.EVENT_BATCH.encode(batch)
        self.kv.write(changes)
        self.offset += 1
        self.history.append(Applied(record, meta, outcome, raw))
        return outcome

    # -- building records --------------------------------------------------------------------

    def new_id(self) -> str:
        """A task id on this partition: 4 hex digits of partition, 28 of sequence."""
        return f"{self.partition:04x}{next(self._ids):028x}"

    def spec(self, **overrides: Any) -> TaskSpec:
        fields: dict[str, Any] = {
            "task_id": self.new_id(),
            "tenant": "t1",
            "app": APP,
            "task_type": "job",
            "payload": b"payload",
        }
        fields.update(overrides)
        return TaskSpec(**fields)

    # -- client records ----------------------------------------------------------------------

    def enqueue(self, *specs: TaskSpec, ts_ms: int | None = None) -> MachineOutcome:
        raws = [codec.TASK_SPEC.encode(s) for s in specs]
        return self.apply(EnqueueTasks(tasks=raws), ts_ms=ts_ms)

    def cancel(
        self, *task_ids: str, tenant: str = "t1", reason: str = "canceled by request"
    ) -> MachineOutcome:
        return self.apply(CancelTasks(tenant=tenant, task_ids=list(task_ids), reason=reason))

    def retry_failed(self, *task_ids: str, tenant: str = "t1") -> MachineOutcome:
        return self.apply(RetryFailed(tenant=tenant, task_ids=list(task_ids)))

    # -- agent records -----------------------------------------------------------------------

    def report(self, *items: Completion, ts_ms: int | None = None) -> MachineOutcome:
        return self.apply(CompleteAttempts(items=list(items)), ts_ms=ts_ms)

    def complete(self, task_id: str, lease_id: int, result: bytes = b"done") -> MachineOutcome:
        return self.report(
            Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.SUCCEEDED, result=result)
        )

    def fail(
        self,
        task_id: str,
        lease_id: int,
        error_class: str = "Boom",
        message: str = "it broke",
        *,
        retry_after_ms: int | None = None,
        ts_ms: int | None = None,
    ) -> MachineOutcome:
        return self.report(
            Completion(
                task_id=task_id,
                lease_id=lease_id,
                outcome=Outcome.FAILED,
                error_class=error_class,
                error_message=message,
                error_stack="Traceback ...",
                retry_after_ms=retry_after_ms,
            ),
            ts_ms=ts_ms,
        )

    def fatal(
        self, task_id: str, lease_id: int, error_class: str = "Fatal", message: str = "no hope"
    ) -> MachineOutcome:
        return self.report(
            Completion(
                task_id=task_id,
                lease_id=lease_id,
                outcome=Outcome.FATAL,
                error_class=error_class,
                error_message=message,
            )
        )

    def canceled(self, task_id: str, lease_id: int, message: str = "stopped") -> MachineOutcome:
        """The handler saw ``ctx.cancelled`` and stopped."""
        return self.report(
            Completion(
                task_id=task_id, lease_id=lease_id, outcome=Outcome.CANCELED, error_message=message
            )
        )

    def checkpoint(self, task_id: str, lease_id: int, value: bytes) -> MachineOutcome:
        return self.apply(
            SaveCheckpoints(items=[Checkpoint(task_id=task_id, lease_id=lease_id, value=value)])
        )

    # -- leader records ----------------------------------------------------------------------

    def grant(
        self,
        capacity: int,
        app: str = APP,
        tenants: Sequence[str] = (),
        queues: Sequence[str] = (),
        *,
        agent_id: str = "agent-1",
        lease_ms: int = 30_000,
        request_id: str | None = None,
        epoch: int | None = None,
        app_version: str | None = None,
    ) -> MachineOutcome:
        request = LeaseRequest(
            request_id=request_id or f"req-{self.offset}",
            agent_id=agent_id,
            app=app,
            tenants=list(tenants),
            queues=list(queues),
            capacity=capacity,
            lease_ms=lease_ms,
            app_version=app_version,
        )
        return self.apply(GrantLeases(requests=[request]), epoch=epoch)

    def expire(self, task_id: str, lease_id: int, *, epoch: int | None = None) -> MachineOutcome:
        return self.apply(
            ExpireLeases(items=[LeaseRef(task_id=task_id, lease_id=lease_id)]), epoch=epoch
        )

    def fire(self, timers: Iterable[TimerRef], *, epoch: int | None = None) -> MachineOutcome:
        return self.apply(FireTimers(timers=list(timers)), epoch=epoch)

    def due(self, now_ms: int | None = None, limit: int = 1_000) -> list[TimerRef]:
        return self.tables.due_timers(self.now_ms if now_ms is None else now_ms, limit)

    def fire_due(self, now_ms: int | None = None) -> MachineOutcome:
        """Move the clock to ``now_ms`` and propose every due timer, as the leader would.

        With nothing due no record is applied and an empty outcome comes back."""
        if now_ms is not None:
            assert now_ms >= self.now_ms, "the harness clock never goes back"
            self.now_ms = now_ms
        due = self.due()
        if not due:
            return MachineOutcome()
        return self.fire(due)

    def announce(self, epoch: int | None = None, leader_id: str = "leader") -> MachineOutcome:
        self.epoch = self.epoch + 1 if epoch is None else epoch
        return self.apply(AnnounceEpoch(leader_id=leader_id), epoch=self.epoch)

    # -- reading -----------------------------------------------------------------------------

    def advance(self, ms: int) -> None:
        self.now_ms += ms

    def task(self, task_id: str) -> Task:
        """The row as the machine sees it (through the cache)."""
        found = self.tables.task(task_id)
        assert found is not None, f"no task {task_id}"
        return found

    def fresh_task(self, task_id: str) -> Task | None:
        """The row decoded from the KV alone, without the cache."""
        return Tables(self.kv).task(task_id)

    def committed(self) -> Tables:
        """Committed state through a cache-free view."""
        return Tables(self.kv)

    def dump(self, *, applied: bool = True, outbox: bool = True) -> dict[bytes, bytes]:
        """The full KV contents. ``applied=False`` leaves out the applied offset (every record
        moves it); ``outbox=False`` leaves out the outbox rows."""
        out = dict(self.kv.data.items())
        if not applied:
            out.pop(keys.META_APPLIED, None)
        if not outbox:
            out = {k: v for k, v in out.items() if not k.startswith(keys.OUTBOX)}
        return out

    def timers(self) -> list[TimerRef]:
        return [keys.parse_timer(k) for k, _ in self.kv.scan(keys.TIMERS)]

    def timers_of(self, task_id: str) -> list[TimerRef]:
        return [t for t in self.timers() if t.task_id == task_id]

    def ready_ids(self) -> list[str]:
        return [v.decode() for _, v in self.kv.scan(keys.READY)]

    def leased(self) -> dict[str, int]:
        return {task_id: lease_id for task_id, lease_id, _ in self.committed().leased()}

    def dead(self, tenant: str = "t1") -> list[str]:
        return list(self.committed().dead(tenant))

    # -- shortcuts ---------------------------------------------------------------------------

    def lease_one(self, task_id: str, **grant_kw: Any) -> Grant:
        """Grant until ``task_id`` is leased (it must be the first ready task of its tenant)."""
        outcome = self.grant(1, **grant_kw)
        granted = grants(outcome)
        assert [g.task_id for g in granted] == [task_id], granted
        return granted[0]


def grants(outcome: MachineOutcome) -> list[Grant]:
    """Every grant of every Offer in ``outcome``."""
    return [g for a in outcome.actions if isinstance(a, Offer) for g in a.grants]


def actions_of(outcome: MachineOutcome, kind: type) -> list[Any]:
    return [a for a in outcome.actions if isinstance(a, kind)]
