"""S5 at the node: the disk fills up while a node runs, then space comes back.

While the disk is full an enqueue fails with ``LogFull`` (retryable: HTTP 503) and creates
nothing; the leader's own appends fail the same way: a due timer, a lapsed lease, a waiting
poll's lease grant, the shipping of events. None of those duties may die of it: once space
returns, the timer fires, the lease expires, the poll gets its lease and the events ship,
without a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import pytest

from conveyor.errors import NotFound
from conveyor.schemas.types import TaskSpec, TaskStatus
from conveyor.store import keys
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.local import LocalLog, LogFull
from conveyor.streams.node import Node
from conveyor.streams.processor.loop import Settings
from conveyor_devtools.chaos.disk import FaultyFileIO

pytestmark = pytest.mark.timeout(60)

LEASE_MS = 5_000


def spec(n: int, **fields: int) -> TaskSpec:
    return TaskSpec(task_id=f"0000{n:028x}", tenant="t", app="app", task_type="job", **fields)  # type: ignore[arg-type]


async def until(check: Callable[[], bool], what: str, clock: FakeClock) -> None:
    """Let the node run, moving the fake clock in small steps (retry pauses use it); the
    log's fdatasyncs run in threads, so give real time too."""
    for _ in range(1_000):
        if check():
            return
        clock.advance(50)
        await asyncio.sleep(0.002)
    raise AssertionError(f"never happened: {what}")


def test_a_full_disk_refuses_work_and_every_duty_resumes_when_space_returns(
    tmp_path: Path,
) -> None:
    async def body() -> None:
        fs, clock = FaultyFileIO(tmp_path), FakeClock()
        log = await LocalLog.open(tmp_path / "log", 1, fs=fs)
        events = await LocalLog.open(tmp_path / "events", 1, fs=fs)
        node = Node(log, events, [MemoryKV()], clock=clock, settings=Settings(lease_ms=LEASE_MS))
        await node.start()
        proc = node.processors[0]
        try:
            delayed, leased, refused = spec(1, run_at_ms=clock.now_ms() + 1_000), spec(2), spec(3)
            await node.enqueue([delayed, leased])
            (lease,) = await node.pool.poll(
                agent_id="a", app="app", tenants=[], queues=[], capacity=1,
                lease_ms=LEASE_MS, wait_ms=60_000,
            )  # fmt: skip
            assert lease.task_id == leased.task_id

            fs.space_left = 0  # the disk is full
            with pytest.raises(LogFull):
                await node.enqueue([refused])
            with pytest.raises(NotFound):
                node.get("t", refused.task_id)
            clock.advance(LEASE_MS + 1_000)  # the timer is due and the lease lapses: both fail
            waiting = asyncio.create_task(
                node.pool.poll(
                    agent_id="b", app="app", tenants=[], queues=[], capacity=1,
                    lease_ms=LEASE_MS, wait_ms=600_000,
                )
            )  # fmt: skip
            await asyncio.sleep(0.2)
            assert node.get("t", leased.task_id).status == TaskStatus.LEASED  # nothing written
            duties = [t for t in proc._tasks if not t.done()]
            assert len(duties) == len(proc._tasks), "a leader duty died of the full disk"

            fs.space_left = None  # space is back
            await until(lambda: node.get("t", delayed.task_id).ready_seq != 0, "timer", clock)
            await until(
                lambda: node.get("t", leased.task_id).status != TaskStatus.LEASED, "expiry", clock
            )
            await until(waiting.done, "the waiting poll's lease", clock)
            assert len(waiting.result()) == 1
            await until(lambda: not list(node.stores[0].scan(keys.OUTBOX)), "shipping", clock)
            assert events.end_offset(0) > 0
            (reply,) = await node.enqueue([refused])
            assert reply.ok and reply.created
        finally:
            await node.stop()

    asyncio.run(body())
