"""Deterministic simulation: crashes, lost state batches and torn log tails change nothing.

A partition's state is a pure function of its log prefix (tests/PLAN.md). Per seed:

(B) a crashing run. A seeded workload of client records (enqueues, cancels, dead-letter
    retries, duplicates, garbage), agent records (completions, failures, checkpoints for the
    leases it sees granted, some stale) and leader records (grants, due timers on a simulated
    clock, expiries, epoch announcements, records of a deposed epoch) is appended to a
    ``MemoryLog`` while a real ``PartitionProcessor`` applies it batch by batch
    (``_apply_batch``: read -> apply -> ONE write batch). At random batch boundaries it
    crashes: the processor and its cache are thrown away, the KV keeps only a prefix of its
    write batches (RocksDB without its WAL loses recent batches, never a middle one; the prefix
    may be empty), the log loses a tail of records no processor ever read (never acknowledged;
    the clients of some of them retry), and a new processor resumes from the applied offset it
    finds.
(A) an uninterrupted run over the log that survived, into a fresh KV.

With real RocksDB, crashes also delete the database or restore an older copy of its directory
(S7 of tests/PLAN.md); the rebuilt state must have the reference's state hash.

The two KVs must be byte-identical. Outbox rows are compared as the flattened stream of the
events they hold, not row by row: a row is keyed by the offset that ended its write batch, and
batch boundaries legitimately differ between (A) and (B) (a batch read after a crash starts at
the recovered offset). The event stream itself must be identical, in order.

Reproduce a failure with ``CONVEYOR_SIM_SEED=<seed>``; ``CONVEYOR_SIM_SEEDS=<n>`` runs more.

The second test runs the real processor (leader duties on a ``FakeClock``, ``submit``, the
waiting pool) and stops and restarts it over the same log and KV, rolling the KV back to a
snapshot now and then; after the faults stop, every acknowledged task must finish, and none may
be completed twice (I1, I3, I10).
"""

from __future__ import annotations

import asyncio
import collections
import hashlib
import os
import random
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import pytest

from conveyor.schemas import codec
from conveyor.schemas.types import (
    TERMINAL,
    AnnounceEpoch,
    CancelTasks,
    Checkpoint,
    CompleteAttempts,
    Completion,
    EnqueueTasks,
    EventKind,
    ExpireLeases,
    FanOut,
    FireTimers,
    GrantLeases,
    LeaseRef,
    LeaseRequest,
    Outcome,
    ParallelMode,
    Record,
    RetryFailed,
    SaveCheckpoints,
    SendEvents,
    TaskEvent,
    TaskSpec,
    TaskStatus,
    WaitStep,
    WorkflowEvent,
)
from conveyor.store import keys
from conveyor.store.api import KV
from conveyor.store.memory import MemoryKV
from conveyor.store.rocksdb import RocksKV
from conveyor.store.tables import Tables, TaskCache
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.machine.handlers.workflows import child_id
from conveyor.streams.machine.transitions import TRANSITIONS
from conveyor.streams.processor.loop import QUARANTINE, PartitionProcessor
from conveyor.streams.processor.pool import WaitingPool

if os.environ.get("CONVEYOR_SIM_SEED"):
    SEEDS = [int(s) for s in os.environ["CONVEYOR_SIM_SEED"].split(",")]
else:
    SEEDS = list(range(int(os.environ.get("CONVEYOR_SIM_SEEDS", "20"))))
STEPS = int(os.environ.get("CONVEYOR_SIM_STEPS", "300"))
START_MS = 1_700_000_000_000
S = 1_000
TENANTS = ["acme", "blue", "corp"]
EVENT_NAMES = ["go", "stop"]
APP = "app"
STATS: collections.Counter[str] = collections.Counter()  # across seeds: "sometimes" coverage


# -- stores that can crash ---------------------------------------------------------------------


