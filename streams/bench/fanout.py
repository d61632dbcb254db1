"""``conveyor bench fanout``: one workflow fans out to N no-op children and resumes.

One process, no HTTP, no guests (like ``bench engine``). An in-process agent plays both the
workflow and its children: the workflow's first attempt completes with a FAN_OUT of N
children; every child completes at once; the workflow's next lease must carry the committed
parallel step with N results, and it then succeeds. The run checks that the fan-in fired
exactly once (the workflow is leased exactly twice and its barrier is fired), that every
child SUCCEEDED, and that the results are in child order. The figure counts from the
workflow's enqueue to its SUCCEEDED. With ``partitions`` > 1, children past the first 1,000
spill over the other partitions (``handlers/workflows.py`` rule 7): ``children_by_partition``
counts where they ran.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

from conveyor.schemas import codec
from conveyor.schemas.types import Completion, FanOut, Outcome, ParallelMode, TaskSpec
from conveyor.streams.machine.handlers.workflows import child_id
from conveyor.streams.node import Node
from conveyor.streams.processor.pool import Lease
from conveyor.streams.routing import mint_task_id

STEP = "fan#0"
TENANT = APP = "bench"


async def bench_fanout(
    *,
    children: int = 10_000,
    partitions: int = 1,
    agents: int = 4,
    capacity: int = 1_000,
    home: str | None = None,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-fanout-") as tmp:
        node = await Node.open(Path(home or tmp), partitions=partitions)
        await node.start()
        node.tune_gc()
        try:
            return await _run(node, children, agents, capacity)
        finally:
            await node.stop()


async def _run(node: Node, children: int, agents: int, capacity: int) -> dict[str, Any]:
    workflow_id = mint_task_id(0)
    workflow = TaskSpec(task_id=workflow_id, tenant=TENANT, app=APP, task_type="flow")
    kids = [
        codec.TASK_SPEC.encode(
            TaskSpec(task_id="", tenant="", app="", task_type="noop", payload=str(i).encode())
        )
        for i in range(children)
    ]
    state: dict[str, Any] = {"leased": 0, "result": None, "fanned_at": 0.0, "resumed_at": 0.0}
    start = time.perf_counter()
    await node.enqueue([workflow])

    async def agent(k: int) -> None:
        while state["result"] is None:
            leases = await node.poll(
                agent_id=f"bench-{k}",
                app=APP,
                tenants=[],
                queues=[],
                capacity=capacity,
                wait_ms=100,
            )
            done = [_handle(lease, workflow_id, kids, state) for lease in leases]
            if done:
                await node.complete(done)

    await asyncio.gather(*(agent(k) for k in range(agents)))
    finished = await node.wait_finished(TENANT, workflow_id, 60_000)
    seconds = time.perf_counter() - start
    barrier = node.tables(0).barrier(workflow_id, STEP)
    statuses: dict[str, int] = {}
    by_partition = [0] * node.partitions
    for i in range(children):
        task_id = child_id(workflow_id, STEP, i, node.partitions)
        by_partition[node.partition_of(task_id)] += 1
        child = node.processors[node.partition_of(task_id)].read_task(task_id)
        status = child.status.value if child is not None else "MISSING"
        statuses[status] = statuses.get(status, 0) + 1
    return {
        "children": children,
        "partitions": node.partitions,
        "children_by_partition": by_partition,
        "seconds": round(seconds, 3),
        "children_per_s": round(children / seconds),
        "fan_out_to_resume_seconds": round(state["resumed_at"] - state["fanned_at"], 3),
        "fan_in_fired_once": state["leased"] == 2 and barrier is not None and barrier.fired,
        "results_in_order": state["result"] == list(range(children)),
        "workflow": finished.status.value,
        "children_statuses": statuses,
        "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
    }


def _handle(lease: Lease, workflow_id: str, kids: list[bytes], state: dict[str, Any]) -> Completion:
    """What the agent reports for one lease: a child echoes its payload; the workflow fans
    out on its first lease and returns on its second, reading the committed results."""
    if lease.task_id != workflow_id:
        return _succeeded(lease, lease.payload)
    state["leased"] += 1
    committed = [s for s in lease.steps if s.identity == STEP and s.value is not None]
    if committed and committed[0].value is not None:
        state["result"] = json.loads(committed[0].value)["results"]
        state["resumed_at"] = time.perf_counter()
        return _succeeded(lease, b"null")
    state["fanned_at"] = time.perf_counter()
    step = FanOut(identity=STEP, position=0, mode=ParallelMode.COLLECT, children=kids)
    return Completion(
        task_id=lease.task_id, lease_id=lease.lease_id, outcome=Outcome.FAN_OUT, fan_out=step
    )


def _succeeded(lease: Lease, result: bytes | None) -> Completion:
    return Completion(
        task_id=lease.task_id, lease_id=lease.lease_id, outcome=Outcome.SUCCEEDED, result=result
    )
