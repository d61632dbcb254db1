"""What a cluster forwards, and to whom: two real ``conveyor node --kafka`` processes on a real
broker.

- A registration sent to the node that does not lead the tenant's registry partition reaches
  its leader; the task types are known through both nodes.
- A retry of listed tasks led by both nodes, sent to one, retries each on its owner, answered
  in the order asked.
- Cards written to ``<cluster>-nodes`` by someone without the cluster's secret (one naming a
  trap URL as the owner of every partition at a huge epoch, one forging node 2's card) are
  ignored: no request, and so no bearer key, ever reaches the trap; agents are not told
  about it; ``conveyor cluster status`` with the secret shows the refusal.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import test_gateway
from aiokafka import AIOKafkaProducer
from test_cluster import PARTITIONS, cluster_name, leading, nodes, settled, wait_for  # noqa: F401
from test_gateway import NodeProcess, call
from test_kafka_node import AGENT, CLIENT, CLUSTER_SECRET, kafka_node

from conveyor.streams.cluster.directory import topic_of
from conveyor.streams.cluster.signing import ClusterSecret, sign
from conveyor.streams.log.kafka_broker import KafkaCluster
from conveyor.streams.registry.catalog import registry_partition
from conveyor.streams.routing import partition_for_key, partition_of

pytestmark = pytest.mark.timeout(240)

TYPES = ["pack_item", "flaky"]


def shared(made: list[NodeProcess], agent_key: str = AGENT) -> bool:
    """Every partition led by one of ``made``, each leading some, and every node's directory
    (``GET /worker/nodes``, from the cards: up to a publish interval behind) saying so."""
    if not settled(made) or not all(leading(n) for n in made):
        return False
    truth = {n.base: sorted(leading(n)) for n in made}
    for node in made:
        status, listed = call(node.base, "GET", "/worker/nodes", key=agent_key)
        assert status == 200, listed
        if {n["url"]: n["partitions"] for n in listed["nodes"]} != truth:
            return False
    return True


def worker(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    status, reply = call(base, "POST", path, body, key=AGENT)
    assert status == 200, (path, reply)
    return dict(reply)


def register(base: str, task_types: list[str]) -> None:
    body = {"agent_id": "test", "app": "shop", "version": "1", "task_types": task_types}
    assert worker(base, "/worker/register", body) == {"warnings": []}


def known_at(base: str, task_type: str) -> bool:
    """Whether ``base`` takes an enqueue of ``task_type`` (delayed an hour: never dealt)."""
    body = {"task_type": task_type, "app": "shop", "payload": {}, "delay_ms": 3_600_000}
    status, reply = call(base, "POST", "/v1/tasks", body, key=CLIENT)
    assert status in (201, 400, 503), reply  # 400: not known yet; 503: a partition moving
    return status == 201


def key_on(partitions: set[int], skip: int = 0) -> str:
    found = (f"k{i}" for i in range(10_000))
    keys = [k for k in found if partition_for_key("default", k, PARTITIONS) in partitions]
    return keys[skip]


def dead_letter(via: str, owner: str, key: str) -> str:
    """A ``flaky`` task enqueued through ``via``, leased from ``owner`` and failed for good."""
    body = {"task_type": "flaky", "app": "shop", "payload": {}, "idempotency_key": key}
    body["retry"] = {"attempts_max": 1}
    status, created = call(via, "POST", "/v1/tasks", body, key=CLIENT)
    assert status == 201, created
    poll = {"agent_id": "test", "app": "shop", "queues": [], "capacity": 1, "wait_ms": 10_000}
    deadline = time.monotonic() + 30
    leases: list[dict[str, Any]] = []
    while not leases and time.monotonic() < deadline:
        leases = worker(owner, "/worker/poll", {**poll, "lease_ms": 30_000})["leases"]
    (lease,) = leases
    assert lease["task_id"] == created["task_id"]
    failed = {"task_id": lease["task_id"], "lease_id": lease["lease_id"], "outcome": "FAILED"}
    failed["error"] = {"class": "Boom", "message": "failed on purpose"}
    assert worker(owner, "/worker/complete", {"completions": [failed]})["results"][0]["ok"]
    return str(created["task_id"])


class Trap:
    """An HTTP server on 127.0.0.1 that records every request made to it."""

    def __init__(self) -> None:
        seen: list[tuple[str, str | None]] = []
        self.seen = seen

        class Handler(BaseHTTPRequestHandler):
            def _record(self) -> None:
                seen.append((self.path, self.headers.get("Authorization")))
                self.send_response(200)
                self.end_headers()
                self.wfile.write(b"{}")

            do_GET = do_POST = _record

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def trap() -> Iterator[Trap]:
    made = Trap()
    try:
        yield made
    finally:
        made.close()


async def forge(bootstrap: str, cluster: str, trap_url: str) -> None:
    """Write what an intruder with access to the broker could: an unsigned card claiming every
    partition, and node 2's card re-signed with a wrong secret."""
    leading_all = {str(p): {"epoch": 2**50, "lag_records": 0} for p in range(PARTITIONS)}
    evil = {"node_id": "evil", "url": trap_url, "ts_ms": int(time.time() * 1000)}
    wrong = ClusterSecret("not-the-cluster-secret-0123").card_key(cluster)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        topic = topic_of(cluster)
        await producer.send_and_wait(
            topic, json.dumps({**evil, "leading": leading_all}).encode(), key=b"evil"
        )
        fake_n2 = {**evil, "node_id": "n2", "leading": leading_all}
        await producer.send_and_wait(topic, sign(fake_n2, wrong), key=b"n2")
    finally:
        await producer.stop()


