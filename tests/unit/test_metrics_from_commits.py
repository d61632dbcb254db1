"""The event-derived metrics are fed by the node's processors as they commit (``Metrics.watch``):
each event once, none decoded again from the events log, none counted again by a replay."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from conveyor.schemas.types import Completion, Outcome, TaskSpec
from conveyor.streams.node import Node
from conveyor.streams.routing import mint_task_id
from conveyor.streams.sinks.metrics import Metrics

TASKS = 6


def _finished(metrics: Metrics) -> float | None:
    return metrics.registry.get_sample_value(
        "conveyor_tasks_finished_total", {"queue": "default", "status": "SUCCEEDED"}
    )


def test_commits_feed_the_metrics_once_and_a_replay_feeds_nothing(tmp_path: Path) -> None:
    async def main() -> None:
        node = await Node.open(tmp_path, partitions=2)
        metrics = Metrics()
        metrics.watch(node)
        await node.start()
        try:
            specs = [
                TaskSpec(task_id=mint_task_id(i % 2), tenant="t", app="shop", task_type="email")
                for i in range(TASKS)
            ]
            await node.enqueue(specs)
            leases = []
            while len(leases) < TASKS:
                leases += await node.poll(
                    agent_id="a", app="shop", tenants=[], queues=[], capacity=TASKS, wait_ms=2_000
                )
            await node.complete(
                [
                    Completion(task_id=x.task_id, lease_id=x.lease_id, outcome=Outcome.SUCCEEDED)
                    for x in leases
                ]
            )
            assert _finished(metrics) == TASKS
            dispatched = metrics.registry.get_sample_value(
                "conveyor_dispatched_total", {"tenant": "t"}
            )
            assert dispatched == TASKS
        finally:
            await node.stop()
        # The state lost: a restart rebuilds it by replaying the whole log, and that replay
        # feeds no metrics (its events were seen when first committed).
        shutil.rmtree(tmp_path / "state")
        node = await Node.open(tmp_path, partitions=2)
        again = Metrics()
        again.watch(node)
        await node.start()
        try:
            assert node.get("t", specs[0].task_id).status == "SUCCEEDED"  # replayed
            assert _finished(again) is None
        finally:
            await node.stop()

    asyncio.run(main())
