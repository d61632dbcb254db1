"""The public task events topics on a real broker: ``conveyor node --kafka --task-events``
relays every tenant's task events to ``<cluster>-task-events.<tenant>``, Avro under the
subject ``<topic>-value`` of the tenant's registry, keyed by task id. confluent-kafka's
``AvroDeserializer`` pointed at the node's registry with the tenant's key reads a task's
events in order; another tenant's events are on its own topic, and its subject is not in the
first tenant's registry."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from test_gateway import NodeProcess, call
from test_ingest import DEADLINE_S, HERE, REPO, wait_for
from test_kafka_node import kafka_node, stop

from conveyor.streams.log.kafka_broker import KafkaCluster
from conveyor.streams.sinks.task_events import topic_of

pytestmark = pytest.mark.timeout(300)

CLIENT = "cvk_kafka-client-0123456789"  # tenant "default"
OTHER = "cvk_events-other-client-0123456789"  # tenant "other:co" (":" is escaped in topic names)
OTHER_AGENT = "cvk_events-other-agent-0123456789"
AGENT = "cvk_events-agent-ingest-0123456789"


@pytest.fixture(scope="module")
def cluster_node(
    kafka_cluster: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[NodeProcess, str]]:
    root = tmp_path_factory.mktemp("task-events")
    cluster = f"t{uuid.uuid4().hex[:8]}"
    proc = kafka_node(root, kafka_cluster.bootstrap, "n1", cluster)
    proc.command = (*proc.command, "--task-events")
    keys = json.loads((proc.home / "keys.json").read_text())
    keys["keys"][AGENT] = {"tenant": "default", "role": "agent", "app": "ingest-shop"}
    keys["keys"][OTHER] = {"tenant": "other:co", "role": "client"}
    keys["keys"][OTHER_AGENT] = {"tenant": "other:co", "role": "agent", "app": "ingest-shop"}
    (proc.home / "keys.json").write_text(json.dumps(keys))
    proc.start()
    cmd = [sys.executable, "-m", "conveyor.cli", "agent", "--app", "ingest_app:app"]
    cmd += ["--url", proc.base, "--api-key", AGENT, "--sandbox", "none", "--poll-wait-s", "1"]
    with open(root / "agent.out", "ab") as out:
        agent = subprocess.Popen(cmd, cwd=HERE, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc, cluster
    finally:
        stop(agent)
        assert proc.stop() == 0, proc.logs()


def enqueue(base: str, key: str, email: str) -> str:
    body = {"app": "ingest-shop", "task_type": "signup", "payload": {"email": email, "seats": 2}}
    found: list[str] = []

    def accepted() -> bool:
        status, reply = call(base, "POST", "/v1/tasks", body, key=key)
        if status == 201:
            found.append(reply["task_id"])
            return True
        assert (status, reply["error"]["code"]) in {
            (400, "unknown_task_type"),
            (503, "unavailable"),
        }
        return False

    wait_for(accepted, "the type's registration")
    return found[0]


def read_events(bootstrap: str, topic: str, base: str, key: str, until: Any) -> list[Any]:
    """The events of ``topic`` decoded by Confluent's deserializer, until ``until(events)``."""
    registry = SchemaRegistryClient({"url": f"{base}/registry", "basic.auth.user.info": f"x:{key}"})
    deserialize = AvroDeserializer(registry)
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex, "enable.auto.commit": False}
    )
    events: list[Any] = []
    try:

        def assigned() -> bool:
            meta = consumer.list_topics(timeout=10).topics.get(topic)
            if meta is None or not meta.partitions:
                return False
            consumer.assign([TopicPartition(topic, p, 0) for p in meta.partitions])
            return True

        wait_for(assigned, f"topic {topic}")

        def read() -> bool:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                ctx = SerializationContext(topic, MessageField.VALUE)
                event = deserialize(message.value(), ctx)
                assert message.key().decode() == event["task_id"]
                events.append(event)
            return bool(until(events))

        wait_for(read, f"the events on {topic}", DEADLINE_S)
        return events
    finally:
        consumer.close()


