"""``conveyor bench fairness``: does tenant A's backlog cost tenant B latency?

Tenant A enqueues a large backlog at once; then tenant B enqueues one task every few
milliseconds while agents with a fixed number of slots (far below A's backlog) drain both.
Each task "runs" for ``task_ms``, or, with ``task_jitter`` j, for a duration drawn uniformly
from ``task_ms`` x [1 - j, 1 + j] (seeded: the same draws every run). The figure is B's
schedule-to-start (from its enqueue call to the lease in the agent's hands), p50 and p99, under A's
backlog and on an idle engine. The agent polls with its free slots and says how many it has in
all, so the pool keeps headroom for B (``streams/processor/pool.py``); ``a_done_during_b`` is
what A got done meanwhile, the price of that headroom.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from pathlib import Path
from typing import Any

from conveyor.schemas.types import Completion, Outcome, TaskSpec
from conveyor.streams.node import Node
from conveyor.streams.routing import mint_task_id

POLLERS = 1  # see agent()


async def bench_fairness(
    *,
    backlog: int = 200_000,
    b_tasks: int = 300,
    b_every_ms: float = 5.0,
    slots: int = 16,
    task_ms: float = 10.0,
    task_jitter: float = 0.0,
    partitions: int = 8,
) -> dict[str, Any]:
    work = _Work(task_ms, task_jitter)
    idle = await _scenario(0, b_tasks, b_every_ms, slots, work, partitions)
    loaded = await _scenario(backlog, b_tasks, b_every_ms, slots, work, partitions)
    return {
        "backlog": backlog,
        "slots": slots,
        "task_ms": task_ms,
        "task_jitter": task_jitter,
        "b_tasks": b_tasks,
        "b_p50_ms": loaded["p50"],
        "b_p99_ms": loaded["p99"],
        "b_idle_p50_ms": idle["p50"],
        "b_idle_p99_ms": idle["p99"],
        "a_done_during_b": loaded["a_done"],
        "bar_ok": loaded["p99"] <= 2 * idle["p99"] + 5,
        "b_ack_p50_ms": loaded["ack_p50"],
        "b_ack_p99_ms": loaded["ack_p99"],
        "b_idle_ack_p99_ms": idle["ack_p99"],
    }


class _Work:
    """How long each task "runs": ``task_ms``, spread by ``jitter`` (seeded)."""

    def __init__(self, task_ms: float, jitter: float) -> None:
        if not 0 <= jitter < 1:
            raise ValueError(f"task_jitter must be in [0, 1), not {jitter}")
        self.task_ms = task_ms
        self.jitter = jitter
        self.rng = random.Random(0)

    def seconds(self) -> float:
        spread = self.rng.uniform(1 - self.jitter, 1 + self.jitter) if self.jitter else 1.0
        return self.task_ms * spread / 1000


async def _scenario(
    backlog: int, b_tasks: int, b_every_ms: float, slots: int, work: _Work, partitions: int
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="conveyor-fair-") as tmp:
        node = await Node.open(Path(tmp), partitions=partitions)
        await node.start()
        node.tune_gc()
        try:
            await _enqueue_backlog(node, backlog, partitions)
            work.rng.seed(0)
            return await _measure(node, b_tasks, b_every_ms, slots, work, partitions)
        finally:
            await node.stop()


async def _enqueue_backlog(node: Node, backlog: int, partitions: int) -> None:
    for lo in range(0, backlog, 1_000):
        specs = [
            TaskSpec(task_id=mint_task_id(i % partitions), tenant="A", app="fair", task_type="noop")
            for i in range(lo, min(backlog, lo + 1_000))
        ]
        await node.enqueue(specs)


async def _measure(
    node: Node, b_tasks: int, b_every_ms: float, slots: int, work: _Work, partitions: int
) -> dict[str, float]:
    enqueued: dict[str, float] = {}
    acks: list[float] = []
    started: dict[str, float] = {}
    counts = {"a": 0}
    free = slots
    freed = asyncio.Event()
    done: list[Completion] = []
    stop = asyncio.Event()
    running: set[asyncio.Task[None]] = set()

    async def run(task_id: str, lease_id: int) -> None:
        nonlocal free
        await asyncio.sleep(work.seconds())
        done.append(Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.SUCCEEDED))
        free += 1
        freed.set()

    async def reporter() -> None:
        # Like a real agent: completions go out in batches, every couple of milliseconds.
        while not stop.is_set() or done:
            if done:
                batch = done[:]
                done.clear()
                await node.complete(batch)
            await asyncio.sleep(0.002)

    async def agent() -> None:
        # Like a real agent: one poll at a time for all free slots. More concurrent pollers
        # were measured: more, smaller GrantLeases records, more fsyncs, a worse B p99.
        nonlocal free
        while not stop.is_set():
            if free == 0:
                freed.clear()
                await freed.wait()
                continue
            want, free = free, 0
            leases = await node.poll(
                agent_id="fair",
                app="fair",
                tenants=[],
                queues=[],
                capacity=want,
                wait_ms=50,
                slots=slots,  # so the pool keeps headroom for B (pool.py)
            )
            free += want - len(leases)
            if free:
                freed.set()
            for lease in leases:
                if lease.tenant == "B":
                    started[lease.task_id] = time.perf_counter()
                else:
                    counts["a"] += 1
                job = asyncio.create_task(run(lease.task_id, lease.lease_id))
                running.add(job)
                job.add_done_callback(running.discard)

    agents = [asyncio.create_task(agent()) for _ in range(POLLERS)]
    agents.append(asyncio.create_task(reporter()))
    for i in range(b_tasks):
        task_id = mint_task_id(i % partitions)
        t0 = time.perf_counter()
        await node.enqueue([TaskSpec(task_id=task_id, tenant="B", app="fair", task_type="noop")])
        enqueued[task_id] = t0
        acks.append((time.perf_counter() - t0) * 1000)
        await asyncio.sleep(b_every_ms / 1000)
    deadline = time.perf_counter() + 30
    while len(started) < b_tasks and time.perf_counter() < deadline:
        await asyncio.sleep(0.01)
    stop.set()
    freed.set()
    await asyncio.gather(*agents, return_exceptions=True)
    await asyncio.gather(*running, return_exceptions=True)
    waits = sorted((started[t] - enqueued[t]) * 1000 for t in started if t in enqueued)
    missing = b_tasks - len(waits)
    if missing:
        waits.extend([float("inf")] * missing)
    acks.sort()
    return {
        "p50": _pct(waits, 50),
        "p99": _pct(waits, 99),
        "a_done": counts["a"],
        "ack_p50": _pct(acks, 50),
        "ack_p99": _pct(acks, 99),
    }


def _pct(values: list[float], p: float) -> float:
    if not values:
        return float("nan")
    return round(values[min(len(values) - 1, int(len(values) * p / 100))], 2)
