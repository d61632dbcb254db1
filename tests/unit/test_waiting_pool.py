"""The waiting pool (``streams/processor/pool.py``) with two real processors on a memory
log whose partition 1 can be held back.

A poll answers with what it holds; late grants reach the agent's next poll
(``streams/processor/mailbox.py``): holding partition 1 makes its GrantLeases land after the
poll that claimed it was answered.

    poll(2) --deal--> p0: Grant(1) ---------> answered with p0's lease
               \\---> p1: Grant(1) ....held.... lands later -> mailbox -> the next poll
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

from conveyor.schemas import codec
from conveyor.schemas.types import (
    CompleteAttempts,
    Completion,
    EnqueueTasks,
    GrantLeases,
    Outcome,
    TaskSpec,
    TaskStatus,
)
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.local import LogFull
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.processor import pool
from conveyor.streams.processor.loop import PartitionProcessor
from conveyor.streams.processor.pool import Lease, WaitingPool
from conveyor.streams.routing import mint_task_id

T = TypeVar("T")
DEADLINE_S = 5.0
LEASE_MS = 30_000


class HeldLog(MemoryLog):
    """A memory log whose appends to the partitions in ``held`` wait for ``release()``, and
    whose next append to a partition in ``full`` fails like a full disk's (writes nothing)."""

    def __init__(self, partitions: int) -> None:
        super().__init__(partitions)
        self.held: set[int] = set()
        self._gate = asyncio.Event()
        self.waiting = 0
        self.full: set[int] = set()
        self.failed = 0

    def release(self, *partitions: int) -> None:
        """Let the held appends to ``partitions`` through (all of them: every partition)."""
        self.held.difference_update(partitions or set(self.held))
        gate, self._gate = self._gate, asyncio.Event()
        gate.set()

    async def append(
        self, partition: int, records: Sequence[bytes], epoch: int | None = None
    ) -> list[int]:
        if partition in self.full:
            self.full.discard(partition)
            self.failed += 1
            raise LogFull(f"partition {partition}: no space left on device")
        if partition in self.held:
            self.waiting += 1
            while partition in self.held:
                await self._gate.wait()
        return await super().append(partition, records, epoch)


class Cluster:
    def __init__(self) -> None:
        self.clock = FakeClock()
        self.log = HeldLog(2)
        self.pool = WaitingPool(self.clock)
        self.procs = [
            PartitionProcessor(p, self.log, MemoryKV(), clock=self.clock, pool=self.pool)
            for p in range(2)
        ]

    async def enqueue(self, partition: int, tenant: str = "t") -> str:
        spec = TaskSpec(task_id=mint_task_id(partition), tenant=tenant, app="app", task_type="job")
        record = EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec)])
        (reply,) = await self.procs[partition].submit(record, spec.task_id)
        assert reply.ok
        return spec.task_id

    async def poll(
        self,
        capacity: int,
        wait_ms: float = 3_000,
        slots: int | None = None,
        tenants: list[str] | None = None,
    ) -> list[Lease]:
        return await self.pool.poll(
            agent_id="agent",
            app="app",
            tenants=tenants or [],
            queues=[],
            capacity=capacity,
            lease_ms=LEASE_MS,
            wait_ms=wait_ms,
            slots=slots,
        )

    async def complete(self, lease: Lease) -> None:
        done = Completion(task_id=lease.task_id, lease_id=lease.lease_id, outcome=Outcome.SUCCEEDED)
        record = CompleteAttempts(items=[done])
        (reply,) = await self.procs[lease.partition].submit(record, lease.task_id)
        assert reply.ok

    def status(self, task_id: str) -> TaskStatus:
        task = self.procs[int(task_id[:4], 16)].read_task(task_id)
        assert task is not None
        return task.status


@asynccontextmanager
async def cluster() -> AsyncIterator[Cluster]:
    c = Cluster()
    for proc in c.procs:
        await proc.start()
    try:
        yield c
        c.pool.ledger.check()  # every slot accounted for once the test's polls are done
    finally:
        for proc in c.procs:
            await proc.stop()
        c.pool.ledger.check()  # and once the partitions stepped down


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
        await asyncio.sleep(0.005)


