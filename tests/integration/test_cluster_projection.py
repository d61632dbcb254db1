"""The query snapshot of a cluster on Kafka: each node's Postgres snapshot is fed from every
partition's events, wherever the partition is led, and a partition's move neither loses nor
repeats a task in it. Real ``conveyor node --kafka`` processes with their private PostgreSQL,
a real broker and real agents."""

from __future__ import annotations

import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from test_cluster import enqueue_delayed, leading, settled, wait_for
from test_gateway import NodeProcess, call, stop_orphaned_postgres
from test_kafka_node import CLIENT, kafka_node, start_agent, stop, wait_registered

from conveyor.streams.log.kafka_broker import KafkaCluster
from conveyor.streams.routing import partition_of

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 4  # NodeProcess's
TASKS_PER_NODE = 12
SNAPSHOT_S = 60.0


def projected(node: NodeProcess) -> dict[str, dict[str, Any]]:
    """Every task of the tenant as ``node``'s snapshot lists it, page by page."""
    seen: dict[str, dict[str, Any]] = {}
    cursor = ""
    while True:
        query = f"/v1/tasks?limit=100{f'&cursor={cursor}' if cursor else ''}"
        status, page = call(node.base, "GET", query, key=CLIENT)
        assert status == 200, page
        for task in page["tasks"]:
            assert task["task_id"] not in seen, f"listed twice: {task}"
            seen[task["task_id"]] = task
        cursor = page["next_cursor"] or ""
        if not cursor:
            return seen


def wait_projected(node: NodeProcess, ids: list[str]) -> dict[str, dict[str, Any]]:
    """Until ``node``'s snapshot shows every task of ``ids`` SUCCEEDED."""
    deadline = time.monotonic() + SNAPSHOT_S
    while True:
        rows = projected(node)
        done = {t for t in ids if rows.get(t, {}).get("status") == "SUCCEEDED"}
        if done == set(ids):
            return rows
        if time.monotonic() > deadline:
            missing = {t: rows.get(t, {}).get("status") for t in set(ids) - done}
            raise AssertionError(f"{node.home.name}'s snapshot never caught up: {missing}")
        time.sleep(0.2)  # the projector process decides: nothing to wait on but its rows


def test_every_node_lists_every_partition_and_a_move_loses_or_repeats_nothing(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    cluster = f"c{uuid.uuid4().hex[:8]}"
    made = [kafka_node(tmp_path, kafka_cluster.bootstrap, f"n{i}", cluster) for i in (1, 2)]
    for node in made:  # kafka_node turns the snapshot off; these keep it (private Postgres)
        node.command = tuple(c for c in node.command if c != "--no-projection")
        node.command = (*node.command, "--session-timeout-s", "6")
    agents: list[subprocess.Popen[bytes]] = []
    try:
        for node in made:
            node.start()
        wait_for("two nodes to share the partitions", lambda: settled(made))
        for i, node in enumerate(made):
            agents.append(start_agent(node.base, tmp_path / f"agent{i}.out"))
            wait_registered(node.base)
        n1, n2 = made
        first = [t for node in made for t in enqueue_delayed(node.base, TASKS_PER_NODE)]
        used = {partition_of(t, PARTITIONS) for t in first}
        assert used & set(leading(n1)) and used & set(leading(n2))  # each node holds some

        for node in made:  # each snapshot has the other node's partitions too
            rows = wait_projected(node, first)
            assert {partition_of(t, PARTITIONS) for t in rows} == used

        assert n2.stop(signal.SIGKILL) == -signal.SIGKILL
        stop(agents.pop())
        wait_for("n1 to lead every partition", lambda: settled([n1]))
        second = enqueue_delayed(n1.base, TASKS_PER_NODE)
        rows = wait_projected(n1, first + second)
        for task_id in first + second:  # the snapshot agrees with the owner's state
            status, task = call(n1.base, "GET", f"/v1/tasks/{task_id}", key=CLIENT)
            assert status == 200, task
            row = rows[task_id]
            assert (row["status"], row["attempt"]) == (task["status"], task["attempt"]), (
                row,
                task,
            )
        # Each task ran once: a moved partition's events were not projected twice into a
        # second attempt or a second row (rows are unique per task id: projected() checks).
        assert all(rows[t]["attempt"] == 1 for t in first + second), rows
    finally:
        for agent in agents:
            stop(agent)
        for node in made:
            if node.proc is not None and node.proc.poll() is None:
                node.stop()
            stop_orphaned_postgres(node.home)  # n2's, killed with -9, outlives it
