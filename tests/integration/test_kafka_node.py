"""One ``conveyor node --kafka`` owning every partition of its cluster, with a real broker and
a real ``conveyor agent``: the README's example app runs end to end on the Kafka log."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gateway import NodeProcess, call

import conveyor
from conveyor.streams.log.kafka_broker import KafkaCluster
from examples import shop

pytestmark = pytest.mark.timeout(180)

CLIENT = "cvk_kafka-client-0123456789"
AGENT = "cvk_kafka-agent-shop-0123456789"
KEYS = {
    CLIENT: {"tenant": "default", "role": "client"},
    AGENT: {"tenant": "default", "role": "agent", "app": "shop"},
}
REPO = Path(__file__).resolve().parents[2]  # examples.shop is imported from here
RESULT_S = 60.0
CLUSTER_SECRET = "test-cluster-secret-0123456789"  # the same for every node of a test


def kafka_node(root: Path, bootstrap: str, node_id: str, cluster: str) -> NodeProcess:
    home = root / node_id
    home.mkdir(parents=True)
    (home / "keys.json").write_text(json.dumps({"keys": KEYS}))
    command = ("node", "--kafka", bootstrap, "--node-id", node_id, "--cluster", cluster)
    return NodeProcess(home, (*command, "--cluster-secret", CLUSTER_SECRET, "--no-projection"))


def start_agent(base: str, out: Path) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "conveyor.cli", "agent", "--app", "examples.shop:app"]
    cmd += ["--url", base, "--api-key", AGENT, "--sandbox", "none", "--poll-wait-s", "1"]
    with open(out, "ab") as log:
        return subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)


def wait_registered(base: str) -> None:
    """Until the agent has registered the shop's task types with the node."""
    deadline = time.monotonic() + RESULT_S
    body = {"task_type": "pack_item", "app": "shop", "payload": {"sku": "X"}}
    while time.monotonic() < deadline:
        status, reply = call(base, "POST", "/v1/tasks", body, key=CLIENT)
        if status == 201:
            return
        # 400 unknown_task_type: the agent has not registered yet; 503: the node is still
        # taking the partitions (the tenant's registry partition among them), try again.
        not_yet = (400, "unknown_task_type"), (503, "unavailable")
        assert (status, reply["error"]["code"]) in not_yet, reply
        time.sleep(0.1)  # the agent process is starting: nothing to wait on but its calls
    raise AssertionError("the agent never registered the shop's task types")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
def node(kafka_cluster: KafkaCluster, tmp_path: Path) -> Iterator[NodeProcess]:
    cluster = f"t{uuid.uuid4().hex[:8]}"
    proc = kafka_node(tmp_path, kafka_cluster.bootstrap, "n1", cluster)
    proc.start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def test_the_shop_example_runs_on_a_node_whose_log_is_kafka(
    node: NodeProcess, tmp_path: Path
) -> None:
    agent = start_agent(node.base, tmp_path / "agent.out")
    try:
        wait_registered(node.base)
        with conveyor.Client(node.base, CLIENT) as client:
            charged = client.enqueue(shop.charge_card, {"order": 1, "amount": 1999})
            failed = client.enqueue(shop.import_catalog, {"url": "s3://feeds/catalog.csv"})
            order = {"order": 2, "amount": 4200, "items": ["MUG", "TEE"]}
            fulfilled = client.enqueue(shop.fulfil_order, order)
            assert charged.result(timeout=RESULT_S)["attempts"] == 3
            with pytest.raises(conveyor.TaskFailed) as err:
                failed.result(timeout=RESULT_S)
            assert err.value.error_class == "FatalError"
            result = fulfilled.result(timeout=RESULT_S)
            assert [b["box"] for b in result["boxes"]] == ["box-mug", "box-tee"]
            assert charged.get().status == "SUCCEEDED"
    finally:
        stop(agent)
    status, health = call(node.base, "GET", "/healthz", key=None)
    assert status == 200 and health["partitions"] == 4, health