def test_a_poll_answers_with_what_it_holds_and_a_late_grant_reaches_the_next_poll() -> None:
    async def body() -> None:
        async with cluster() as c:
            first, late = await c.enqueue(0), await c.enqueue(1)
            c.log.held.add(1)
            got = await c.poll(capacity=2)
            assert [lease.task_id for lease in got] == [first], "not held up by partition 1"
            assert c.log.waiting == 1, "partition 1's grant is still being written"

            # The agent polls again with the slot it believes free. That slot is reserved for
            # the late lease: a task enqueued meanwhile is not dealt to it (no over-commit).
            second_poll = asyncio.create_task(c.poll(capacity=1))
            await until(lambda: len(c.pool.entries) == 1, "the second poll to wait")
            extra = await c.enqueue(0)
            c.log.release()
            assert [lease.task_id for lease in await second_poll] == [late]
            assert c.status(late) == TaskStatus.LEASED
            assert c.status(extra) == TaskStatus.ENQUEUED
            assert len(c.pool.mail) == 0, "nothing owed, nothing held"

    run(body)


def test_a_poll_never_returns_more_than_its_capacity() -> None:
    async def body() -> None:
        async with cluster() as c:
            first = await c.enqueue(0)
            lates = {await c.enqueue(1), await c.enqueue(1)}
            c.log.held.add(1)
            got = await c.poll(capacity=3)
            assert [lease.task_id for lease in got] == [first]
            c.log.release()
            await until(lambda: c.pool.mail.held(("agent", "app", None, (), ())) == 2, "late")
            one = await c.poll(capacity=1)
            assert len(one) == 1 and one[0].task_id in lates
            # The other is handed at once to the next poll, without a round through the log.
            other = await asyncio.wait_for(c.poll(capacity=5), 0.5)
            assert {lease.task_id for lease in one + other} == lates
            assert len(c.pool.mail) == 0

    run(body)


def test_a_late_lease_nobody_polls_for_lapses_and_its_task_is_retried() -> None:
    async def body() -> None:
        async with cluster() as c:
            late = await c.enqueue(1)
            c.log.held.add(1)
            assert await c.poll(capacity=1, wait_ms=100) == [], "timed out, grant in flight"
            c.log.release()
            await until(lambda: c.status(late) == TaskStatus.LEASED, "the late grant")
            # The agent never comes back: the lease lapses like a crashed agent's.
            c.clock.advance(LEASE_MS + 1)
            await until(lambda: c.status(late) != TaskStatus.LEASED, "the lease to lapse")
            task = c.procs[1].read_task(late)
            assert task is not None and task.attempt == 2, "retried, not lost"
            # The dead lease is never handed out; the retry is, under a new lease id.
            c.clock.advance(3_600_000)  # past any backoff
            await until(lambda: c.status(late) == TaskStatus.ENQUEUED, "the retry to be due")
            (lease,) = await c.poll(capacity=1)
            assert (lease.task_id, lease.attempt, lease.lease_id) == (late, 2, 2)
            assert len(c.pool.mail) == 0, "swept"

    run(body)


def test_the_leases_of_a_poll_that_goes_away_wait_for_the_agent() -> None:
    async def body() -> None:
        async with cluster() as c:
            task_id = await c.enqueue(1)
            c.log.held.add(1)
            poll = asyncio.create_task(c.poll(capacity=1))
            await until(lambda: c.log.waiting == 1, "the grant to be written")
            poll.cancel()  # the agent hung up while its grant was in flight
            c.log.release()
            await until(lambda: c.status(task_id) == TaskStatus.LEASED, "the grant")
            (lease,) = await asyncio.wait_for(c.poll(capacity=1), 0.5)
            assert lease.task_id == task_id

    run(body)


def test_one_polls_slots_of_a_tenant_come_from_one_partition() -> None:
    """Fewer, larger records: a poll's slots of one tenant are dealt from one partition while
    it has ready work, one GrantLeases for them all, not one per partition."""

    async def body() -> None:
        async with cluster() as c:
            for p in (0, 1, 0, 1, 0, 1):
                await c.enqueue(p)
            grants_before = [proc.log.end_offset(proc.partition) for proc in c.procs]
            leases = await c.poll(capacity=3)
            assert len(leases) == 3 and len({lease.partition for lease in leases}) == 1
            grants = [
                proc.log.end_offset(proc.partition) - before
                for proc, before in zip(c.procs, grants_before, strict=True)
            ]
            assert sorted(grants) == [0, 1], "one GrantLeases record"
            more = await c.poll(capacity=3)
            assert {lease.partition for lease in more} == {1 - leases[0].partition}

    run(body)