def test_each_tenant_reads_its_task_events_as_avro_from_its_own_topic(
    cluster_node: tuple[NodeProcess, str], kafka_cluster: KafkaCluster
) -> None:
    node, cluster = cluster_node
    bootstrap = kafka_cluster.bootstrap
    task_id = enqueue(node.base, CLIENT, "a@example.com")
    topic = topic_of(cluster, "default")
    events = read_events(
        bootstrap,
        topic,
        node.base,
        CLIENT,
        lambda seen: any(e["task_id"] == task_id and e["kind"] == "TaskSucceeded" for e in seen),
    )
    mine = [e for e in events if e["task_id"] == task_id]
    kinds = [e["kind"] for e in mine]
    assert kinds[0] == "TaskEnqueued" and kinds[-1] == "TaskSucceeded", kinds
    assert "TaskLeased" in kinds
    assert [e["version"] for e in mine] == sorted(e["version"] for e in mine)  # in order
    assert {e["tenant"] for e in events} == {"default"}
    assert mine[-1]["app"] == "ingest-shop" and mine[-1]["queue"] == "signups"

    # Another tenant: its own topic and subject, never in the first tenant's.
    register = {"agent_id": "x", "app": "ingest-shop", "task_types": ["signup"]}
    assert call(node.base, "POST", "/worker/register", register, key=OTHER_AGENT)[0] == 200
    other_id = enqueue(node.base, OTHER, "b@example.com")
    other_topic = topic_of(cluster, "other:co")
    assert other_topic == f"{cluster}-task-events.other_3aco"
    theirs = read_events(
        bootstrap,
        other_topic,
        node.base,
        OTHER,
        lambda seen: any(e["task_id"] == other_id for e in seen),
    )
    assert {e["tenant"] for e in theirs} == {"other:co"}
    status, subjects = call(node.base, "GET", "/registry/subjects", key=CLIENT)
    assert status == 200 and f"{topic}-value" in subjects and f"{other_topic}-value" not in subjects
    status, subjects = call(node.base, "GET", "/registry/subjects", key=OTHER)
    assert f"{other_topic}-value" in subjects and f"{topic}-value" not in subjects
    assert not any(
        e["task_id"] == other_id
        for e in read_events(
            bootstrap, topic, node.base, CLIENT, lambda seen: len(seen) >= len(events)
        )
    )


def test_the_faust_example_reacts_to_terminal_states(
    cluster_node: tuple[NodeProcess, str], kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    import faust  # noqa: F401  (make test installs it: a missing faust fails, never skips)

    node, cluster = cluster_node
    env = {
        **os.environ,
        "CONVEYOR_KAFKA": kafka_cluster.bootstrap,
        "CONVEYOR_CLUSTER": cluster,
        "CONVEYOR_TENANT": "default",
        "CONVEYOR_URL": node.base,
        "CONVEYOR_API_KEY": CLIENT,
        "CONVEYOR_FAUST_APP": f"faust-{uuid.uuid4().hex[:8]}",
    }
    out = tmp_path / "faust.out"
    cmd = [sys.executable, "-m", "examples.task_events_faust"]
    cmd += ["--datadir", str(tmp_path / "faust-data"), "worker", "-l", "warn"]
    with open(out, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        task_id = enqueue(node.base, CLIENT, "faust@example.com")

        def ended() -> list[dict[str, Any]]:
            assert proc.poll() is None, out.read_text()
            # Faust's worker logs what an agent prints: "[time] [pid] [WARNING] {...}"
            text = out.read_text().splitlines()
            lines = [json.loads(x[x.index("{") :]) for x in text if '{"task_id"' in x]
            return [x for x in lines if x["task_id"] == task_id]

        wait_for(ended, "the example's line for the task")
        assert ended() == [{"task_id": task_id, "task_type": "signup", "kind": "TaskSucceeded"}]
    finally:
        stop(proc)
