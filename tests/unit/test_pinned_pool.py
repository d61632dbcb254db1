"""The pinned lane through the waiting pool (``streams/processor/pool.py``, ``store/lanes.py``):
a real in-process node (log on disk, RocksDB), agents of two app versions long-polling it.

The machine tests (``machine/test_pinned.py``) show which lane a task waits in; these show that
the pool deals each lane only to the agents that take from it: a pinned workflow that failed on
v1 comes back to a v1 poll, and a v2 poll waiting at the same time never receives it."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conveyor.schemas.types import Completion, Outcome, TaskSpec, TaskStatus
from conveyor.streams.node import Node
from conveyor.streams.processor.pool import Lease
from conveyor.streams.routing import mint_task_id

APP = "shop"


async def poll(node: Node, version: str, wait_ms: float) -> list[Lease]:
    return await node.poll(
        agent_id=f"agent-{version}",
        app=APP,
        tenants=[],
        queues=[],
        capacity=4,
        wait_ms=wait_ms,
        app_version=version,
    )


async def failed_once_on_v1(node: Node, resume: str) -> str:
    """A task whose first attempt went to a v1 agent and failed; it is due again at once."""
    spec = TaskSpec(
        task_id=mint_task_id(0),
        tenant="t",
        app=APP,
        task_type="wf",
        resume=resume,
        backoff_base_ms=1,
        backoff_cap_ms=1,
    )
    (reply,) = await node.enqueue([spec])
    assert reply.ok
    (lease,) = await poll(node, "v1", wait_ms=2_000)
    assert (lease.task_id, lease.attempt) == (spec.task_id, 1)
    done = Completion(task_id=spec.task_id, lease_id=lease.lease_id, outcome=Outcome.FAILED)
    (answer,) = await node.complete([done])
    assert answer.ok
    return spec.task_id


async def with_node(tmp_path: Path, resume: str) -> tuple[str, list[Lease], list[Lease]]:
    """Both versions poll at once after the failure: what each receives."""
    node = await Node.open(tmp_path, partitions=2)
    await node.start()
    try:
        task_id = await failed_once_on_v1(node, resume)
        v2 = asyncio.create_task(poll(node, "v2", wait_ms=1_500))
        await asyncio.sleep(0.2)  # v2 waits first: the pool would deal it the task if it could
        v1 = asyncio.create_task(poll(node, "v1", wait_ms=1_500))
        got_v2, got_v1 = await v2, await v1
        if resume == "pinned":
            status = node.tables(node.partition_of(task_id)).task(task_id)
            assert status is not None and status.status == TaskStatus.LEASED
        return task_id, got_v1, got_v2
    finally:
        await node.stop()


def test_a_pinned_retry_goes_to_its_version_not_to_an_earlier_waiting_poll(
    tmp_path: Path,
) -> None:
    task_id, v1, v2 = asyncio.run(with_node(tmp_path, "pinned"))
    assert v2 == []
    assert [(lease.task_id, lease.attempt) for lease in v1] == [(task_id, 2)]


def test_a_latest_retry_goes_to_whichever_version_polls_first(tmp_path: Path) -> None:
    task_id, v1, v2 = asyncio.run(with_node(tmp_path, "latest"))
    assert v1 == []
    assert [(lease.task_id, lease.attempt) for lease in v2] == [(task_id, 2)]
