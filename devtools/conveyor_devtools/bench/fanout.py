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

A run takes about a second. One that passes DEADLINE_S has lost a step (a grant, a message
between partitions, the fan-in, the resume): it raises ``FanoutStuck`` with the state that
tells which, taken while the agents still poll, instead of polling forever with nothing to
show (CI once killed a run after 150 s of silence: ready tasks a dispatcher no longer counted,
``processor/pool.py`` ``_close``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil

from conveyor.schemas import codec
from conveyor.schemas.types import Completion, FanOut, Outcome, ParallelMode, Task, TaskSpec
from conveyor.store import keys
from conveyor.streams.machine.handlers.workflows import child_id
from conveyor.streams.node import Node
from conveyor.streams.processor.loop import PartitionProcessor
from conveyor.streams.processor.pool import Lease
from conveyor.streams.routing import mint_task_id

STEP = "fan#0"
TENANT = APP = "bench"
DEADLINE_S = 60.0  # from the enqueue to the workflow's end; a run takes about a second


class FanoutStuck(Exception):
    """The run passed its deadline; ``state`` (also in the message) is where it stood."""

    def __init__(self, deadline_s: float, state: dict[str, Any]) -> None:
        super().__init__(f"no result after {deadline_s:g} s: {json.dumps(state)}")
        self.state = state


async def bench_fanout(
    *,
    children: int = 10_000,
    partitions: int = 1,
    agents: int = 4,
    capacity: int = 1_000,
    home: str | None = None,
    deadline_s: float = DEADLINE_S,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-fanout-") as tmp:
        node = await Node.open(Path(home or tmp), partitions=partitions)
        await node.start()
        node.tune_gc()
        try:
            return await _run(node, children, agents, capacity, deadline_s)
        finally:
            await node.stop()


async def _run(
    node: Node, children: int, agents: int, capacity: int, deadline_s: float
) -> dict[str, Any]:
    workflow_id = mint_task_id(0)
    workflow = TaskSpec(task_id=workflow_id, tenant=TENANT, app=APP, task_type="flow")
    kids = [
        codec.TASK_SPEC.encode(
            TaskSpec(task_id="", tenant="", app="", task_type="noop", payload=str(i).encode())
        )
        for i in range(children)
    ]
    state: dict[str, Any] = {"leased": 0, "result": None, "fanned_at": 0.0, "resumed_at": 0.0}
    doing = ["start"] * agents  # what each agent awaits, for FanoutStuck
    start = time.perf_counter()

    async def agent(k: int) -> None:
        while state["result"] is None:
            doing[k] = "poll"
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
                doing[k] = f"complete {len(done)}"
                await node.complete(done)
        doing[k] = "done"

    async def run() -> Task:
        await node.enqueue([workflow])
        await asyncio.gather(*(agent(k) for k in range(agents)))
        return await node.wait_finished(TENANT, workflow_id, deadline_s * 1000)

    work = asyncio.ensure_future(run())
    done, _ = await asyncio.wait([work], timeout=deadline_s)
    if not done:  # a step was lost: take the state while the agents still poll, then stop
        stuck = _diagnose(node, workflow_id, children, state["leased"], doing)
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await work
        raise FanoutStuck(deadline_s, stuck)
    finished = work.result()
    seconds = time.perf_counter() - start
    barrier = node.tables(0).barrier(workflow_id, STEP)
    by_partition = [0] * node.partitions
    statuses: Counter[str] = Counter()
    for p, counts in enumerate(_children_statuses(node, workflow_id, children)):
        by_partition[p] = counts.total()
        statuses.update(counts)
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
        "children_statuses": dict(statuses),
        "rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1),
    }


def _children_statuses(node: Node, workflow_id: str, children: int) -> list[Counter[str]]:
    """For each partition, how many of the workflow's children it holds in each status."""
    counts: list[Counter[str]] = [Counter() for _ in range(node.partitions)]
    for i in range(children):
        task_id = child_id(workflow_id, STEP, i, node.partitions)
        p = node.partition_of(task_id)
        child = node.processors[p].read_task(task_id)
        counts[p][child.status.value if child is not None else "MISSING"] += 1
    return counts


def _diagnose(
    node: Node, workflow_id: str, children: int, leased: int, doing: list[str]
) -> dict[str, Any]:
    """Where a run that passed its deadline stands, enough to tell which step was lost: the
    workflow and its barrier, its children by partition and status, each partition's progress
    and unshipped rows, the waiting polls, what each agent awaits, and the node's running
    coroutines by name (a leader duty that died silently leaves one of its kind missing)."""
    tables = node.tables(node.partition_of(workflow_id))
    task = tables.task(workflow_id)
    barrier = tables.barrier(workflow_id, STEP)
    return {
        "workflow": None
        if task is None
        else {"status": task.status.value, "attempt": task.attempt, "leased_by_bench": leased},
        "barrier": None
        if barrier is None
        else {
            "fired": barrier.fired,
            "landed": sum(1 for _ in tables.child_results(workflow_id, STEP)),
            "total": barrier.total,
            "stripes_open": barrier.stripes_open,
        },
        "children": [dict(c) for c in _children_statuses(node, workflow_id, children)],
        "partitions": [_partition_state(p) for p in node.processors],
        "agents": doing,
        "polls": [
            {
                "agent": e.agent_id,
                "remaining": e.remaining,
                "claimed": e.claimed,
                "closed": e.closed,
            }
            for e in node.pool.entries.values()
        ],
        "mailboxes": len(node.pool.mail),
        "coroutines": Counter(_name(t) for t in asyncio.all_tasks()),
    }


def _partition_state(p: PartitionProcessor) -> dict[str, Any]:
    """One partition: records applied vs appended, whether it halted or leads, its message
    rows not yet shipped (by target partition) and outbox rows, the ready tasks its dispatcher
    counts vs those committed, and its live leases."""
    unshipped = Counter(str(keys.parse_message_value(v)[0]) for _, v in p.kv.scan(keys.MESSAGES))
    return {
        "applied": p.applied,
        "log_end": p.log.end_offset(p.partition),
        "halted": None if p.halted is None else repr(p.halted),
        "leader": p.leader,
        "messages_unshipped": unshipped,
        "messages_shipped": p.messages.shipped,
        "outbox_rows": sum(1 for _ in p.kv.scan(keys.OUTBOX)),
        "ready_counted": p.dispatch.ready.get(APP, {}).get(TENANT),
        "ready_committed": p.reader().count_ready(APP, TENANT),
        "live_leases": len(p.leases.live),
    }


def _name(task: asyncio.Task[Any]) -> str:
    """What a task runs (``Dispatcher.run``): the names a healthy node shows one of per
    partition."""
    coro = task.get_coro()
    return getattr(coro, "__qualname__", task.get_name())


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
