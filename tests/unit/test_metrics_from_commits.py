"""The event-derived metrics are fed by the node's processors as they commit (``Metrics.watch``):
each event once, none decoded again from the events log, none counted again by a replay."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

from conveyor.schemas.types import Completion, EventKind, Outcome, TaskEvent, TaskSpec
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


def event(kind: EventKind, task_id: str, status: str, ts_ms: int, tenant: str = "t") -> TaskEvent:
    return TaskEvent(
        kind=kind, task_id=task_id, tenant=tenant, app="shop", task_type="email", queue="q",
        status=status, attempt=1, ts_ms=ts_ms, version=ts_ms,
    )  # fmt: skip


def test_one_batch_folds_into_every_event_metric() -> None:
    metrics = Metrics()
    t0 = 1_700_000_000_000
    metrics.observe_events(
        3,
        [
            event(EventKind.TaskEnqueued, "a", "ENQUEUED", t0),
            event(EventKind.TaskEnqueued, "b", "ENQUEUED", t0),
            event(EventKind.TaskLeased, "a", "LEASED", t0 + 5),
            event(EventKind.TaskSucceeded, "a", "SUCCEEDED", t0 + 9),
            event(EventKind.LeaseExpired, "c", "LEASED", t0 + 9, tenant="u"),
            event(EventKind.TaskRequeued, "d", "FAILED", t0 + 9),  # a dead letter retried
            event(EventKind.TaskCanceled, "b", "CANCELED", t0 + 9),
        ],
    )
    metrics.observe_events(3, [event(EventKind.TaskLeased, "b", "LEASED", t0 + 20)])
    sample = metrics.registry.get_sample_value
    assert sample("conveyor_tasks_finished_total", {"queue": "q", "status": "SUCCEEDED"}) == 1
    assert sample("conveyor_tasks_finished_total", {"queue": "q", "status": "CANCELED"}) == 1
    assert sample("conveyor_tasks_finished_total", {"queue": "q", "status": "FAILED"}) is None
    assert sample("conveyor_dispatched_total", {"tenant": "t"}) == 2
    assert sample("conveyor_lease_expired_total", {"partition": "3"}) == 1
    labels = {"partition": "3", "queue": "q"}
    # a waited 5 ms; b was canceled before its (late) lease: its ready time was forgotten
    assert sample("conveyor_schedule_to_start_seconds_count", labels) == 1
    assert sample("conveyor_schedule_to_start_seconds_sum", labels) == 0.005
    assert metrics.dispatch_window.counts(t0 + 20) == {"t": 2}
