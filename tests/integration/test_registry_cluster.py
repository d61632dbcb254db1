"""Every node of a cluster reads the same task types and schemas: two real ``conveyor node
--kafka`` processes on a real broker, and an agent registration sent to the node that does NOT
lead the tenant's registry partition (it appends the record to that partition's log and waits
for its mirror, ``streams/registry/catalog.py`` rule 3). Both nodes then know the type and its
defaults, enqueue with them and refuse a payload that does not fit its schema, and a schema
registered through one node is found by id through the other."""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cluster import PARTITIONS, leading, settled, wait_for
from test_gateway import NodeProcess, call
from test_kafka_node import AGENT, CLIENT, kafka_node

from conveyor.streams.log.kafka_broker import KafkaCluster
from conveyor.streams.registry.catalog import registry_partition
from conveyor.streams.routing import partition_for_key

pytestmark = pytest.mark.timeout(180)

ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "sku", "type": "string"}],
}


def until_ok(
    base: str, method: str, path: str, body: object, key: str, meanwhile: tuple[int, ...] = (503,)
) -> dict[str, object]:
    """A node still reading the registry partition answers 503 for a moment (and a node whose
    mirror trails the writer's, 404 for what it has not read yet: ``meanwhile``)."""
    deadline = time.monotonic() + 30
    while True:
        status, reply = call(base, method, path, body, key=key)
        if status in (200, 201):
            return dict(reply) if isinstance(reply, dict) else {"reply": reply}
        assert status in meanwhile and time.monotonic() < deadline, (status, reply)
        time.sleep(0.1)  # another process decides: nothing to wait on but its answers


@contextlib.contextmanager
def two_nodes(
    kafka_cluster: KafkaCluster, tmp_path: Path, prefix: str
) -> Iterator[tuple[NodeProcess, NodeProcess]]:
    """Two nodes of a new cluster on the broker, sharing its partitions; stopped after."""
    cluster = f"{prefix}{uuid.uuid4().hex[:8]}"
    n1, n2 = (kafka_node(tmp_path, kafka_cluster.bootstrap, f"n{i}", cluster) for i in (1, 2))
    try:
        n1.start()
        wait_for("n1 to lead every partition", lambda: settled([n1]))
        n2.start()
        wait_for("the partitions to be shared", lambda: settled([n1, n2]) and bool(leading(n2)))
        yield n1, n2
    finally:
        for node in (n1, n2):
            if node.proc is not None:
                node.stop()


def test_both_nodes_read_the_types_registered_through_either(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    with two_nodes(kafka_cluster, tmp_path, "r") as (n1, n2):
        p = registry_partition("default", PARTITIONS)
        owner, other = (n1, n2) if p in leading(n1) else (n2, n1)
        body = {
            "agent_id": "setup",
            "app": "shop",
            "version": "1",
            "task_types": ["pack_item"],
            "definitions": [
                {
                    "task_type": "pack_item",
                    "queue": "packing",
                    "priority": 6,
                    "payload_schema": ORDER,
                }
            ],
        }
        until_ok(other.base, "POST", "/worker/register", body, AGENT)
        for node in (owner, other):
            # Read through another node than the write's: 404 until its catalog has read it.
            path = "/v1/task-types/shop/pack_item"
            one = until_ok(node.base, "GET", path, None, CLIENT, meanwhile=(503, 404))
            defaults = one["defaults"]
            assert isinstance(defaults, dict) and defaults["queue"] == "packing", one
            enqueue = {"task_type": "pack_item", "app": "shop", "payload": {"sku": "MUG"}}
            created = until_ok(node.base, "POST", "/v1/tasks", enqueue, CLIENT)
            task = call(node.base, "GET", f"/v1/tasks/{created['task_id']}", key=CLIENT)[1]
            assert (task["queue"], task["priority"]) == ("packing", 6), task
            bad = {**enqueue, "payload": {"sku": 7}}
            status, refused = call(node.base, "POST", "/v1/tasks", bad, key=CLIENT)
            assert status == 400 and "payload.sku" in refused["error"]["message"], refused
        schema = {"schema": json.dumps({**ORDER, "name": "Other"})}
        made = until_ok(owner.base, "POST", "/registry/subjects/x-value/versions", schema, CLIENT)
        # Registered through the owner: the other node finds it once its mirror has read it.
        by_id = f"/registry/schemas/ids/{made['id']}"
        got = until_ok(other.base, "GET", by_id, None, CLIENT, meanwhile=(503, 404))
        assert json.loads(str(got["schema"]))["name"] == "Other"


def test_a_deploys_warning_counts_the_unfinished_tasks_of_both_nodes_partitions(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    """A deploy that removes a type warns of its unfinished tasks in every partition: those
    of the node that leads the registry partition and those of the other (asked by a signed
    call between nodes), whichever node the agent registers through."""
    with two_nodes(kafka_cluster, tmp_path, "w") as (n1, n2):
        by_node = {n1.base: set(leading(n1)), n2.base: set(leading(n2))}

        def deploy(via: str, number: int, types: list[str]) -> list[str]:
            body = {"agent_id": "setup", "app": "shop", "version": str(number)}
            reply = until_ok(
                via,
                "POST",
                "/worker/register",
                {**body, "task_types": types, "deploy": number},
                AGENT,
            )
            return list(reply["warnings"])  # type: ignore[call-overload]

        assert deploy(n1.base, 1, ["pack_item", "ship"]) == []
        keys = iter(f"k{i}" for i in range(10_000))
        enqueued = {n1.base: 0, n2.base: 0}
        for base, wanted in ((n1.base, 3), (n2.base, 2)):  # 3 in n1's partitions, 2 in n2's
            while enqueued[base] < wanted:
                key = next(keys)
                if partition_for_key("default", key, PARTITIONS) in by_node[base]:
                    body = {"task_type": "pack_item", "app": "shop", "payload": {"sku": key}}
                    until_ok(n1.base, "POST", "/v1/tasks", {**body, "idempotency_key": key}, CLIENT)
                    enqueued[base] += 1
        for via, number in ((n1.base, 2), (n2.base, 4)):  # through either node
            (warning,) = deploy(via, number, ["ship"])
            assert "task type 'pack_item', referenced by 5 unfinished task(s): " in warning, warning
            assert deploy(via, number + 1, ["pack_item", "ship"]) == []