class RecordingKV(MemoryKV):
    """A MemoryKV that remembers its write batches, so a crash can keep any prefix of them."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[dict[bytes, bytes | None]] = []

    def write(self, changes: Any) -> None:
        self.batches.append(dict(changes))
        super().write(changes)

    def prefix(self, n: int) -> RecordingKV:
        kv = RecordingKV()
        for batch in self.batches[:n]:
            kv.write(batch)
        return kv


class Store(Protocol):
    kv: KV

    def crash(self, rng: random.Random) -> None: ...


class MemoryStore:
    """RocksDB without WAL, simulated: a crash keeps a prefix of the write batches."""

    def __init__(self) -> None:
        self.kv: RecordingKV = RecordingKV()

    def crash(self, rng: random.Random) -> None:
        n = len(self.kv.batches)
        roll = rng.random()
        if roll < 0.1:
            keep = 0  # everything lost: rebuild from the log
        elif roll < 0.4:
            keep = n  # nothing lost
        else:
            keep = max(0, n - rng.randint(1, 8))
        STATS["batches lost"] += n - keep
        STATS["wiped"] += keep == 0
        self.kv = self.kv.prefix(keep)


class RocksStore:
    """Real RocksDB on disk. Crashes take turns at S7's faults: close and reopen (kill -9);
    delete the directory (nuke: rebuilt from the log); restore the copy of the directory taken
    at the previous crash (rollback: state behind the log, like a stale checkpoint)."""

    FAULTS = ("reopen", "nuke", "rollback")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.snapshot = path.with_name(path.name + ".snapshot")
        self.kv: RocksKV = RocksKV(path)
        self.faults: collections.Counter[str] = collections.Counter()

    def crash(self, rng: random.Random) -> None:
        self.kv.close()
        fault = self.FAULTS[sum(self.faults.values()) % len(self.FAULTS)]
        taken = self.path.with_name(self.path.name + ".taking")
        shutil.copytree(self.path, taken)  # the copy the next rollback restores
        if fault == "nuke" or (fault == "rollback" and self.snapshot.exists()):
            shutil.rmtree(self.path)
            if fault == "rollback":
                shutil.copytree(self.snapshot, self.path)
        self.faults[fault] += 1
        STATS[f"rocksdb {fault}"] += 1
        shutil.rmtree(self.snapshot, ignore_errors=True)
        taken.rename(self.snapshot)
        self.kv = RocksKV(self.path)


def dump(kv: KV) -> dict[bytes, bytes]:
    """Every pair but the outbox rows (compared as an event stream, see the module doc)."""
    return {k: v for k, v in kv.scan(b"") if not k.startswith(keys.OUTBOX)}


def state_hash(kv: KV) -> str:
    """I8's state hash: every pair but the outbox rows, in key order."""
    digest = hashlib.sha256()
    for k, v in sorted(dump(kv).items()):
        digest.update(len(k).to_bytes(4, "big") + k + len(v).to_bytes(4, "big") + v)
    return digest.hexdigest()


def events_of(kv: KV) -> list[TaskEvent]:
    return [e for _, v in kv.scan(keys.OUTBOX) for e in codec.EVENT_BATCH.decode(v).events]


# -- the workload ------------------------------------------------------------------------------