def test_a_poll_keeps_headroom_from_the_heaviest_tenant_while_another_is_active() -> None:
    """Headroom (pool.py): with tenant A holding most of an agent's slots and tenant B active,
    the agent's last free slot is not dealt to A; B's next task gets it at once. Once B has
    been quiet for ACTIVE_MS, A may have it; a poll that does not say its slots keeps none."""

    async def body() -> None:
        async with cluster() as c:
            for _ in range(8):
                await c.enqueue(0, tenant="A")
            await c.enqueue(1, tenant="B")
            first = await c.poll(capacity=4, slots=4)
            assert sorted(lease.tenant for lease in first) == ["A", "A", "A", "B"]
            # B's lease ends; A holds 3 of the agent's 4 slots, B is still active.
            (b_lease,) = [lease for lease in first if lease.tenant == "B"]
            await c.complete(b_lease)
            assert await c.poll(capacity=1, slots=4, wait_ms=100) == [], "kept for B"
            waiting = asyncio.create_task(c.poll(capacity=1, slots=4))
            await until(lambda: len(c.pool.entries) == 1, "the poll to wait")
            b_task = await c.enqueue(1, tenant="B")
            assert [lease.task_id for lease in await waiting] == [b_task]
            # Without ``slots`` the pool cannot tell a last slot from an agent's only one.
            (a_lease,) = await c.poll(capacity=1, wait_ms=100)
            assert a_lease.tenant == "A"
            # B quiet for ACTIVE_MS: nothing is kept any more.
            c.clock.advance(pool.ACTIVE_MS + 1)
            (a_lease,) = await c.poll(capacity=1, slots=4, wait_ms=100)
            assert a_lease.tenant == "A"

    run(body)


def test_an_agent_of_many_slots_keeps_one_for_a_newcomer_while_one_tenant_has_it() -> None:
    """Headroom with one tenant active (pool.py): an agent of NEWCOMER_SLOTS_MIN slots that
    serves any tenant keeps its last free slot from A, so B's first task starts at once
    instead of after A's tasks. An agent of fewer slots, and one serving A alone, keep none."""
    slots = pool.NEWCOMER_SLOTS_MIN

    async def body() -> None:
        async with cluster() as c:
            for _ in range(2 * slots):
                await c.enqueue(0, tenant="A")
            first = await c.poll(capacity=slots, slots=slots)
            assert len(first) == slots - 1, "one slot kept while A has the agent to itself"
            assert await c.poll(capacity=1, slots=slots, wait_ms=100) == []
            waiting = asyncio.create_task(c.poll(capacity=1, slots=slots))
            await until(lambda: len(c.pool.entries) == 1, "the poll to wait")
            b_task = await c.enqueue(1, tenant="B")
            assert [lease.task_id for lease in await waiting] == [b_task]
            c.clock.advance(pool.ACTIVE_MS + 1)  # B quiet: A has the agent to itself again
            assert await c.poll(capacity=1, slots=slots, wait_ms=100) == []
            # Fewer slots: the one kept would be too large a share.
            (a_lease,) = await c.poll(capacity=1, slots=slots - 1, wait_ms=100)
            assert a_lease.tenant == "A"
            # An agent of tenant A only: no newcomer can reach it.
            (a_lease,) = await c.poll(capacity=1, slots=slots, wait_ms=100, tenants=["A"])
            assert a_lease.tenant == "A"

    run(body)