def test_registrations_and_retries_reach_the_owners_and_forged_cards_reach_nobody(
    nodes: list[NodeProcess],  # noqa: F811 (the fixture)
    kafka_cluster: KafkaCluster,
    cluster_name: str,  # noqa: F811 (the fixture)
    trap: Trap,
) -> None:
    n1, n2 = nodes
    for node in nodes:
        node.start()
    wait_for("two nodes to share the partitions", lambda: shared(nodes))
    owned = {n1.base: set(leading(n1)), n2.base: set(leading(n2))}
    by_partition = {p: base for base, ps in owned.items() for p in ps}

    # A registration through the node that does not lead the registry partition.
    owner = by_partition[registry_partition("default", PARTITIONS)]
    other = n2.base if owner == n1.base else n1.base
    register(other, TYPES)
    for base in (n1.base, n2.base):
        wait_for(f"{base} to know the types", lambda base=base: known_at(base, "flaky"))

    # A retry through n1 of dead letters led by n2 and by n1.
    on_n2 = dead_letter(n1.base, n2.base, key_on(owned[n2.base]))
    on_n1 = dead_letter(n1.base, n1.base, key_on(owned[n1.base]))
    asked = [on_n2, on_n1]
    status, reply = call(n1.base, "POST", "/v1/tasks:retry", {"task_ids": asked}, key=CLIENT)
    assert status == 200, reply
    assert [r["task_id"] for r in reply["retried"]] == asked, reply
    for r in reply["retried"]:
        owner_base = by_partition[partition_of(r["task_id"], PARTITIONS)]
        status, task = call(owner_base, "GET", f"/v1/tasks/{r['new_task_id']}", key=CLIENT)
        assert status == 200 and task["status"] == "ENQUEUED", task
    status, again = call(n2.base, "POST", "/v1/tasks:retry", {"task_ids": asked}, key=CLIENT)
    assert status == 200 and again["retried"] == [], again  # each was retried once

    # Forged cards: both nodes see and refuse them, and keep forwarding to the real owner.
    asyncio.run(forge(kafka_cluster.bootstrap, cluster_name, trap.url))
    refused = "is not signed with this cluster's secret"
    wait_for(
        "both nodes to refuse the forged cards",
        lambda: all(n.logs().count(refused) >= 2 for n in nodes),
    )
    for i in range(3):  # n2 publishes its own card again within a second: still n2's URL
        key = key_on(owned[n2.base], skip=1 + i)
        body = {"task_type": "pack_item", "app": "shop", "payload": {}, "idempotency_key": key}
        status, created = call(n1.base, "POST", "/v1/tasks", body, key=CLIENT)
        assert status == 201, created
        assert partition_of(created["task_id"], PARTITIONS) in owned[n2.base]
    status, listed = call(n1.base, "GET", "/worker/nodes", key=AGENT)
    assert status == 200, listed
    assert {n["node_id"]: n["url"] for n in listed["nodes"]} == {"n1": n1.base, "n2": n2.base}
    assert trap.seen == []  # not one request, not one key

    env = {**os.environ, "CONVEYOR_CLUSTER_SECRET": CLUSTER_SECRET}
    cmd = [sys.executable, "-m", "conveyor.cli", "cluster", "status", "--json"]
    cmd += ["--kafka", kafka_cluster.bootstrap, "--cluster", cluster_name]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env, check=True)
    report = json.loads(done.stdout)
    assert sorted(report["nodes"]) == ["n1", "n2"] and report["refused_cards"] == ["evil"]
    assert {info["owner"] for info in report["partitions"].values()} == {"n1", "n2"}
    assert CLUSTER_SECRET not in done.stdout + done.stderr + n1.logs() + n2.logs()


