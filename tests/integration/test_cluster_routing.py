"""Any node of a cluster takes any request, and one agent works for every node.

Two real ``conveyor node --kafka`` processes on a real broker share the log's partitions; one
real ``conveyor agent`` is pointed at node 1 only. Tasks enqueued through one node for
partitions the other leads are acknowledged (forwarded to the owner, never a 503), read back
through either node, and run by that agent, which polls both nodes with its two slots and
never holds more than two leases at once. When node 2 is killed, the agent keeps working
with node 1, which takes node 2's partitions.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_cluster import leading, settled, wait_for
from test_cluster_forwarding import shared
from test_gateway import NodeProcess, call
from test_kafka_node import kafka_node, stop

from conveyor.streams.log.kafka_broker import KafkaCluster
from conveyor.streams.routing import partition_for_key, partition_of

pytestmark = pytest.mark.timeout(180)

PARTITIONS = 4  # NodeProcess's
CLIENT = "cvk_routing-client-0123456789"
AGENT = "cvk_routing-agent-0123456789"
KEYS = {
    CLIENT: {"tenant": "default", "role": "client"},
    AGENT: {"tenant": "default", "role": "agent", "app": "routing"},
}
HERE = Path(__file__).resolve().parent  # routing_app is imported from here
HOLD_MS = 300
PER_NODE = 4  # tasks per (node enqueued through, node that owns them)
TIMED = 9  # enqueues timed per path (the median is printed)


def key_for(partitions: set[int], taken: set[str]) -> str:
    """An idempotency key of tenant ``default`` that routes to one of ``partitions``."""
    for i in range(10_000):
        key = f"k{i}"
        if key not in taken and partition_for_key("default", key, PARTITIONS) in partitions:
            taken.add(key)
            return key
    raise AssertionError(f"no key routes to {partitions}")


def enqueue(base: str, key: str, log: Path, status_wanted: int = 201) -> dict[str, Any]:
    payload = {"log": str(log), "ms": HOLD_MS, "key": key}
    body = {"task_type": "hold", "app": "routing", "payload": payload, "idempotency_key": key}
    status, reply = call(base, "POST", "/v1/tasks", body, key=CLIENT)
    assert status == status_wanted, (status, reply)  # never a 503 not_owner
    return dict(reply)


def finished(base: str, task_id: str) -> dict[str, Any]:
    status, task = call(base, "GET", f"/v1/tasks/{task_id}?wait_ms=30000", key=CLIENT, timeout=60)
    assert status == 200, task
    return dict(task)


def most_at_once(log: Path) -> int:
    marks = sorted(
        (float(t), sign) for sign, t, _ in (line.split() for line in log.read_text().splitlines())
    )
    now = most = 0
    for _, sign in marks:  # at one instant a start sorts first: a tie counts as overlap
        now += 1 if sign == "+" else -1
        most = max(most, now)
    return most


def timed_ms(owner: str, other: str, partitions: set[int], taken: set[str], log: Path) -> str:
    """Median times of ``TIMED`` keyed enqueues for ``partitions`` through their owner and
    through the other node, interleaved (the load of the moment falls on both alike)."""
    took: dict[str, list[float]] = {owner: [], other: []}
    for _ in range(TIMED):
        for base in (owner, other):
            key = key_for(partitions, taken)
            started = time.perf_counter()
            enqueue(base, key, log)
            took[base].append((time.perf_counter() - started) * 1000)
    direct, forwarded = (sorted(took[b])[TIMED // 2] for b in (owner, other))
    return (
        f"keyed enqueue, median of {TIMED}: through the owner {direct:.1f} ms, "
        f"forwarded by the other node {forwarded:.1f} ms"
    )


def hop_once(base: str, task_id: str) -> None:
    """A request already forwarded once is never forwarded again: the node that does not lead
    its partition says so (503, Conveyor-Not-Owner), and the owner did nothing."""
    request = urllib.request.Request(f"{base}/v1/tasks/{task_id}")
    request.add_header("Authorization", f"Bearer {CLIENT}")
    request.add_header("Conveyor-Forwarded", "test")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    assert refused.value.code == 503 and refused.value.headers["Conveyor-Not-Owner"] == "1"
    assert refused.value.headers["Retry-After"]
    assert json.loads(refused.value.read())["error"]["code"] == "unavailable"


def ran(log: Path) -> set[str]:
    return {line.split()[2] for line in log.read_text().splitlines() if line.startswith("-")}


def start_agent(base: str, out: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "conveyor.cli", "agent", "--app", "routing_app:app"]
    cmd += ["--url", base, "--api-key", AGENT, "--sandbox", "none", "--poll-wait-s", "1"]
    cmd += ["--concurrency", "2", "--prefetch", "0", "--heartbeat-s", "1"]
    with open(out, "ab") as log:
        return subprocess.Popen(cmd, cwd=HERE, stdout=log, stderr=subprocess.STDOUT)


def registered(base: str) -> bool:
    """The agent registered ``hold`` with this node (it refuses unknown types)."""
    body = {"task_type": "hold", "app": "routing", "payload": {}, "delay_ms": 3_600_000}
    status, reply = call(base, "POST", "/v1/tasks:batch", {"tasks": [body]}, key=CLIENT)
    assert status in (201, 400, 503), reply  # 503: the node is still starting
    return status == 201


@pytest.fixture
def nodes(kafka_cluster: KafkaCluster, tmp_path: Path) -> Iterator[list[NodeProcess]]:
    cluster = f"r{uuid.uuid4().hex[:8]}"
    made = [kafka_node(tmp_path, kafka_cluster.bootstrap, f"n{i}", cluster) for i in (1, 2)]
    for node in made:
        (node.home / "keys.json").write_text(json.dumps({"keys": KEYS}))
        node.command = (*node.command, "--session-timeout-s", "6")
    try:
        yield made
    finally:
        for node in made:
            if node.proc is not None and node.proc.poll() is None:
                node.stop()


def test_any_node_serves_any_partition_and_one_agent_works_for_both(
    nodes: list[NodeProcess], tmp_path: Path
) -> None:
    n1, n2 = nodes
    for node in nodes:
        node.start()
    # Every node's directory too: its cards trail /healthz by up to a publish interval, and
    # a request in between is a 503 (forward.py rule 1).
    wait_for("two nodes to share the partitions", lambda: shared(nodes, AGENT))
    owned = {n1.base: set(leading(n1)), n2.base: set(leading(n2))}
    log = tmp_path / "runs.log"
    log.touch()
    agent = start_agent(n1.base, tmp_path / "agent.out")
    try:
        wait_for(
            "the agent to register with both nodes",
            lambda: all(map(registered, [n1.base, n2.base])),
        )
        taken: set[str] = set()
        tasks: list[tuple[str, str]] = []  # (task id, the base of its owner)
        for via, owner in ((n2, n1), (n1, n2)):  # through one node, for the other's partitions
            for _ in range(PER_NODE):
                reply = enqueue(via.base, key_for(owned[owner.base], taken), log)
                assert partition_of(reply["task_id"], PARTITIONS) in owned[owner.base]
                tasks.append((reply["task_id"], owner.base))

        # A batch through n1 with items of both nodes: split per owner, replies in order.
        keys = [key_for(owned[b], taken) for b in (n2.base, n1.base, n2.base)]
        items = [
            {
                "task_type": "hold",
                "app": "routing",
                "idempotency_key": k,
                "payload": {"log": str(log), "ms": HOLD_MS, "key": k},
            }
            for k in keys
        ]
        status, reply = call(n1.base, "POST", "/v1/tasks:batch", {"tasks": items}, key=CLIENT)
        assert status == 201, reply
        for k, result in zip(keys, reply["results"], strict=True):
            p = partition_for_key("default", k, PARTITIONS)
            assert partition_of(result["task_id"], PARTITIONS) == p
            tasks.append((result["task_id"], n1.base if p in owned[n1.base] else n2.base))
        again = enqueue(n2.base, keys[1], log, 200)  # a resent key answers its task, via any node
        assert again["task_id"] == reply["results"][1]["task_id"] and not again["created"]

        print(timed_ms(n1.base, n2.base, owned[n1.base], taken, log))
        hop_once(n2.base, tasks[0][0])
        for task_id, owner in tasks:  # read back through the other node, then the owner
            other = n2.base if owner == n1.base else n1.base
            task = finished(other, task_id)
            assert task["status"] == "SUCCEEDED", task
            assert finished(owner, task_id)["status"] == "SUCCEEDED"
        ids = {t for t, _ in tasks}
        assert ids <= ran(log)
        by_owner = {owner for _, owner in tasks}
        assert by_owner == {n1.base, n2.base}  # the one agent ran tasks led by each node
        assert most_at_once(log) <= 2, log.read_text()

        # Node 2 dies: its partitions move to node 1, and the agent keeps working with it.
        assert n2.stop(signal.SIGKILL) == -signal.SIGKILL
        wait_for("n1 to lead every partition", lambda: settled([n1]), timeout_s=60)
        late = [enqueue(n1.base, key_for(owned[n2.base], taken), log)["task_id"] for _ in range(3)]
        for task_id in late:
            assert finished(n1.base, task_id)["status"] == "SUCCEEDED"
        assert agent.poll() is None, (tmp_path / "agent.out").read_text()
        assert most_at_once(log) <= 2
    finally:
        stop(agent)
