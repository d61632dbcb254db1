"""Dispatch by task type (``streams/processor/pool.py``, Task types; the machine's Type rule in
``streams/machine/handlers/dispatch.py``): a poll names the types its agent serves, and only
ready tasks of those types are dealt to it. Two real processors on a memory log, through the
waiting pool, as in ``test_waiting_pool``."""

from __future__ import annotations

from conveyor.schemas import codec
from conveyor.schemas.types import EnqueueTasks, TaskSpec, TaskStatus
from conveyor.streams.processor.dispatch import READY_PEEK
from conveyor.streams.processor.pool import Lease
from conveyor.streams.routing import mint_task_id
from tests.unit.test_waiting_pool import LEASE_MS, Cluster, cluster, run


async def enqueue(c: Cluster, partition: int, task_type: str, priority: int = 0) -> str:
    spec = TaskSpec(
        task_id=mint_task_id(partition),
        tenant="t",
        app="app",
        task_type=task_type,
        priority=priority,
    )
    (reply,) = await c.procs[partition].submit(
        EnqueueTasks(tasks=[codec.TASK_SPEC.encode(spec)]), spec.task_id
    )
    assert reply.ok
    return spec.task_id


async def poll(
    c: Cluster, agent: str, types: set[str], capacity: int, wait_ms: float = 200
) -> list[Lease]:
    return await c.pool.poll(
        agent_id=agent,
        app="app",
        tenants=[],
        queues=[],
        capacity=capacity,
        lease_ms=LEASE_MS,
        wait_ms=wait_ms,
        task_types=frozenset(types),
    )


async def take(c: Cluster, agent: str, types: set[str], capacity: int) -> list[str]:
    """What the agent gets over its polls until one comes back empty (a poll answers with what
    it holds; the leases still in flight reach its next poll)."""
    taken: list[str] = []
    while got := await poll(c, agent, types, capacity - len(taken)):
        taken.extend(x.task_id for x in got)
        if len(taken) >= capacity:
            break
    return sorted(taken)


def test_during_a_rolling_deploy_a_new_type_goes_only_to_agents_of_the_new_version() -> None:
    async def body() -> None:
        async with cluster() as c:
            new = [await enqueue(c, i % 2, "new_type") for i in range(10)]
            old = [await enqueue(c, i % 2, "job") for i in range(10)]
            # The old version's agent polls first, with room for everything.
            assert await take(c, "old-agent", {"job"}, 20) == sorted(old)
            assert all(c.status(t) == TaskStatus.ENQUEUED for t in new)
            assert await take(c, "new-agent", {"job", "new_type"}, 20) == sorted(new)

    run(body)


def test_tasks_no_waiting_agent_serves_stay_ready_and_do_not_block_the_ones_behind() -> None:
    async def body() -> None:
        async with cluster() as c:
            # More than a dispatcher counts ahead, and of a higher priority: at the head of
            # the tenant's work if types were one queue.
            orphans = [await enqueue(c, 0, "orphan", priority=9) for _ in range(READY_PEEK + 6)]
            behind = [await enqueue(c, 0, "job") for _ in range(5)]
            assert await take(c, "agent", {"job"}, 5) == sorted(behind)
            assert all(c.status(t) == TaskStatus.ENQUEUED for t in orphans)
            assert await poll(c, "agent", {"job"}, capacity=5) == []  # nothing it serves left

    run(body)


def test_an_agent_of_several_types_takes_them_by_priority_then_age() -> None:
    async def body() -> None:
        async with cluster() as c:
            low = await enqueue(c, 0, "job", priority=0)
            high = await enqueue(c, 0, "other", priority=5)
            (first,) = await poll(c, "agent", {"job", "other"}, capacity=1)
            (second,) = await poll(c, "agent", {"job", "other"}, capacity=1)
            assert [first.task_id, second.task_id] == [high, low]

    run(body)