@pytest.mark.parametrize(
    ("secret", "says"),
    [
        (None, "--kafka needs the cluster's secret: set CONVEYOR_CLUSTER_SECRET"),
        ("too-short-1234", "the cluster secret has 14 characters; give at least 16"),
    ],
)
def test_a_node_on_kafka_without_a_good_secret_stops_before_it_starts(
    tmp_path: Path, secret: str | None, says: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_CLUSTER_SECRET"}
    if secret is not None:
        env["CONVEYOR_CLUSTER_SECRET"] = secret
    cmd = [sys.executable, "-m", "conveyor.cli", "node", "--home", str(tmp_path / "home")]
    cmd += ["--kafka", "127.0.0.1:1", "--node-id", "n1"]  # never reached: the secret fails first
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode != 0
    assert says in done.stderr + done.stdout, done.stderr
    assert secret is None or secret not in done.stderr + done.stdout
    assert not (tmp_path / "home" / "state").exists()  # nothing was opened


def failed_listed(base: str, ids: list[str]) -> bool:
    """Whether ``base``'s snapshot lists every task of ``ids`` FAILED."""
    status, page = call(base, "GET", "/v1/tasks?status=FAILED&limit=100", key=CLIENT)
    assert status == 200, page
    return set(ids) <= {t["task_id"] for t in page["tasks"]}


def test_a_bulk_retry_started_at_one_node_retries_the_dead_letters_every_node_leads(
    kafka_cluster: KafkaCluster,
    tmp_path: Path,
    cluster_name: str,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(test_gateway, "START_TIMEOUT_S", 90.0)  # a private Postgres each
    made = [kafka_node(tmp_path, kafka_cluster.bootstrap, f"n{i}", cluster_name) for i in (1, 2)]
    for node in made:  # the projection on: a bulk operation selects from it
        node.command = tuple(c for c in node.command if c != "--no-projection")
    n1, n2 = made
    try:
        for node in made:
            node.start()
        wait_for("two nodes to share the partitions", lambda: shared(made), timeout_s=90)
        owned = {n1.base: set(leading(n1)), n2.base: set(leading(n2))}
        register(n1.base, TYPES)
        for node in made:
            wait_for(f"{node.home.name} to know them", lambda n=node: known_at(n.base, "flaky"))
        dead = [
            dead_letter(n1.base, n2.base, key_on(owned[n2.base])),
            dead_letter(n1.base, n1.base, key_on(owned[n1.base])),
        ]
        wait_for("n1's snapshot to list them", lambda: failed_listed(n1.base, dead), 60)

        body = {"filter": {"status": ["FAILED"], "task_type": "flaky"}}
        status, op = call(n1.base, "POST", "/v1/tasks:retry", body, key=CLIENT)
        assert status == 202, op
        path = f"/v1/operations/{op['operation_id']}"

        def finished() -> bool:
            status, got = call(n1.base, "GET", path, key=CLIENT)
            assert status == 200 and got["state"] != "failed", got
            op.update(got)
            return bool(got["state"] == "done")

        wait_for("the operation to finish", finished, 60)
        assert (op["matched"], op["done"], op["changed"]) == (2, 2, 2), op
        status, again = call(n2.base, "POST", "/v1/tasks:retry", {"task_ids": dead}, key=CLIENT)
        assert status == 200 and again["retried"] == [], again  # both were retried, once
    finally:
        for node in made:
            if node.proc is not None and node.proc.poll() is None:
                node.stop()
