"""A partition whose processor is made anew (it moved to another node and came back, or was
restored from a snapshot) deals from its new processor only: the waiting pool keeps one
dispatcher per partition, so a stopped processor's dispatcher never deals from its store."""

from __future__ import annotations

import asyncio
from pathlib import Path

from conveyor.errors import TransientError
from conveyor.schemas.types import TaskSpec
from conveyor.streams.node import Node
from conveyor.streams.routing import mint_task_id


def test_a_partition_taken_back_deals_from_its_new_processor_only(tmp_path: Path) -> None:
    async def main() -> None:
        node = await Node.open(tmp_path / "home", partitions=2)  # RocksDB stores, local log
        await node.start()
        try:
            for _ in range(2):  # away and back, twice
                await node.stop_partition(0, TransientError("led elsewhere", retry_after_ms=1))
                await node.start_partition(0, epoch_floor=node.processors[0].epoch + 1)
            dealers = node.pool.dispatchers
            assert sorted(d.partition for d in dealers) == [0, 1]
            assert node.processors[0].dispatch in dealers  # the new processor's, not a stale one
            spec = TaskSpec(task_id=mint_task_id(0), tenant="t", app="a", task_type="x")
            await node.enqueue([spec])
            leases = await node.poll(
                agent_id="ag", app="a", tenants=["t"], queues=["default"], capacity=4,
                wait_ms=2_000,
            )  # fmt: skip
            assert [lease.task_id for lease in leases] == [spec.task_id]
            assert node.get("t", spec.task_id).status == "LEASED"
        finally:
            await node.stop()

    asyncio.run(main())
