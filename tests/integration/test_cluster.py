"""Nodes of one cluster on Kafka: real ``conveyor node --kafka`` processes share the log's
partitions through the consumer group, hand them over when a node joins or leaves, and the
work of a partition survives its move."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gateway import NodeProcess, call
from test_kafka_node import AGENT, CLIENT, kafka_node, start_agent, stop, wait_registered

from conveyor.streams.log.kafka_broker import KafkaCluster
from conveyor.streams.routing import partition_of

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 4  # NodeProcess's
SETTLE_S = 60.0


def leading(node: NodeProcess) -> dict[int, dict[str, Any]]:
    status, body = call(node.base, "GET", "/healthz", key=None)
    assert status == 200, body
    return {int(p): info for p, info in body["leading"].items()}


def settled(nodes: list[NodeProcess]) -> bool:
    """Every partition led by exactly one of ``nodes``, each caught up."""
    led = [leading(n) for n in nodes]
    owners = [p for node in led for p in node]
    return sorted(owners) == list(range(PARTITIONS)) and all(
        info["caught_up"] for node in led for info in node.values()
    )


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)  # other processes decide: nothing to wait on but their answers


def register_shop(base: str) -> None:
    body = {"agent_id": "setup", "app": "shop", "version": "1", "task_types": ["pack_item"]}
    status, reply = call(base, "POST", "/worker/register", body, key=AGENT)
    assert status == 200, reply


@pytest.fixture
def cluster_name() -> str:
    return f"c{uuid.uuid4().hex[:8]}"


@pytest.fixture
def nodes(
    kafka_cluster: KafkaCluster, tmp_path: Path, cluster_name: str
) -> Iterator[list[NodeProcess]]:
    made = [kafka_node(tmp_path, kafka_cluster.bootstrap, f"n{i}", cluster_name) for i in (1, 2)]
    try:
        yield made
    finally:
        for node in made:
            if node.proc is not None:
                node.stop()


def test_a_joining_node_takes_half_and_a_leaving_one_hands_its_work_back(
    nodes: list[NodeProcess], tmp_path: Path
) -> None:
    n1, n2 = nodes
    n1.start()
    wait_for("n1 to lead every partition", lambda: settled([n1]))
    alone = leading(n1)

    n2.start()
    wait_for("the partitions to be shared", lambda: settled([n1, n2]) and bool(leading(n2)))
    kept, taken = leading(n1), leading(n2)
    assert len(kept) == len(taken) == PARTITIONS // 2
    for p, info in taken.items():  # the new owner's epoch is above the old owner's
        assert info["epoch"] > alone[p]["epoch"], (alone, taken)

    register_shop(n2.base)
    body = {"task_type": "pack_item", "app": "shop", "payload": {"sku": "MUG"}}
    status, reply = call(n2.base, "POST", "/v1/tasks", body, key=CLIENT)
    assert status == 201, reply
    task_id = reply["task_id"]
    assert partition_of(task_id, PARTITIONS) in taken  # an unkeyed task stays on its node

    assert n2.stop() == 0, n2.logs()  # it leaves the group: its partitions come back at once
    n2.proc = None
    wait_for("n1 to lead every partition again", lambda: settled([n1]), timeout_s=20)
    back = leading(n1)
    for p in taken:
        assert back[p]["epoch"] > taken[p]["epoch"]

    agent = start_agent(n1.base, tmp_path / "agent.out")
    try:
        wait_registered(n1.base)
        status, task = call(n1.base, "GET", f"/v1/tasks/{task_id}?wait_ms=30000", key=CLIENT)
        assert status == 200 and task["status"] == "SUCCEEDED", task
        assert task["result"] == {"sku": "MUG", "box": "box-mug"}
    finally:
        stop(agent)


TASKS_PER_NODE = 20
SESSION_S = "6"  # --session-timeout-s: a dead node's partitions move after this long


def cluster_status(bootstrap: str, cluster: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "conveyor.cli", "cluster", "status", "--kafka", bootstrap]
    done = subprocess.run(
        [*cmd, "--cluster", cluster, "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    report: dict[str, Any] = json.loads(done.stdout)
    return report


def enqueue_delayed(base: str, n: int) -> list[str]:
    ids = []
    for i in range(n):
        body = {"task_type": "pack_item", "app": "shop", "payload": {"sku": f"S{i}"}}
        status, reply = call(base, "POST", "/v1/tasks", {**body, "delay_ms": 3_000}, key=CLIENT)
        assert status == 201, reply
        ids.append(reply["task_id"])
    return ids


def test_kill_9_of_a_node_moves_its_partitions_and_every_task_finishes(
    kafka_three: KafkaCluster, tmp_path: Path, cluster_name: str
) -> None:
    bootstrap = kafka_three.bootstrap
    made = [kafka_node(tmp_path, bootstrap, f"n{i}", cluster_name) for i in (1, 2, 3)]
    for node in made:
        node.command = (*node.command, "--session-timeout-s", SESSION_S)
    agents: list[subprocess.Popen[bytes]] = []
    try:
        for node in made:
            node.start()
        wait_for("three nodes to share the partitions", lambda: settled(made))
        for i, node in enumerate(made):
            agents.append(start_agent(node.base, tmp_path / f"agent{i}.out"))
            wait_registered(node.base)
        n1, n2, n3 = made
        report = cluster_status(bootstrap, cluster_name)
        assert sorted(report["nodes"]) == ["n1", "n2", "n3"], report
        victim = set(leading(n2))
        assert {int(p) for p, i in report["partitions"].items() if i["owner"] == "n2"} == victim

        ids = [t for node in made for t in enqueue_delayed(node.base, TASKS_PER_NODE)]
        killed_ms = time.time() * 1000
        assert n2.stop(signal.SIGKILL) == -signal.SIGKILL
        survivors = [n1, n3]
        wait_for("the survivors to lead every partition", lambda: settled(survivors))
        moved_ms = time.time() * 1000

        owner = {p: n for n in survivors for p in leading(n)}
        first_dispatch_ms = []
        for task_id in ids:
            p = partition_of(task_id, PARTITIONS)
            base = owner[p].base
            status, task = call(base, "GET", f"/v1/tasks/{task_id}?wait_ms=30000", key=CLIENT)
            assert status == 200 and task["status"] == "SUCCEEDED", (p, task)
            if p in victim:
                first_dispatch_ms.append(min(a["started_ms"] for a in task["attempts"]))
        assert len(first_dispatch_ms) >= 1  # the killed node held tasks, and they ran
        print(
            f"kill -9 -> partitions moved: {(moved_ms - killed_ms) / 1000:.1f} s; "
            f"-> first dispatch of a moved partition: "
            f"{(min(first_dispatch_ms) - killed_ms) / 1000:.1f} s "
            f"(session timeout {SESSION_S} s, heartbeat 1 s, tasks due 3 s after enqueue)"
        )
        after = cluster_status(bootstrap, cluster_name)
        assert {i["owner"] for i in after["partitions"].values()} <= {"n1", "n3"}, after
    finally:
        for agent in agents:
            stop(agent)
        for node in made:
            if node.proc is not None and node.proc.poll() is None:
                node.stop()
