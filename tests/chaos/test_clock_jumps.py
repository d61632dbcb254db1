"""C2 of tests/PLAN.md: the node's clock jumps, at the processor level with an injected clock.

The processor's time base is its clock: ``now_ms`` (wall) stamps every record it proposes and
decides which timers are due; ``monotonic_ms`` times lease deadlines. The machine takes "now"
from the record's stamp only. So:

- the wall clock stepping back (NTP) never fires a timer early, and never undoes an expiry or
  a terminal state that was already applied (the log is history; the clock is not);
- the wall clock stepping back does not stretch a lease: lease deadlines are monotonic;
- time jumping forward (a paused VM, both clocks) expires leases, and then the old holder's
  completion is rejected by the lease id (fencing), never accepted on the clock's say-so;
- a forward jump fires each overdue timer once, not once per missed tick.

Every FireTimers record in the log is checked against its stamp (I11: stamped at or after the
fire time of every timer it fires).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest

from conveyor.schemas import codec
from conveyor.schemas.types import (
    CompleteAttempts,
    Completion,
    EnqueueTasks,
    EventKind,
    FireTimers,
    Outcome,
    TaskSpec,
    TaskStatus,
)
from conveyor.store import keys
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.processor.loop import PartitionProcessor, Settings
from conveyor.streams.processor.pool import Lease, WaitingPool

pytestmark = pytest.mark.timeout(60)

T = TypeVar("T")
LEASE_MS = 10_000
HOUR_MS = 3_600_000
START_MS = 1_700_000_000_000


class SteppedClock(FakeClock):
    """A FakeClock whose wall clock can be stepped without moving monotonic time (NTP)."""

    def __init__(self) -> None:
        super().__init__(START_MS)
        self.wall_offset_ms = 0

    def now_ms(self) -> int:
        return super().now_ms() + self.wall_offset_ms

    def step_wall(self, delta_ms: int) -> None:
        self.wall_offset_ms += delta_ms


class Partition:
    """One processor (leader) over a memory log, with its pool and clock."""

    def __init__(self) -> None:
        self.clock = SteppedClock()
        self.log = MemoryLog(1)
        self.kv = MemoryKV()
        self.events_log = MemoryLog(1)
        self.pool = WaitingPool(self.clock)
        self.proc = PartitionProcessor(
            0,
            self.log,
            self.kv,
            clock=self.clock,
            pool=self.pool,
            events_log=self.events_log,
            settings=Settings(lease_ms=LEASE_MS),
        )

    async def enqueue(self, spec: TaskSpec) -> None:
        (reply,) = await self.proc.submit(EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec)]), "k")
        assert reply.ok, reply

    async def lease(self) -> Lease:
        (lease,) = await self.pool.poll(
            agent_id="agent",
            app="app",
            tenants=[],
            queues=[],
            capacity=1,
            lease_ms=LEASE_MS,
            wait_ms=60_000,
        )
        return lease

    async def complete(self, task_id: str, lease_id: int) -> bool:
        done = Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.SUCCEEDED)
        (reply,) = await self.proc.submit(CompleteAttempts(items=[done]), "agent")
        return reply.ok

    def status(self, task_id: str) -> TaskStatus:
        task = self.proc.read_task(task_id)
        assert task is not None
        return TaskStatus(task.status)

    async def events(self, task_id: str, kind: EventKind) -> int:
        """Events of the task so far: shipped (events log) or not yet (outbox), deduplicated
        by version as a consumer would."""
        rows = [v for _, v in self.kv.scan(keys.OUTBOX)]
        async for batch in self.events_log.read(0, 0):
            rows += [r.data for r in batch]
        return len(
            {
                e.version
                for row in rows
                for e in codec.EVENT_BATCH.decode(row).events
                if e.task_id == task_id and e.kind == kind
            }
        )

    async def settle(self) -> None:
        """Let the leader duties run their current turn (nothing here waits on real time)."""
        for _ in range(200):
            await asyncio.sleep(0)

    async def check_timer_stamps(self) -> int:
        """I11 over the whole log: no FireTimers record fires a timer before its time."""
        fired = 0
        async for batch in self.log.read(0, 0):
            for item in batch:
                envelope = codec.decode_envelope(item.data)
                record = codec.decode_body(envelope)
                if isinstance(record, FireTimers):
                    for ref in record.timers:
                        assert ref.fire_at_ms <= envelope.ts_ms, f"early: {ref} at {envelope}"
                        fired += 1
        return fired


def spec(n: int, **fields: int) -> TaskSpec:
    return TaskSpec(
        task_id=f"0000{n:028x}",
        tenant="t",
        app="app",
        task_type="job",
        attempts_max=3,
        backoff_base_ms=1_000,
        backoff_cap_ms=2_000,
        **fields,  # type: ignore[arg-type]
    )


async def until(check: Callable[[], bool], what: str) -> None:
    """Let the event loop run until ``check`` holds (the clock is fake: no real waiting)."""
    for _ in range(5_000):
        if check():
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never happened: {what}")


def run(body: Callable[[Partition], Awaitable[T]]) -> T:
    async def main() -> T:
        p = Partition()
        await p.proc.start()
        try:
            return await asyncio.wait_for(body(p), 30)
        finally:
            await p.proc.stop()

    return asyncio.run(main())


def test_wall_clock_stepping_back_never_fires_a_timer_early() -> None:
    async def body(p: Partition) -> None:
        delayed = spec(1, run_at_ms=START_MS + 10_000)
        await p.enqueue(delayed)
        p.clock.advance(4_000)
        p.clock.step_wall(-HOUR_MS)  # NTP steps the wall clock back an hour
        p.clock.advance(7_000)  # 11 s of real time since the enqueue: due by the old clock
        await p.settle()
        assert await p.events(delayed.task_id, EventKind.TaskRequeued) == 0, "fired early"
        assert p.proc.timers.fired == 0
        p.clock.step_wall(HOUR_MS)  # and forward again: now it is due, once
        p.clock.advance(1_000)
        await until(lambda: p.proc.timers.fired == 1, "the delayed task's timer")
        await p.settle()
        assert await p.events(delayed.task_id, EventKind.TaskRequeued) == 1
        assert await p.check_timer_stamps() == 1

    run(body)


def test_wall_clock_stepping_back_undoes_no_expiry_and_stretches_no_lease() -> None:
    async def body(p: Partition) -> None:
        short = spec(2, schedule_to_start_ms=5_000)
        await p.enqueue(spec(3))
        lease = await p.lease()  # task 3 is leased, with a 10 s monotonic deadline
        await p.enqueue(short)
        p.clock.advance(6_000)
        await until(lambda: p.status(short.task_id) == TaskStatus.EXPIRED, "expiry")
        expired = p.proc.read_task(short.task_id)

        p.clock.step_wall(-HOUR_MS)
        p.clock.advance(LEASE_MS)  # the lease's monotonic deadline passes
        await until(lambda: p.status(lease.task_id) != TaskStatus.LEASED, "lease expiry")
        assert p.proc.leases.heartbeat(lease.task_id, lease.lease_id) == "LOST"
        assert not await p.complete(lease.task_id, lease.lease_id), "stale lease accepted"
        await p.settle()
        assert p.proc.read_task(short.task_id) == expired, "an expiry was undone"
        assert await p.events(short.task_id, EventKind.TaskEnqueued) == 1
        assert await p.check_timer_stamps() >= 1

    run(body)


def test_jump_forward_expires_leases_and_the_old_lease_is_fenced() -> None:
    async def body(p: Partition) -> None:
        task, delayed = spec(4), spec(5, run_at_ms=START_MS + 10_000)
        await p.enqueue(task)
        first = await p.lease()
        await p.enqueue(delayed)
        p.clock.advance(HOUR_MS)  # the node was paused for an hour: both clocks jump
        await until(lambda: p.status(task.task_id) == TaskStatus.RETRY_WAIT, "lease expiry")
        await until(lambda: p.proc.timers.fired >= 1, "the overdue timer")
        await p.settle()
        assert await p.events(delayed.task_id, EventKind.TaskRequeued) == 1  # not once a tick
        p.clock.advance(2_000)  # the retry backoff (at most backoff_cap_ms)
        await until(lambda: p.status(task.task_id) == TaskStatus.ENQUEUED, "the retry")

        before = {k: v for k, v in p.kv.data.items() if k != keys.META_APPLIED}
        assert not await p.complete(task.task_id, first.lease_id), "old lease accepted"
        after = {k: v for k, v in p.kv.data.items() if k != keys.META_APPLIED}
        assert after == before, "a fenced completion changed state"

        second = await p.lease()
        if second.task_id != task.task_id:  # the delayed task was ready first
            assert await p.complete(second.task_id, second.lease_id)
            second = await p.lease()
        assert second.task_id == task.task_id and second.lease_id > first.lease_id
        assert not await p.complete(task.task_id, first.lease_id)
        assert await p.complete(task.task_id, second.lease_id)
        assert p.status(task.task_id) == TaskStatus.SUCCEEDED
        assert await p.events(task.task_id, EventKind.TaskSucceeded) == 1
        await p.check_timer_stamps()

    run(body)