@dataclass
class Workload:
    """Proposes records the way clients, agents and the leader would, from committed state."""

    rng: random.Random
    now_ms: int = START_MS
    epoch: int = 0
    next_id: int = 1
    sent: list[bytes] = field(default_factory=list)  # every record proposed, for duplicates
    leases: list[tuple[str, int]] = field(default_factory=list)  # every lease ever seen

    def task_id(self) -> str:
        self.next_id += 1
        return f"0000{self.next_id:028x}"

    def encode(self, record: Record, *, leader: bool, epoch: int | None = None) -> bytes:
        if epoch is None:
            epoch = self.epoch if leader else 0
        key = "leader/0" if leader else "client"
        raw = codec.encode_record(record, epoch=epoch, ts_ms=self.now_ms, key=key)
        self.sent.append(raw)
        return raw

    def spec(self, known: list[str]) -> TaskSpec:
        rng = self.rng
        task_id = rng.choice(known) if known and rng.random() < 0.05 else self.task_id()
        return TaskSpec(
            task_id=task_id,
            tenant=rng.choice(TENANTS),
            app=APP,
            task_type="job",
            queue=rng.choice(["default", "fast"]),
            priority=rng.choice([0, 0, 1, 5]),
            payload=rng.randbytes(rng.randint(0, 16)),
            run_at_ms=self.now_ms + rng.choice([S, 10 * S]) if rng.random() < 0.2 else None,
            attempts_max=rng.randint(1, 4),
            backoff_base_ms=rng.choice([100, S]),
            backoff_cap_ms=10 * S,
            non_retryable=["Permanent"],
            schedule_to_start_ms=rng.choice([None, None, None, 5 * S, 60 * S]),
            start_to_close_ms=rng.choice([None, None, 4 * S, 30 * S]),
            schedule_to_close_ms=rng.choice([None, None, None, 20 * S, 120 * S]),
            cancel_grace_ms=rng.choice([S, 3 * S]),
            idempotency_key=rng.choice([None, None, None, "k1", "k2", "k3"]),
            idempotency_window_ms=rng.choice([10 * S, 3_600 * S]),
        )

    def next(self, tables: Tables) -> list[bytes]:
        """One or a few records; ``tables`` is committed state as a proposer would see it."""
        rng = self.rng
        known = [key[1:].decode() for key, _ in tables.scan(keys.TASKS)]
        leased = [(task_id, lease_id) for task_id, lease_id, _ in tables.leased()]
        for pair in leased:
            if pair not in self.leases:
                self.leases.append(pair)
        kind = rng.choices(
            [
                "enqueue", "complete", "grant", "timers", "expire", "cancel", "checkpoint",
                "retry", "announce", "stale", "duplicate", "garbage", "event",
            ],
            weights=[24, 22, 16, 12, 4, 6, 4, 2, 2, 3, 3, 1, 4],
        )[0]  # fmt: skip
        STATS[f"proposed {kind}"] += 1
        if kind == "enqueue":
            specs = [self.spec(known) for _ in range(rng.randint(1, 3))]
            tasks = [codec.TASK_SPEC.encode(s) for s in specs]
            return [self.encode(EnqueueTasks(tasks=tasks), leader=False)]
        if kind in ("complete", "checkpoint", "expire"):
            if not self.leases:
                return []
            live = rng.random() < 0.8 and leased
            task_id, lease_id = rng.choice(leased if live else self.leases)
            if kind == "checkpoint":
                item = Checkpoint(task_id=task_id, lease_id=lease_id, value=rng.randbytes(4))
                return [self.encode(SaveCheckpoints(items=[item]), leader=False)]
            if kind == "expire":
                ref = LeaseRef(task_id=task_id, lease_id=lease_id)
                return [self.encode(ExpireLeases(items=[ref]), leader=True)]
            outcome = rng.choices(
                [
                    Outcome.SUCCEEDED,
                    Outcome.FAILED,
                    Outcome.FATAL,
                    Outcome.CANCELED,
                    Outcome.FAN_OUT,
                    Outcome.WAIT_EVENT,
                ],
                weights=[50, 30, 5, 15, 10, 6],
            )[0]
            if outcome == Outcome.WAIT_EVENT:  # a workflow attempt ends in ctx.wait_for_event
                name = rng.choice(EVENT_NAMES)
                wait = WaitStep(
                    identity=f"event:{name}#0",
                    position=0,
                    name=name,
                    timeout_ms=rng.choice([None, S, 20 * S]),
                )
                done = Completion(task_id=task_id, lease_id=lease_id, outcome=outcome, wait=wait)
                return [self.encode(CompleteAttempts(items=[done]), leader=False)]
            if outcome == Outcome.FAN_OUT:  # a workflow attempt ends in ctx.parallel
                kids = [
                    codec.TASK_SPEC.encode(
                        TaskSpec(task_id="", tenant="", app="", task_type="child", attempts_max=2)
                    )
                    for _ in range(rng.randint(1, 3))
                ]
                mode = rng.choice([ParallelMode.COLLECT, ParallelMode.FAIL_FAST])
                step = FanOut(
                    identity=f"fan#{rng.randint(0, 1)}", position=0, mode=mode, children=kids
                )
                done = Completion(task_id=task_id, lease_id=lease_id, outcome=outcome, fan_out=step)
                return [self.encode(CompleteAttempts(items=[done]), leader=False)]
            error = None if outcome == Outcome.SUCCEEDED else rng.choice(["Boom", "Permanent"])
            done = Completion(
                task_id=task_id,
                lease_id=lease_id,
                outcome=outcome,
                result=b"ok" if outcome == Outcome.SUCCEEDED else None,
                error_class=error,
                error_message=error and "it broke",
                retry_after_ms=rng.choice([None, None, 0, 2 * S]),
            )
            return [self.encode(CompleteAttempts(items=[done]), leader=False)]
        if kind == "grant":
            requests = [
                LeaseRequest(
                    request_id=f"r{len(self.sent)}/{i}",
                    agent_id=f"agent-{i}",
                    app=APP,
                    tenants=rng.sample(TENANTS, rng.randint(0, 2)),
                    queues=rng.choice([[], [], ["fast"]]),
                    capacity=rng.randint(1, 4),
                )
                for i in range(rng.randint(1, 2))
            ]
            return [self.encode(GrantLeases(requests=requests), leader=True)]
        if kind == "timers":
            self.now_ms += rng.choice([100, S, 5 * S, 30 * S])
            due = tables.due_timers(self.now_ms, 50)
            return [self.encode(FireTimers(timers=due), leader=True)] if due else []
        if kind == "event":
            if not known:
                return []
            event = WorkflowEvent(
                task_id=rng.choice(known), name=rng.choice(EVENT_NAMES), payload=b'"e"'
            )
            return [
                self.encode(SendEvents(tenant=rng.choice(TENANTS), items=[event]), leader=False)
            ]
        if kind == "cancel":
            if not known:
                return []
            tenant = rng.choice(TENANTS)
            ids = rng.sample(known, min(len(known), rng.randint(1, 2)))
            return [self.encode(CancelTasks(tenant=tenant, task_ids=ids), leader=False)]
        if kind == "retry":
            dead = [(t, i) for t in TENANTS for i in tables.dead(t)]
            if not dead:
                return []
            tenant, task_id = rng.choice(dead)
            return [self.encode(RetryFailed(tenant=tenant, task_ids=[task_id]), leader=False)]
        if kind == "announce":
            self.epoch += 1
            return [self.encode(AnnounceEpoch(leader_id=f"n{self.epoch}"), leader=True)]
        if kind == "stale":
            if self.epoch == 0:
                return []
            zombie: Record = rng.choice(
                [
                    GrantLeases(
                        requests=[
                            LeaseRequest(
                                request_id="zombie",
                                agent_id="z",
                                app=APP,
                                tenants=[],
                                queues=[],
                                capacity=8,
                            )
                        ]
                    ),
                    FireTimers(timers=tables.due_timers(self.now_ms + 3_600 * S, 20)),
                    ExpireLeases(items=[LeaseRef(task_id=t, lease_id=i) for t, i in leased]),
                ]
            )
            return [self.encode(zombie, leader=True, epoch=self.epoch - 1)]
        if kind == "duplicate":
            return [rng.choice(self.sent)] if self.sent else []  # redelivered as-is
        return [rng.randbytes(rng.randint(0, 40))]  # garbage: must be quarantined


