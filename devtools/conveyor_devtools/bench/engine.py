"""``conveyor bench engine``: enqueue -> lease -> complete through the log and processors.

One process, no HTTP, no guests: it measures the engine itself. Enqueuers append batches of
1,000 tasks while in-process agents long-poll with a large capacity and complete what they get
at once. The figure counts from the first enqueue to the last SUCCEEDED, and the run checks
that every task ended SUCCEEDED. ``main_cpu_us_per_task`` is the event loop thread's CPU over
the run per task: the engine's Python work, which the noise of a shared machine moves less than
the wall-clock rate.

Before and after that run, ``single`` tasks go through one at a time (enqueue, poll, complete,
then the next): the main thread's CPU per task there is the cost of a record that batching
hides, on a fresh node and on one that has drained the run (``single_cpu_us_fresh``,
``single_cpu_us_drained``). The two should be close: state that degrades with history (a
scan walking the tombstones of finished tasks) shows as the second growing.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from conveyor.schemas.types import Completion, Outcome, TaskSpec, TaskStatus
from conveyor.streams.node import Node
from conveyor.streams.processor.pool import Lease
from conveyor.streams.routing import mint_task_id

ENQUEUE_BATCH = 1_000
SINGLE_APP = "single"  # the one-at-a-time tasks, apart from the run's


async def bench_engine(
    *,
    tasks: int = 200_000,
    partitions: int = 8,
    agents: int = 4,
    capacity: int = 1_000,
    enqueuers: int = 4,
    backlog: bool = False,
    single: int = 200,
    home: str | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-") as tmp:
        node = await Node.open(Path(home or tmp), partitions=partitions)
        await node.start()
        node.tune_gc()
        try:
            fresh = None if backlog else await _one_at_a_time(node, single)
            result = await _run(node, tasks, partitions, agents, capacity, enqueuers, backlog)
            if fresh is not None:
                result["single_cpu_us_fresh"] = fresh
                result["single_cpu_us_drained"] = await _one_at_a_time(node, single)
            return result
        finally:
            await node.stop()


async def _run(
    node: Node,
    tasks: int,
    partitions: int,
    agents: int,
    capacity: int,
    enqueuers: int,
    backlog: bool,
) -> dict[str, Any]:
    done = 0
    enqueued_at = 0.0
    start = time.perf_counter()
    cpu_start = time.thread_time()

    async def enqueuer(k: int) -> None:
        for lo in range(k * ENQUEUE_BATCH, tasks, enqueuers * ENQUEUE_BATCH):
            n = min(ENQUEUE_BATCH, tasks - lo)
            specs = [
                TaskSpec(
                    task_id=mint_task_id((lo + i) % partitions),
                    tenant="bench",
                    app="bench",
                    task_type="noop",
                    payload=b"{}",
                )
                for i in range(n)
            ]
            await node.enqueue(specs)

    async def agent(k: int) -> None:
        nonlocal done
        while done < tasks:
            leases = await node.poll(
                agent_id=f"agent-{k}",
                app="bench",
                tenants=[],
                queues=[],
                capacity=capacity,
                wait_ms=100,
            )
            if leases:
                await node.complete(
                    [
                        Completion(
                            task_id=lease.task_id,
                            lease_id=lease.lease_id,
                            outcome=Outcome.SUCCEEDED,
                        )
                        for lease in leases
                    ]
                )
                done += len(leases)

    workers = [] if backlog else [asyncio.create_task(agent(k)) for k in range(agents)]
    await asyncio.gather(*(enqueuer(k) for k in range(enqueuers)))
    enqueued_at = time.perf_counter() - start
    await asyncio.gather(*workers)
    seconds = time.perf_counter() - start
    cpu_s = time.thread_time() - cpu_start
    counts = _count_statuses(node)
    expected = TaskStatus.ENQUEUED if backlog else TaskStatus.SUCCEEDED
    return {
        "tasks": tasks,
        "seconds": round(seconds, 3),
        "tasks_per_s": round(tasks / seconds),
        "enqueue_per_s": round(tasks / enqueued_at),
        "main_cpu_us_per_task": round(cpu_s / tasks * 1e6, 1),
        "partitions": partitions,
        "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
        "all_" + expected.value.lower(): counts.get(expected.value, 0) == tasks,
        "statuses": counts,
    }


async def _one_at_a_time(node: Node, n: int) -> float:
    """Main-thread CPU microseconds per task of ``n`` tasks run one after another."""
    start = time.thread_time()
    for i in range(n):
        spec = TaskSpec(
            task_id=mint_task_id(i % node.partitions),
            tenant="bench",
            app=SINGLE_APP,
            task_type="noop",
            payload=b"{}",
        )
        await node.enqueue([spec])
        leases: list[Lease] = []
        while not leases:
            leases = await node.poll(
                agent_id="single", app=SINGLE_APP, tenants=[], queues=[], capacity=1, wait_ms=100
            )
        (lease,) = leases
        done = Completion(task_id=lease.task_id, lease_id=lease.lease_id, outcome=Outcome.SUCCEEDED)
        await node.complete([done])
    return round((time.thread_time() - start) / max(n, 1) * 1e6, 1)


def _count_statuses(node: Node) -> dict[str, int]:
    """Statuses of the run's tasks (the one-at-a-time ones are apart)."""
    counts: dict[str, int] = {}
    for p in range(node.partitions):
        for task in node.tables(p).tasks():
            if task.app != SINGLE_APP:
                counts[task.status.value] = counts.get(task.status.value, 0) + 1
    return counts
