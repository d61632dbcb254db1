"""The ingest topic on a real broker: a ``conveyor node --kafka``, a real ``conveyor agent``
whose typed handler registers the payload's Avro schema, and ``conveyor ingest`` as its own
process. confluent-kafka's ``AvroSerializer`` pointed at the node's registry produces; the
tasks run. Hostile records are quarantined with their reason and source offset while the
good ones behind them are enqueued; a router killed with SIGKILL mid-stream and started
again enqueues every record exactly once."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from test_gateway import NodeProcess, call
from test_kafka_node import kafka_node, stop

from conveyor.streams.ingest import wire
from conveyor.streams.log.kafka_broker import KafkaCluster

pytestmark = pytest.mark.timeout(300)

CLIENT = "cvk_kafka-client-0123456789"  # test_kafka_node's keys.json
REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).parent
APP = "ingest-shop"
SUBJECT = f"{APP}.signup-value"
DEADLINE_S = 90.0


@pytest.fixture(scope="module")
def node(
    kafka_cluster: KafkaCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    root = tmp_path_factory.mktemp("ingest")
    proc = kafka_node(root, kafka_cluster.bootstrap, "n1", f"t{uuid.uuid4().hex[:8]}")
    agent_key = "cvk_kafka-agent-ingest-0123456789"
    keys = json.loads((proc.home / "keys.json").read_text())
    keys["keys"][agent_key] = {"tenant": "default", "role": "agent", "app": APP}
    (proc.home / "keys.json").write_text(json.dumps(keys))
    proc.start()
    cmd = [sys.executable, "-m", "conveyor.cli", "agent", "--app", "ingest_app:app"]
    cmd += ["--url", proc.base, "--api-key", agent_key, "--sandbox", "none", "--poll-wait-s", "1"]
    with open(root / "agent.out", "ab") as out:
        agent = subprocess.Popen(cmd, cwd=HERE, stdout=out, stderr=subprocess.STDOUT)
    try:
        wait_for(lambda: registry(proc.base, f"/subjects/{SUBJECT}/versions")[0] == 200)
        yield proc
    finally:
        stop(agent)
        assert proc.stop() == 0, proc.logs()


def wait_for(done: Any, what: str = "the condition", deadline_s: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.1)  # other processes are working: nothing to wait on but their results
    raise AssertionError(f"{what} did not happen within {deadline_s}s")


def registry(base: str, path: str) -> tuple[int, Any]:
    return call(base, "GET", f"/registry{path}", key=CLIENT)


def serializer(base: str, subject: str = SUBJECT) -> AvroSerializer:
    """Confluent's serializer against the node's registry, with the newest schema of
    ``subject`` (a task type's payload schema, which its agent registered)."""
    client = SchemaRegistryClient(
        {"url": f"{base}/registry", "basic.auth.user.info": f"x:{CLIENT}"}
    )
    schema = client.get_latest_version(subject).schema.schema_str
    use: dict[str, Any] = {"auto.register.schemas": False, "use.latest.version": True}
    use["subject.name.strategy"] = lambda ctx, name: subject
    return AvroSerializer(client, schema, conf=use)


HEADERS = [("conveyor-app", APP.encode()), ("conveyor-task-type", b"signup")]


def produce(bootstrap: str, topic: str, records: list[tuple[bytes | None, bytes, Any]]) -> None:
    """Produce ``records`` to partition 0 of ``topic``, each acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    failed: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            failed.append(error)

    for key, value, headers in records:
        producer.produce(topic, value, key, partition=0, headers=headers, on_delivery=delivered)
    assert producer.flush(30) == 0 and not failed, failed


def router(
    node: NodeProcess, bootstrap: str, topic: str, out: Path, *extra: str
) -> subprocess.Popen[bytes]:
    """``conveyor ingest`` on ``topic``, once it has created its topics and reads."""
    cmd = [sys.executable, "-m", "conveyor.cli", "ingest", "--kafka", bootstrap, "--topic", topic]
    cmd += ["--url", node.base, "--api-key", CLIENT, "--instance", "r1", "--partitions", "2"]
    cmd += ["--log-level", "info", *extra]
    start = out.stat().st_size if out.exists() else 0
    with open(out, "ab") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT)

    def reading() -> bool:
        assert proc.poll() is None, out.read_text()
        return "Setting newly assigned partitions" in out.read_text()[start:]

    wait_for(reading, "the router's start")
    return proc


def quarantined(bootstrap: str, topic: str) -> list[dict[str, Any]]:
    """Every committed record of ``topic``'s quarantine, as its headers and value."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"check-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    name = f"{topic}-quarantine"
    try:
        parts = consumer.list_topics(name, timeout=10).topics[name].partitions
        found = []
        for p in parts:
            low, high = consumer.get_watermark_offsets(TopicPartition(name, p), timeout=10)
            if high <= low:
                continue
            consumer.assign([TopicPartition(name, p, low)])
            read = 0
            while read < high - low:
                message = consumer.poll(5)
                if message is None:
                    break  # a transaction's commit marker counts in the watermark
                assert message.error() is None, message.error()
                read += 1
                heads = {k: v.decode() for k, v in message.headers() or []}
                found.append({**heads, "value": message.value(), "key": message.key()})
                if message.offset() + 1 >= high:
                    break
        return found
    finally:
        consumer.close()


def tasks_of(base: str, task_type: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    cursor = ""
    while True:
        query = f"/v1/tasks?task_type={task_type}&limit=1000" + (
            f"&cursor={cursor}" if cursor else ""
        )
        status, page = call(base, "GET", query, key=CLIENT)
        assert status == 200, page
        out += page["tasks"]
        cursor = page["next_cursor"]
        if not cursor:
            return out


def test_avro_serializer_to_the_ingest_topic_runs_the_tasks(
    node: NodeProcess, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    bootstrap, topic = kafka_cluster.bootstrap, f"in-{uuid.uuid4().hex[:8]}"
    serialize = serializer(node.base)
    ctx = SerializationContext(topic, MessageField.VALUE)
    emails = [f"u{i}@example.com" for i in range(20)]
    records = [
        (
            f"k-{i}".encode() if i % 2 else None,
            serialize({"email": e, "seats": i}, ctx),
            HEADERS,
        )
        for i, e in enumerate(emails)
    ]
    # The same key and datum again (a producer's retry): it meets its twin, no second task.
    records.append((b"k-1", serialize({"email": emails[1], "seats": 1}, ctx), HEADERS))
    proc = router(node, bootstrap, topic, tmp_path / "router.out")
    produce(bootstrap, topic, records)
    try:
        wait_for(lambda: len(tasks_of(node.base, "signup")) >= 20, "20 enqueues")
        wait_for(
            lambda: {t["status"] for t in tasks_of(node.base, "signup")} == {"SUCCEEDED"},
            "every task to succeed",
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "router.out").read_text()
    found = tasks_of(node.base, "signup")
    assert len(found) == 20, found
    assert {t["queue"] for t in found} == {"signups"}  # the type's default queue applies
    results = {}
    for t in found:
        status, detail = call(node.base, "GET", f"/v1/tasks/{t['task_id']}", key=CLIENT)
        assert status == 200, detail
        results[detail["result"]["email"]] = detail["result"]
    assert sorted(results) == sorted(emails)
    assert results["u7@example.com"] == {"email": "u7@example.com", "seats": 7, "plan": "free"}
    assert quarantined(bootstrap, topic) == []


def headers(task_type: str) -> list[tuple[str, bytes]]:
    return [("conveyor-app", APP.encode()), ("conveyor-task-type", task_type.encode())]


def test_hostile_records_are_quarantined_and_the_good_ones_behind_them_enqueued(
    node: NodeProcess, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    bootstrap, topic = kafka_cluster.bootstrap, f"fuzz-{uuid.uuid4().hex[:8]}"
    serialize = serializer(node.base, f"{APP}.signup_fuzz-value")
    refund = serializer(node.base, f"{APP}.refund-value")
    ctx = SerializationContext(topic, MessageField.VALUE)
    good = headers("signup_fuzz")
    ok = [serialize({"email": f"f{i}@example.com", "seats": i}, ctx) for i in range(7)]
    unknown_id = wire.frame(987_654, ok[0][5:])
    plan: list[tuple[str | None, tuple[bytes | None, bytes | None, Any]]] = [
        (None, (None, ok[0], good)),
        ("not-wire-format", (None, b"\x01" + ok[1][1:], good)),  # bad magic byte
        (None, (None, ok[1], good)),
        ("unknown-schema-id", (None, unknown_id, good)),
        ("bad-datum", (None, ok[2][:-2], good)),  # truncated
        ("wrong-subject", (None, refund({"order_id": "o1", "cents": 5}, ctx), good)),
        (None, (None, ok[2], good)),
        ("missing-header", (None, ok[3], good[:1])),
        ("missing-header", (None, ok[3], [])),
        ("bad-key", (b"\xff\xfe", ok[3], good)),  # a key that is not UTF-8
        ("not-wire-format", (None, b"\x00\x00", good)),  # shorter than the header
        ("not-wire-format", (None, None, good)),  # a tombstone
        ("bad-datum", (None, ok[4] + b"\x00", good)),  # a byte after the datum
        ("no-subject", (None, ok[4], headers("nosuch"))),  # a type without a schema
        (None, (None, ok[3], good)),
    ]
    rng = random.Random(20261207)  # seeded: a failure names the same bytes again
    for _ in range(24):
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        plan.append(("*", (None, junk, good)))
    plan += [(None, (None, ok[5], good)), (None, (None, ok[6], good))]
    proc = router(node, bootstrap, topic, tmp_path / "router.out")
    produce(bootstrap, topic, [record for _, record in plan])
    bad = {offset: code for offset, (code, _) in enumerate(plan) if code is not None}
    try:
        wait_for(lambda: len(tasks_of(node.base, "signup_fuzz")) >= 6, "the good records")
        wait_for(lambda: len(quarantined(bootstrap, topic)) >= len(bad), "the quarantine")
        assert proc.poll() is None, (tmp_path / "router.out").read_text()  # 0 crashes
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "router.out").read_text()
    emails = set()
    for task in tasks_of(node.base, "signup_fuzz"):
        status, detail = call(node.base, "GET", f"/v1/tasks/{task['task_id']}", key=CLIENT)
        assert status == 200, detail
        emails.add(detail["payload"]["email"])
    assert emails == {f"f{i}@example.com" for i in (0, 1, 2, 3, 5, 6)}
    found = quarantined(bootstrap, topic)
    by_offset = {int(q["conveyor-source-offset"]): q for q in found}
    assert len(found) == len(by_offset) == len(bad), found  # each once
    assert set(by_offset) == set(bad)
    for offset, code in bad.items():
        q = by_offset[offset]
        assert q["conveyor-source-topic"] == topic and q["conveyor-source-partition"] == "0"
        assert q["conveyor-quarantine-reason"], q
        if code != "*":
            assert q["conveyor-quarantine-code"] == code, (offset, q)
        assert q["value"] == plan[offset][1][1], q  # kept as produced: fix it, produce it again
    reasons = {by_offset[o]["conveyor-quarantine-code"]: by_offset[o] for o in bad}
    assert "987654" in reasons["unknown-schema-id"]["conveyor-quarantine-reason"]
    assert "truncated" in by_offset[4]["conveyor-quarantine-reason"]
    assert "signup_fuzz-value" in reasons["wrong-subject"]["conveyor-quarantine-reason"]
    assert "conveyor-task-type" in by_offset[7]["conveyor-quarantine-reason"]
    assert "magic byte 1" in by_offset[1]["conveyor-quarantine-reason"]


def committed_lag(bootstrap: str, topic: str) -> int:
    """Records of ``topic`` the routers' group has not committed yet, counting the offsets of
    a transaction still open as committed (a lower bound of the lag). A read_committed fetch
    waits for that transaction to end, and a router killed inside one leaves it open until the
    next router fences it or it times out (a minute), past this call's timeout."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"conveyor-ingest-{topic}",
            "isolation.level": "read_uncommitted",
        }
    )
    try:
        parts = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        tps = [TopicPartition(topic, p) for p in parts]
        lag = 0
        for tp in consumer.committed(tps, timeout=10):
            high = consumer.get_watermark_offsets(tp, timeout=10)[1]
            lag += high - max(tp.offset, 0)
        return lag
    finally:
        consumer.close()


def test_a_router_killed_mid_stream_enqueues_every_record_exactly_once(
    node: NodeProcess, kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    bootstrap, topic = kafka_cluster.bootstrap, f"kill-{uuid.uuid4().hex[:8]}"
    serialize = serializer(node.base, f"{APP}.signup_kill-value")
    ctx = SerializationContext(topic, MessageField.VALUE)
    total = 3_000
    # Unkeyed: each task's key is its record's coordinates, the case the router must dedupe.
    records = [
        (None, serialize({"email": f"k{i}@example.com", "seats": i}, ctx), headers("signup_kill"))
        for i in range(total)
    ]
    out = tmp_path / "router.out"
    # Batches of 100: the kills land between and inside the router's many commits.
    proc = router(node, bootstrap, topic, out, "--batch", "100")
    produce(bootstrap, topic, records)
    kills = 0
    for at_least in (400, 1_500):
        wait_for(
            lambda n=at_least: total - committed_lag(bootstrap, topic) >= n, f"{at_least} routed"
        )
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        kills += 1
        assert committed_lag(bootstrap, topic) > 0, "killed after the last record"
        proc = router(node, bootstrap, topic, out, "--batch", "100")  # same instance: same txn id
    try:
        wait_for(lambda: committed_lag(bootstrap, topic) == 0, "every record committed")
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, out.read_text()
    found = tasks_of(node.base, "signup_kill")
    assert kills == 2
    assert len(found) == total, len(found)  # none twice, none lost
    assert quarantined(bootstrap, topic) == []


def test_a_key_the_node_refuses_stops_the_router_naming_it(
    node: NodeProcess, kafka_cluster: KafkaCluster
) -> None:
    cmd = [sys.executable, "-m", "conveyor.cli", "ingest", "--kafka", kafka_cluster.bootstrap]
    cmd += ["--topic", "never-read", "--url", node.base, "--api-key", "cvk_not-a-key-0123456789"]
    out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 4, out.stdout + out.stderr  # refused
    assert "refused the router's key (401)" in out.stderr, out.stderr
    assert "cvk_not-a-key" not in out.stdout + out.stderr  # a key is never echoed