def test_slots_dealt_to_a_poll_that_closes_with_a_grant_in_flight_are_dealt_again() -> None:
    """A poll that times out while a grant of it is in flight closes and waits for that grant
    (``pool._close``). A slot dealt to it on a partition whose dispatcher had not proposed it
    yet (here: busy writing another grant) must go back to that partition's ready count, like
    the slots of an answered poll. Dropped, the partition counted those ready tasks as taken:
    no later poll was dealt them, and with no more events there they never ran (``conveyor
    bench fanout`` hung in CI with 200 spilled children ENQUEUED and counted 0)."""

    async def body() -> None:
        async with cluster() as c:
            mine = await c.enqueue(0, tenant="t")
            other, stranded = await c.enqueue(1, tenant="x"), await c.enqueue(1, tenant="y")
            c.log.held.update({0, 1})

            def poll(
                agent: str, tenants: list[str], capacity: int, wait_ms: float
            ) -> Coroutine[Any, Any, list[Lease]]:
                return c.pool.poll(
                    agent_id=agent,
                    app="app",
                    tenants=tenants,
                    queues=[],
                    capacity=capacity,
                    lease_ms=LEASE_MS,
                    wait_ms=wait_ms,
                )

            # F's grant keeps partition 1's dispatcher busy.
            first = asyncio.create_task(poll("f", ["x"], 1, 5_000))
            await until(lambda: c.log.waiting == 1, "F's grant to be written")
            # E is dealt t's task on partition 0 (its grant is written at once, and held) and
            # y's on partition 1 (dealt, waiting for the busy dispatcher).
            closing = asyncio.create_task(poll("e", [], 2, 100))
            await until(lambda: c.log.waiting == 2, "E's grant on partition 0 to be written")
            (entry,) = [e for e in c.pool.entries.values() if e.agent_id == "e"]
            await until(lambda: entry.closed, "E to time out, its grant still in flight")
            c.log.release(1)  # partition 1's dispatcher is free while E waits for its grant
            assert [lease.task_id for lease in await first] == [other]
            c.log.release(0)
            assert [lease.task_id for lease in await closing] == [mine]
            # y's task is ready on partition 1: the next poll gets it.
            got = await poll("g", [], 1, 1_000)
            assert [lease.task_id for lease in got] == [stranded]
            assert c.status(stranded) == TaskStatus.LEASED

    run(body)


def test_slots_of_a_grant_that_could_not_be_written_are_dealt_again() -> None:
    """A GrantLeases whose append fails (a full disk: ``LogFull``, nothing written) gives its
    slots back to the poll, and its ready tasks back to the partition's ready count: dealing
    took them off it, and no grant will bring a recount. Left off the count, the task stayed
    unleased with a poll waiting for it until some other event on its partition."""

    async def body() -> None:
        async with cluster() as c:
            task_id = await c.enqueue(0)
            c.log.full.add(0)
            poll = asyncio.create_task(c.poll(capacity=1, wait_ms=1_000))
            await until(lambda: c.log.failed == 1, "the grant's append to fail")
            # The dispatcher backs off for the LogFull's retry_after_ms, then deals again.
            c.clock.advance(LogFull("").retry_after_ms)
            assert [lease.task_id for lease in await poll] == [task_id]
            assert c.status(task_id) == TaskStatus.LEASED

    run(body)


def test_a_task_enqueued_in_the_read_batch_of_a_grant_that_grants_nothing_is_dealt() -> None:
    """A GrantLeases (or RetryFailed) in a read batch first commits the records before it
    (``loop._apply_batch``); the events committed there still wake the dispatcher after the
    batch. Dropped, a TaskEnqueued followed by a grant that grants nothing (no TaskLeased)
    left the new task off the ready count, with a poll waiting, until another event."""

    async def body() -> None:
        async with cluster() as c:
            poll = asyncio.create_task(c.poll(capacity=1, wait_ms=1_000))
            await until(lambda: len(c.pool.entries) == 1, "the poll to wait")
            spec = TaskSpec(task_id=mint_task_id(0), tenant="t", app="app", task_type="job")
            now, epoch = c.clock.now_ms(), c.procs[0].epoch
            enqueue = EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec)])
            records = [
                codec.encode_record(enqueue, epoch=0, ts_ms=now, key=spec.task_id),
                codec.encode_record(GrantLeases(requests=[]), epoch=epoch, ts_ms=now, key="l"),
            ]
            await c.log.append(0, records, epoch=epoch)  # one append: one read batch
            assert [lease.task_id for lease in await poll] == [spec.task_id]

    run(body)