# -- the crashing run and the reference run -----------------------------------------------------


def new_processor(log: MemoryLog, kv: KV) -> PartitionProcessor:
    return PartitionProcessor(0, log, kv, clock=FakeClock(START_MS), pool=WaitingPool(FakeClock()))


async def apply_some(proc: PartitionProcessor, log: MemoryLog, max_batch: int) -> int:
    """One batch from the processor's applied offset on; the highest offset it read."""
    reader = log.read(0, proc.applied + 1, follow=False, max_batch=max_batch)
    try:
        batch = await anext(reader, None)
    finally:
        await reader.aclose()
    if not batch:
        return proc.applied
    proc._apply_batch(batch)
    return batch[-1].offset


async def crashing_run(seed: int, store: Store, steps: int) -> list[bytes]:
    """Run (B); returns the log that survived."""
    rng = random.Random(seed)
    work = Workload(random.Random(seed * 7_919 + 1))
    log = MemoryLog(1)
    durable: list[bytes] = []  # what the log holds, to rebuild it after a tear
    proc = new_processor(log, store.kv)
    read_max = -1  # records up to here were read by some processor: durable, never torn
    crash_at = {steps // 3, 2 * steps // 3}  # at least two crashes per seed
    for step in range(steps):
        for raw in work.next(Tables(store.kv)):
            await log.append(0, [raw])
            durable.append(raw)
        if rng.random() < 0.5:
            for _ in range(rng.randint(1, 3)):
                read_max = max(read_max, await apply_some(proc, log, rng.randint(1, 12)))
        if step in crash_at or rng.random() < 0.03:
            STATS["crashes"] += 1
            store.crash(rng)
            # The log loses a tail that no processor read (it was never acknowledged) ...
            tear = rng.randint(0, len(durable) - 1 - read_max) if rng.random() < 0.5 else 0
            torn, durable = durable[len(durable) - tear :], durable[: len(durable) - tear]
            STATS["records torn"] += tear
            log = MemoryLog(1)
            if durable:
                await log.append(0, durable)
            # ... and the clients of some of those records retry them.
            for raw in torn:
                if rng.random() < 0.5:
                    await log.append(0, [raw])
                    durable.append(raw)
            proc = new_processor(log, store.kv)
            STATS["replayed from scratch"] += proc.applied == -1
    while proc.applied < log.end_offset(0) - 1:
        await apply_some(proc, log, rng.randint(1, 64))
    return durable


async def reference_run(records: list[bytes], kv: KV, max_batch: int) -> None:
    """Run (A): the surviving log, applied without interruption, and without the task cache
    (so a cache that disagreed with the rows it caches would show as a difference)."""
    log = MemoryLog(1)
    await log.append(0, records)
    proc = new_processor(log, kv)
    proc.cache = TaskCache(0)
    proc.tables = Tables(kv, proc.cache)
    while proc.applied < log.end_offset(0) - 1:
        await apply_some(proc, log, max_batch)


def check_history(events: list[TaskEvent]) -> collections.Counter[str]:
    """I3 and I5 over the event stream: legal moves, one terminal state, terminal absorbs;
    and a workflow leaves WAITING at most once per fan-out (the fan-in fires once)."""
    status: dict[str, TaskStatus | None] = {}
    seen: collections.Counter[str] = collections.Counter()
    for e in events:
        old, new = status.get(e.task_id), TaskStatus(e.status)
        if old != new:
            assert (old, new) in TRANSITIONS, f"illegal move {old} -> {new}: {e}"
            assert old not in TERMINAL, f"{e.task_id} left terminal {old}: {e}"
            seen[new.value] += 1
        if old == TaskStatus.WAITING:
            assert e.kind != EventKind.TaskWaiting, f"{e.task_id} fanned out while WAITING"
            seen["fan-in fired" if new == TaskStatus.ENQUEUED else "fan-in ended"] += 1
        status[e.task_id] = new
        seen[e.kind.value] += 1
    return seen


def check_indexes(kv: KV) -> None:
    """The secondary indexes agree with the task rows (what the machine keeps in step)."""
    tables = Tables(kv)
    tasks = {t.task_id: t for t in tables.tasks()}
    leased = {task_id: lease_id for task_id, lease_id, _ in tables.leased()}
    assert leased == {t.task_id: t.lease_id for t in tasks.values() if t.status == "LEASED"}
    ready = sorted(v.decode() for _, v in kv.scan(keys.READY))
    assert ready == sorted(
        t.task_id for t in tasks.values() if t.status == "ENQUEUED" and t.ready_seq
    )
    counts = collections.Counter(
        keys.ready_count(t.app, t.tenant)
        for t in tasks.values()
        if t.status == "ENQUEUED" and t.ready_seq
    )
    assert {k: keys.read_u64(v) for k, v in kv.scan(keys.READY_COUNTS)} == counts
    timers = [keys.parse_timer(k) for k, _ in kv.scan(keys.TIMERS)]
    for ref in timers:
        if ref.kind != "FORGET_KEY":  # forgets an idempotency key when its window ends
            assert tasks[ref.task_id].status not in TERMINAL, f"timer outlived its task: {ref}"
    # a WAITING workflow waits for an event, or on one open barrier with a child to land
    for t in tasks.values():
        open_ = [b for b in tables.barriers(t.task_id) if not b.fired]
        wait = tables.event_wait(t.task_id)
        assert wait is None or t.status == "WAITING", f"{t.task_id} {t.status} keeps a wait"
        if t.status == "WAITING" and wait is not None:
            assert not open_, f"{t.task_id} waits for an event and on {open_}"
        elif t.status == "WAITING":
            assert len(open_) == 1, f"{t.task_id} WAITING with barriers {open_}"
            kids = [child_id(t.task_id, open_[0].identity, i) for i in range(open_[0].total)]
            assert any(tasks[k].status not in TERMINAL for k in kids), "the fan-in never fired"
    waiting = {r.task_id for r in timers if r.kind == "RUN"}
    for t in tasks.values():
        if t.status == "RETRY_WAIT" or (t.status == "ENQUEUED" and not t.ready_seq):
            assert t.task_id in waiting, f"{t.task_id} waits without its RUN timer"


def compare(seed: int, crashed: KV, reference: KV) -> None:
    got, want = dump(crashed), dump(reference)
    if got != want:
        only = sorted(set(got) ^ set(want))[:5]
        differ = sorted(k for k in set(got) & set(want) if got[k] != want[k])[:5]
        raise AssertionError(f"seed {seed}: state differs; only in one: {only}; differ: {differ}")
    got_events, want_events = events_of(crashed), events_of(reference)
    assert got_events == want_events, f"seed {seed}: the event streams differ"
    check_indexes(reference)
    seen = check_history(want_events)
    STATS.update({f"seen {k}": v for k, v in seen.items()})
    STATS["quarantined"] += sum(1 for _ in reference.scan(QUARANTINE))
    assert seen["TaskEnqueued"] > 0, f"seed {seed}: vacuous run"


@pytest.mark.parametrize("seed", SEEDS, ids=lambda s: f"seed={s}")
def test_crashes_and_torn_tails_replay_to_the_same_state(seed: int) -> None:
    async def body() -> None:
        store = MemoryStore()
        survived = await crashing_run(seed, store, STEPS)
        reference = MemoryKV()
        await reference_run(survived, reference, random.Random(seed).randint(1, 64))
        compare(seed, store.kv, reference)
        again = MemoryKV()  # and the reference itself is deterministic
        await reference_run(survived, again, 7)
        assert dump(again) == dump(reference), f"seed {seed}: replay is not deterministic"

    try:
        asyncio.run(body())
    except BaseException as exc:
        raise AssertionError(f"FAILED seed={seed} (CONVEYOR_SIM_SEED={seed}): {exc!r}") from exc


def test_rocksdb_reopened_nuked_or_rolled_back_replays_to_the_same_state(tmp_path: Path) -> None:
    seed = SEEDS[0] + 1_000

    async def body() -> None:
        store = RocksStore(tmp_path / "p0000")
        try:
            survived = await crashing_run(seed, store, STEPS // 2)
            reference = MemoryKV()
            await reference_run(survived, reference, 16)
            compare(seed, store.kv, reference)  # S7: the same state, byte for byte
            assert state_hash(store.kv) == state_hash(reference)
            assert all(store.faults[f] >= 1 for f in RocksStore.FAULTS), store.faults
        finally:
            store.kv.close()

    try:
        asyncio.run(body())
    except BaseException as exc:
        raise AssertionError(f"FAILED seed={seed} (RocksKV): {exc!r}") from exc


def test_sometimes_coverage() -> None:
    """Across the seeds, the faults and the interesting paths did happen (anti-vacuity)."""
    if len(SEEDS) < 10 or STATS["crashes"] == 0:
        pytest.skip("needs the seeded runs above (run the whole file)")
    for what in (
        "crashes",
        "batches lost",
        "wiped",
        "records torn",
        "replayed from scratch",
        "quarantined",
        "seen TaskLeased",
        "seen LeaseExpired",
        "seen TaskRetryScheduled",
        "seen SUCCEEDED",
        "seen FAILED",
        "seen CANCELED",
        "seen EXPIRED",
        "seen CancelRequested",
        "seen CheckpointSaved",
        "seen TaskRequeued",
        "seen TaskWaiting",
        "seen fan-in fired",
        "proposed event",
    ):
        assert STATS[what] > 0, f"never happened: {what}; stats: {dict(STATS)}"


# -- the real processor: restarts, then liveness ------------------------------------------------

LIVE_SEEDS = SEEDS[: max(3, len(SEEDS) // 5)]
ROUNDS = int(os.environ.get("CONVEYOR_SIM_ROUNDS", "120"))


async def until(check: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll with a deadline (real time): never a blind sleep."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.0005)


@dataclass
class Cluster:
    """One partition: its log, its KV (which may lose recent batches), its events stream, and
    the processor currently running over them."""

    rng: random.Random
    clock: FakeClock
    store: MemoryStore = field(default_factory=MemoryStore)
    log: MemoryLog = field(default_factory=lambda: MemoryLog(1))
    events: MemoryLog = field(default_factory=lambda: MemoryLog(1))
    proc: PartitionProcessor | None = None
    restarts: int = 0

    async def start(self) -> PartitionProcessor:
        self.proc = PartitionProcessor(
            0,
            self.log,
            self.store.kv,
            clock=self.clock,
            leader_id=f"node-{self.restarts}",
            events_log=self.events,
            pool=WaitingPool(self.clock),  # a new process: a new pool
        )
        await self.proc.start()
        return self.proc

    async def restart(self, *, lose_batches: bool) -> PartitionProcessor:
        assert self.proc is not None
        await self.proc.stop()
        if lose_batches:
            self.store.crash(self.rng)
        self.restarts += 1
        return await self.start()

    async def settle(self) -> None:
        """Let the processor and its duties catch up with the log."""
        proc = self.proc
        assert proc is not None
        for _ in range(3):
            for _ in range(30):
                await asyncio.sleep(0)
            await until(lambda: proc.applied >= self.log.end_offset(0) - 1, "the apply loop")


async def records_of(log: MemoryLog) -> list[bytes]:
    return [r.data async for batch in log.read(0, 0, follow=False) for r in batch]


def dedupe(events: list[TaskEvent]) -> Iterator[TaskEvent]:
    """Shipping is at-least-once (a crash between the append and the outbox delete ships a
    batch again); an event is identified by its content, which includes its log offset."""
    seen: set[TaskEvent] = set()
    for e in events:
        if e not in seen:
            seen.add(e)
            yield e


@pytest.mark.parametrize("seed", LIVE_SEEDS, ids=lambda s: f"seed={s}")
def test_restarted_processor_finishes_every_acknowledged_task(seed: int) -> None:
    async def body() -> None:
        rng = random.Random(seed)
        clock = FakeClock(START_MS)
        cluster = Cluster(rng, clock)
        proc = await cluster.start()
        work = Workload(random.Random(seed + 17))
        acked: set[str] = set()
        held: dict[str, Any] = {}  # task id -> the agent's Lease
        succeeded: collections.Counter[str] = collections.Counter()

        async def report(items: list[Completion]) -> None:
            replies = await proc.submit(CompleteAttempts(items=items), items[0].task_id)
            assert len(replies) == len(items)
            for item, reply in zip(items, replies, strict=True):
                held.pop(item.task_id, None)
                if reply.ok and reply.status == TaskStatus.SUCCEEDED:
                    succeeded[item.task_id] += 1
                STATS["live: completion refused"] += not reply.ok

        async def poll(capacity: int) -> None:
            leases = await proc.pool.poll(
                agent_id="agent",
                app=APP,
                tenants=[],
                queues=[],
                capacity=capacity,
                lease_ms=30_000,
                wait_ms=5,
            )
            for lease in leases:
                assert lease.task_id not in held or held[lease.task_id].lease_id < lease.lease_id
                held[lease.task_id] = lease

        async def heartbeat() -> None:
            for task_id, lease in list(held.items()):
                answer = proc.leases.heartbeat(task_id, lease.lease_id)
                if answer == "LOST":
                    del held[task_id]
                    STATS["live: lease lost"] += 1
                elif answer == "CANCEL":
                    await report(
                        [
                            Completion(
                                task_id=task_id, lease_id=lease.lease_id, outcome=Outcome.CANCELED
                            )
                        ]
                    )

        for _ in range(ROUNDS):
            what = rng.choices(
                ["enqueue", "poll", "complete", "cancel", "advance", "restart"],
                weights=[20, 25, 25, 4, 20, 6],
            )[0]
            work.now_ms = clock.now_ms()
            if what == "enqueue":
                specs = [work.spec([]) for _ in range(rng.randint(1, 4))]
                record = EnqueueTasks(tasks=[codec.TASK_SPEC.encode(s) for s in specs])
                replies = await proc.submit(record, specs[0].task_id)
                assert [r.index for r in replies] == list(range(len(specs)))
                acked.update(r.task_id for r in replies if r.ok)
            elif what == "poll":
                await poll(rng.randint(1, 4))
            elif what == "complete" and held:
                chosen = rng.sample(sorted(held), rng.randint(1, len(held)))
                outcomes = [rng.choice([Outcome.SUCCEEDED] * 3 + [Outcome.FAILED]) for _ in chosen]
                await report(
                    [
                        Completion(
                            task_id=t,
                            lease_id=held[t].lease_id,
                            outcome=o,
                            error_class=None if o == Outcome.SUCCEEDED else "Boom",
                        )
                        for t, o in zip(chosen, outcomes, strict=True)
                    ]
                )
            elif what == "cancel" and acked:
                task_id = rng.choice(sorted(acked))
                tenant = proc.read_task(task_id).tenant  # type: ignore[union-attr]
                await proc.submit(CancelTasks(tenant=tenant, task_ids=[task_id]), task_id)
            elif what == "advance":
                await heartbeat()
                clock.advance(rng.choice([100, S, 5 * S, 40 * S]))  # 40 s: leases lapse
                await cluster.settle()
            elif what == "restart":
                STATS["live: restarts"] += 1
                proc = await cluster.restart(lose_batches=rng.random() < 0.5)
                await cluster.settle()

        # Heal: no more faults; the agent finishes whatever it is handed, time moves on.
        for _ in range(400):
            await cluster.settle()
            tables = Tables(cluster.store.kv)
            open_ = [t for t in sorted(acked) if tables.task(t).status not in TERMINAL]  # type: ignore[union-attr]
            if not open_:
                break
            await heartbeat()
            if held:
                await report(
                    [
                        Completion(task_id=t, lease_id=lease.lease_id, outcome=Outcome.SUCCEEDED)
                        for t, lease in sorted(held.items())
                    ]
                )
            await poll(8)
            if not held:
                clock.advance(5 * S)  # backoff and delays end; timers fire
        else:
            raise AssertionError(f"seed {seed}: never finished: {open_[:5]}")

        # I1 + I10: every acknowledged task finished; nothing is still leased.
        tables = Tables(cluster.store.kv)
        assert all(tables.task(t).status in TERMINAL for t in acked)  # type: ignore[union-attr]
        assert list(tables.leased()) == []
        # I3: no task completed twice, and the events stream shows one terminal state each.
        assert [t for t, n in succeeded.items() if n > 1] == []
        for t in succeeded:
            assert tables.task(t).status == TaskStatus.SUCCEEDED  # type: ignore[union-attr]
        await cluster.settle()
        stream = [
            e for data in await records_of(cluster.events)
            for e in codec.EVENT_BATCH.decode(data).events
        ]  # fmt: skip
        shipped = sorted(dedupe(stream), key=lambda e: e.version)
        STATS["live: events shipped twice"] += len(stream) - len(shipped)
        check_history(shipped)
        finals = collections.Counter(
            e.task_id for e in shipped if e.status in TERMINAL and e.kind != "TaskRequeued"
        )
        assert all(n == 1 for n in finals.values()), "a task reached two terminal states"
        # I8: the restarted, rolled-back processor holds exactly what a fresh replay makes.
        fresh = MemoryKV()
        await reference_run(await records_of(cluster.log), fresh, 32)
        assert dump(cluster.store.kv) == dump(fresh)
        STATS["live: acked"] += len(acked)
        STATS["live: succeeded"] += len(succeeded)
        await proc.stop()

    try:
        asyncio.run(asyncio.wait_for(body(), 50))
    except BaseException as exc:
        raise AssertionError(f"FAILED seed={seed} (CONVEYOR_SIM_SEED={seed}): {exc!r}") from exc
