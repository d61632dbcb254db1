"""The straggler story (``streams/processor/leadership.py``), told with two real processors.

    log:   ... | Announce e1 (A) | Enqueue | Grant e1 (A) || Announce e2 (B) | Grant e1 (A?) ...
                                                         ^ B mints epoch 2 and seals the log

1. Leader A (epoch 1) proposes: its records are applied.
2. B takes over: ``leadership.mint`` seals the log at epoch 2 and B announces.
3. A, still believing it leads, proposes again: the log refuses (LogSealed), A steps down and
   drops its duties, its claims on waiting polls and its lease table.
4. Where a log cannot refuse (Kafka), A's epoch-1 record lands after B's announce anyway: the
   machine ignores it, on every replica.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from conveyor.schemas import codec
from conveyor.schemas.types import (
    EnqueueTasks,
    ExpireLeases,
    FireTimers,
    GrantLeases,
    LeaseRef,
    LeaseRequest,
    TaskSpec,
    TaskStatus,
)
from conveyor.store import keys
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.api import LogSealed
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.processor import leadership
from conveyor.streams.processor.loop import PartitionProcessor
from conveyor.streams.processor.pool import Lease, WaitingPool

T = TypeVar("T")
DEADLINE_S = 5.0


def run(body: Callable[[], Awaitable[T]]) -> T:
    async def main() -> T:
        return await asyncio.wait_for(body(), DEADLINE_S * 4)

    return asyncio.run(main())


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` with a deadline; never a blind sleep."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.001)


def spec(n: int) -> TaskSpec:
    return TaskSpec(task_id=f"0000{n:028x}", tenant="t", app="app", task_type="job")


def state(kv: MemoryKV) -> dict[bytes, bytes]:
    """Everything a replica derives from the log: outbox rows depend on batching and shipping."""
    return {k: v for k, v in kv.data.items() if not k.startswith(keys.OUTBOX)}


async def poll(
    pool: WaitingPool, wait_ms: float = 5_000, *, app: str = "app", lease_ms: int = 30_000
) -> list[Lease]:
    """One agent's poll for one lease (the other test modules of processors use it too)."""
    return await pool.poll(
        agent_id="agent",
        app=app,
        tenants=[],
        queues=[],
        capacity=1,
        lease_ms=lease_ms,
        wait_ms=wait_ms,
    )


def test_straggler_leader_is_fenced_by_the_log_and_by_the_machine() -> None:
    async def body() -> None:
        log = MemoryLog(1)
        clock = FakeClock()
        kv_a, kv_b = MemoryKV(), MemoryKV()
        pool_a, pool_b = WaitingPool(clock), WaitingPool(clock)
        a = PartitionProcessor(0, log, kv_a, clock=clock, leader_id="A", pool=pool_a)
        b = PartitionProcessor(0, log, kv_b, clock=clock, leader_id="B", pool=pool_b)
        try:
            # 1. A leads at epoch 1 and grants a lease through the log.
            await a.start()
            assert (a.epoch, a.leader, log.fence(0)) == (1, True, 1)
            duties = {t.get_coro().__qualname__: t for t in a._duties}  # type: ignore[union-attr]
            await a.submit(EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec(1))]), "k")
            (lease,) = await poll(pool_a)
            assert lease.lease_id == 1  # type: ignore[attr-defined]
            assert a.read_task(spec(1).task_id).status == TaskStatus.LEASED  # type: ignore[union-attr]
            assert a.leases.live.keys() == {spec(1).task_id}

            # 2. B replays the log, mints epoch 2 (sealing the log) and announces it.
            await b.start()
            assert (b.epoch, b.leader, log.fence(0)) == (2, True, 2)
            assert b.read_task(spec(1).task_id).status == TaskStatus.LEASED  # type: ignore[union-attr]
            assert b.leases.live.keys() == {spec(1).task_id}  # a fresh interval from takeover
            await a.wait_applied(b.applied)
            assert leadership.accepts(1, 2) is False and leadership.accepts(2, 2) is True

            # 3. A, paused through all this, wakes up and proposes: the log refuses it.
            waiting = asyncio.create_task(poll(pool_a, wait_ms=300))
            await until(lambda: pool_a.entries, "A's waiting poll")
            with pytest.raises(LogSealed):
                await a.propose(FireTimers(timers=[]))
            assert a.leader is False and not a.dispatch.leading
            assert a.leases.live == {}  # no heartbeat is answered CONTINUE by A any more
            assert a.leases.heartbeat(spec(1).task_id, 1) == "LOST"
            assert pool_a.ledger.claims(0) == [] and not pool_a.ledger.has_dealt(0)
            pool_a.ledger.check()
            assert all(entry.claimed == 0 for entry in pool_a.entries.values())
            assert await waiting == []  # the poll is answered (empty) and never hangs
            clock.advance(2_000)  # the duties' next tick: they see they no longer lead
            for name in ("LeaseTracker.run", "TimerScanner.run", "OutboxShipper.run"):
                await until(duties[name].done, f"A's {name} to return")
            assert not a._tasks[0].done(), "A keeps applying the log as a follower"

            # 4. Kafka cannot refuse: A's epoch-1 records land after B's announce. Ignored.
            zombie_grant = GrantLeases(
                requests=[
                    LeaseRequest(
                        request_id="zombie",
                        agent_id="z",
                        app="app",
                        tenants=[],
                        queues=[],
                        capacity=5,
                    )
                ]
            )
            zombie_expire = ExpireLeases(items=[LeaseRef(task_id=spec(1).task_id, lease_id=1)])
            await b.submit(EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec(2))]), "k")
            before_a, before_b = state(kv_a), state(kv_b)
            raws = [
                codec.encode_record(r, epoch=1, ts_ms=clock.now_ms(), key="leader/0")
                for r in (zombie_grant, zombie_expire)
            ]
            offsets = await log.append(0, raws)  # no epoch: the log takes them
            for p in (a, b):
                await p.wait_applied(offsets[-1])
            for kv, before in ((kv_a, before_a), (kv_b, before_b)):
                after = state(kv)
                assert after.pop(keys.META_APPLIED) == keys.u64(offsets[-1])
                before.pop(keys.META_APPLIED)
                assert after == before, "a stale-epoch record changed state"
            assert b.read_task(spec(1).task_id).lease_id == 1  # type: ignore[union-attr]
            assert b.read_task(spec(2).task_id).status == TaskStatus.ENQUEUED  # type: ignore[union-attr]

            # The same log makes the same state on both replicas.
            assert state(kv_a) == state(kv_b)
        finally:
            await a.stop()
            await b.stop()

    run(body)
