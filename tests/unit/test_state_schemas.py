"""A partition store written under other state schemas is rebuilt from the log, to the same
state: an upgrade that changes a state row never reads rows it cannot decode."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conveyor.schemas.types import Completion, Outcome, TaskSpec
from conveyor.store.state_schemas import fingerprint
from conveyor.streams.node import Node
from conveyor.streams.routing import mint_task_id


async def _work(home: Path) -> dict[str, str]:
    node = await Node.open(home, partitions=2)
    await node.start()
    try:
        specs = [
            TaskSpec(task_id=mint_task_id(i % 2), tenant="t", app="a", task_type="x")
            for i in range(20)
        ]
        await node.enqueue(specs)
        leases = await node.poll(
            agent_id="g", app="a", tenants=[], queues=[], capacity=5, wait_ms=1000
        )
        await node.complete(
            [
                Completion(task_id=x.task_id, lease_id=x.lease_id, outcome=Outcome.SUCCEEDED)
                for x in leases
            ]
        )
        return _statuses(node)
    finally:
        await node.stop()


def _statuses(node: Node) -> dict[str, str]:
    return {
        t.task_id: t.status.value for p in range(node.partitions) for t in node.tables(p).tasks()
    }


async def _reopen(home: Path) -> dict[str, str]:
    node = await Node.open(home)
    await node.start()
    try:
        return _statuses(node)
    finally:
        await node.stop()


def test_other_state_schemas_rebuild_the_store_from_the_log(tmp_path: Path) -> None:
    before = asyncio.run(_work(tmp_path))
    assert sorted(before.values()).count("SUCCEEDED") == 5 and len(before) == 20
    mark = tmp_path / "state" / "p0001.schemas"
    assert mark.read_text().strip() == fingerprint()
    mark.write_text("written by another version\n")
    (tmp_path / "state" / "p0000.schemas").unlink()  # a store older than the marks
    marker_row = tmp_path / "state" / "p0001" / "REBUILT?"
    marker_row.write_text("dropped with the old store")
    assert asyncio.run(_reopen(tmp_path)) == before  # replayed to the same state
    assert not marker_row.exists()
    assert mark.read_text().strip() == fingerprint()
