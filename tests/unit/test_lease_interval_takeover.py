"""A lease keeps the interval its agent asked for across a leader change, and a short one lapses
on time.

An agent polls with its own ``lease_ms`` (the worker API allows up to an hour) and heartbeats
well inside it. A new leader gives every running lease "a fresh lease interval from takeover":
that interval must be the lease's own, or a lease that is heartbeated on time
lapses after the takeover and its task runs twice.
"""

from __future__ import annotations

import asyncio

from test_fencing import poll, run

from conveyor.schemas import codec
from conveyor.schemas.types import EnqueueTasks, TaskSpec, TaskStatus
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.processor.leases import CONTINUE
from conveyor.streams.processor.loop import PartitionProcessor
from conveyor.streams.processor.pool import WaitingPool

AGENT_LEASE_MS = 120_000  # the agent's lease; the node's default (Settings.lease_ms) is 30 s
HEARTBEAT_MS = 45_000  # well inside the agent's lease, longer than the node's default


async def settle() -> None:
    for _ in range(50):
        await asyncio.sleep(0)


def spec() -> TaskSpec:
    return TaskSpec(task_id="0000" + "1" * 28, tenant="t", app="app", task_type="job")


def test_a_heartbeated_lease_with_its_own_interval_survives_a_takeover() -> None:
    async def body() -> None:
        log, clock = MemoryLog(1), FakeClock()
        a = PartitionProcessor(
            0, log, MemoryKV(), clock=clock, leader_id="A", pool=WaitingPool(clock)
        )
        await a.start()
        await a.submit(EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec())]), "k")
        (lease,) = await poll(a.pool, lease_ms=AGENT_LEASE_MS)
        await a.stop()
        # B takes over (a restart over the same log); the agent goes on heartbeating on time.
        b = PartitionProcessor(
            0, log, MemoryKV(), clock=clock, leader_id="B", pool=WaitingPool(clock)
        )
        await b.start()
        try:
            for beat in range(4):
                clock.advance(HEARTBEAT_MS)
                await settle()
                task = b.read_task(lease.task_id)
                assert task is not None
                assert task.status == TaskStatus.LEASED, (
                    f"heartbeat {beat}: a lease heartbeated every {HEARTBEAT_MS} ms inside its "
                    f"{AGENT_LEASE_MS} ms interval lapsed after the takeover"
                )
                assert b.leases.heartbeat(lease.task_id, lease.lease_id) == CONTINUE
        finally:
            await b.stop()

    run(body)


def test_a_short_lease_lapses_on_time_though_the_duty_was_asleep_when_it_was_granted() -> None:
    """The lease duty sleeps up to a second when it holds no lease; a lease of 100 ms granted
    meanwhile must not wait for that second to end before it lapses."""

    async def body() -> None:
        clock = FakeClock()
        p = PartitionProcessor(0, MemoryLog(1), MemoryKV(), clock=clock, pool=WaitingPool(clock))
        await p.start()
        try:
            await settle()  # the duty is asleep: no lease yet
            await p.submit(EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec())]), "k")
            (lease,) = await poll(p.pool, lease_ms=100)
            await settle()
            clock.advance(150)
            for _ in range(20):
                await settle()
                task = p.read_task(lease.task_id)
                assert task is not None
                if task.status != TaskStatus.LEASED:
                    break
            assert task.status == TaskStatus.RETRY_WAIT, "a 100 ms lease still held after 150 ms"
        finally:
            await p.stop()

    run(body)
