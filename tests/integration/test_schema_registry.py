"""The schema registry and task type definitions against a real ``conveyor node`` process:
Confluent's own clients (confluent-kafka's ``SchemaRegistryClient`` and ``AvroSerializer``,
python-schema-registry-client) register, look up, evolve and check schemas under
``<gateway>/registry``; tenants never see each other's subjects; the catalog survives a node
restart; a type's defaults apply to HTTP, CLI and schedule enqueues; a payload that does not
fit its type's schema is refused with nothing enqueued."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gateway import KEY_A, KEY_B, NodeProcess, call, write_keys

pytestmark = pytest.mark.timeout(180)
HERE = Path(__file__).parent

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [{"name": "id", "type": "string"}, {"name": "amount", "type": "double"}],
}
ORDER_V2 = {  # a field added with a default: BACKWARD compatible
    **ORDER_V1,
    "fields": [*ORDER_V1["fields"], {"name": "note", "type": "string", "default": ""}],
}
ORDER_BAD = {  # a field added without a default: old data cannot be read
    **ORDER_V1,
    "fields": [*ORDER_V1["fields"], {"name": "coupon", "type": "string"}],
}
CHARGE = {
    "task_type": "charge",
    "queue": "payments",
    "priority": 7,
    "retry": {"attempts_max": 9, "backoff_base_ms": 2000},
    "timeouts": {"start_to_close_ms": 45000},
    "payload_schema": ORDER_V1,
}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("schema-registry") / "home"
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start()
    body = {
        "agent_id": "setup",
        "app": "shop",
        "version": "v1",
        "deploy": 1,
        "task_types": ["charge", "report"],
        "definitions": [CHARGE, {"task_type": "report", "queue": "reports"}],
    }
    assert call(proc.base, "POST", "/worker/register", body) == (200, {"warnings": []})
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def registry(node: NodeProcess, key: str = KEY_A) -> Any:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient(
        {"url": f"{node.base}/registry", "basic.auth.user.info": f"user:{key}"}
    )


def test_confluent_client_registers_looks_up_gets_by_id_and_checks(node: NodeProcess) -> None:
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    client = registry(node)
    subject = "orders-value"
    first = client.register_schema(subject, Schema(json.dumps(ORDER_V1), "AVRO"))
    assert client.register_schema(subject, Schema(json.dumps(ORDER_V1), "AVRO")) == first
    found = client.lookup_schema(subject, Schema(json.dumps(ORDER_V1), "AVRO"))
    assert (found.schema_id, found.version) == (first, 1)
    assert json.loads(client.get_schema(first).schema_str) == ORDER_V1
    assert client.test_compatibility(subject, Schema(json.dumps(ORDER_V2), "AVRO")) is True
    assert client.test_compatibility(subject, Schema(json.dumps(ORDER_BAD), "AVRO")) is False
    second = client.register_schema(subject, Schema(json.dumps(ORDER_V2), "AVRO"))
    assert second != first
    assert client.get_versions(subject) == [1, 2]
    assert client.get_latest_version(subject).schema_id == second
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, Schema(json.dumps(ORDER_BAD), "AVRO"))
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 409)
    with pytest.raises(SchemaRegistryError) as invalid:
        client.register_schema(subject, Schema('{"type": "record", "name": 3}', "AVRO"))
    assert (invalid.value.http_status_code, invalid.value.error_code) == (422, 42201)
    with pytest.raises(SchemaRegistryError) as missing:
        client.get_version("no-such-subject", 1)
    assert missing.value.error_code == 40401
    # The task type's payload schema, registered by the agent, under its subject.
    assert "shop.charge-value" in client.get_subjects()


def test_avro_serializer_serializes_against_the_registry(node: NodeProcess) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = registry(node)
    serializer = AvroSerializer(client, json.dumps(ORDER_V1))
    ctx = SerializationContext("payments", MessageField.VALUE)
    data = serializer({"id": "o-1", "amount": 12.5}, ctx)
    assert data[0] == 0  # the Confluent wire format: magic byte, then the schema id
    schema_id = int.from_bytes(data[1:5], "big")
    assert json.loads(client.get_schema(schema_id).schema_str) == ORDER_V1
    assert AvroDeserializer(client)(data, ctx) == {"id": "o-1", "amount": 12.5}


def test_python_schema_registry_client_registers_and_evolves(node: NodeProcess) -> None:
    from schema_registry.client import SchemaRegistryClient, schema

    client = SchemaRegistryClient(url=f"{node.base}/registry", auth=("user", KEY_A))
    first = client.register("evolve-value", schema.AvroSchema(ORDER_V1))
    second = client.register("evolve-value", schema.AvroSchema(ORDER_V2))
    assert second != first
    assert client.get_schema("evolve-value").schema_id == second
    assert client.test_compatibility("evolve-value", schema.AvroSchema(ORDER_BAD)) is False
    assert client.get_compatibility() == "BACKWARD"
    client.update_compatibility("NONE", "evolve-value")
    assert client.get_compatibility("evolve-value") == "NONE"
    assert client.register("evolve-value", schema.AvroSchema(ORDER_BAD)) > second


def test_tenants_never_see_each_others_subjects(node: NodeProcess) -> None:
    from confluent_kafka.schema_registry import Schema
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    alpha, beta = registry(node, KEY_A), registry(node, KEY_B)
    alpha_id = alpha.register_schema("secret-value", Schema(json.dumps(ORDER_V1), "AVRO"))
    assert "secret-value" not in beta.get_subjects()
    with pytest.raises(SchemaRegistryError) as hidden:
        beta.get_latest_version("secret-value")
    assert hidden.value.error_code == 40401
    status, _ = call(node.base, "GET", f"/registry/schemas/ids/{alpha_id + 1000}", key=KEY_B)
    assert status == 404
    status, _ = call(node.base, "GET", "/registry/subjects", key="not-a-key")
    assert status == 401


def test_soft_and_hard_delete(node: NodeProcess) -> None:
    base = f"{node.base}/registry"
    path = "/registry/subjects/gone-value"
    body = {"schema": json.dumps(ORDER_V1)}
    assert call(node.base, "POST", f"{path}/versions", body)[0] == 200
    status, refused = call(node.base, "DELETE", f"{path}?permanent=true")
    assert (status, refused["error_code"]) == (404, 40405)
    assert call(node.base, "DELETE", path) == (200, [1])
    assert call(node.base, "GET", f"{path}/versions")[1]["error_code"] == 40401
    assert call(node.base, "GET", f"{path}/versions?deleted=true") == (200, [1])
    assert call(node.base, "DELETE", f"{path}?permanent=true") == (200, [1])
    assert call(node.base, "GET", f"{path}/versions?deleted=true")[1]["error_code"] == 40401
    assert base  # the same routes the clients above use


def test_task_types_list_and_show(node: NodeProcess) -> None:
    status, body = call(node.base, "GET", "/v1/task-types")
    assert status == 200
    charge = next(t for t in body["task_types"] if t["task_type"] == "charge")
    assert charge["app"] == "shop" and charge["defaults"]["queue"] == "payments"
    assert charge["origin"]["version"] == "v1" and charge["origin"]["deploy"] == 1
    assert charge["payload_schema_id"] is not None
    status, one = call(node.base, "GET", "/v1/task-types/shop/charge")
    assert status == 200 and one["defaults"]["attempts_max"] == 9
    assert call(node.base, "GET", "/v1/task-types/shop/nope")[0] == 404
    cli = _cli(node, "types", "list")
    assert cli.returncode == 0, cli.stderr
    assert "charge" in cli.stdout and "payments" in cli.stdout


def test_type_defaults_apply_to_http_enqueues(node: NodeProcess) -> None:
    payload = {"id": "a", "amount": 1.0}
    body = {"task_type": "charge", "app": "shop", "payload": payload, "idempotency_key": "k1"}
    status, created = call(node.base, "POST", "/v1/tasks", body)
    assert status in (200, 201), created
    task = call(node.base, "GET", f"/v1/tasks/{created['task_id']}")[1]
    assert (task["queue"], task["priority"]) == ("payments", 7), task
    # The stored spec holds the type's retry policy and timeout: the same key asking for them
    # outright is the same task, asking for the server's defaults is another one (409).
    spelled = {
        **body,
        "queue": "payments",
        "priority": 7,
        "retry": {"attempts_max": 9, "backoff_base_ms": 2000},
        "timeouts": {"start_to_close_ms": 45000},
    }
    status, twin = call(node.base, "POST", "/v1/tasks", spelled)
    assert status in (200, 201) and twin["task_id"] == created["task_id"], twin
    other = {**spelled, "retry": {"attempts_max": 5, "backoff_base_ms": 1000}}
    status, conflict = call(node.base, "POST", "/v1/tasks", other)
    assert status == 409 and "retry" in conflict["error"]["message"], conflict
    own = {**body, "idempotency_key": None, "queue": "urgent", "priority": 1}
    status, created = call(node.base, "POST", "/v1/tasks", own)
    task = call(node.base, "GET", f"/v1/tasks/{created['task_id']}")[1]
    assert (task["queue"], task["priority"]) == ("urgent", 1), task


def test_type_defaults_apply_to_cli_and_schedule_enqueues(node: NodeProcess) -> None:
    out = _cli(node, "enqueue", "report", "--app", "shop", "--payload", "{}")
    assert out.returncode == 0, out.stderr
    task_id = next(w for w in out.stdout.split() if len(w) == 32)
    assert call(node.base, "GET", f"/v1/tasks/{task_id}")[1]["queue"] == "reports"
    schedule = {
        "schedule_id": "nightly",
        "cron": "* * * * *",
        "task": {"task_type": "report", "app": "shop"},
    }
    status, body = call(node.base, "POST", "/v1/schedules", schedule)
    assert status in (200, 201), body
    assert body["task"]["queue"] == "reports", body  # its firings enqueue this template


def test_a_payload_that_does_not_fit_its_schema_is_refused(node: NodeProcess) -> None:
    body = {"task_type": "charge", "app": "shop", "payload": {"id": "a", "amount": "ten"}}
    status, refused = call(node.base, "POST", "/v1/tasks", body)
    assert status == 400, refused
    message = refused["error"]["message"]
    assert "payload.amount" in message and "expected double" in message, message
    batch = {"tasks": [{"task_type": "report", "app": "shop"}, {**body, "payload": {"id": 1}}]}
    status, refused = call(node.base, "POST", "/v1/tasks:batch", batch)
    assert status == 400 and "tasks[1].payload" in refused["error"]["message"], refused
    listed = call(node.base, "GET", "/v1/tasks?task_type=charge&limit=1000")[1]["tasks"]
    assert all(t["task_type"] == "charge" for t in listed)


def test_schemas_cli_registers_lists_and_checks(node: NodeProcess, tmp_path: Path) -> None:
    v1, bad = tmp_path / "v1.avsc", tmp_path / "bad.avsc"
    v1.write_text(json.dumps(ORDER_V1))
    bad.write_text(json.dumps(ORDER_BAD))
    out = _cli(node, "schemas", "register", "cli-value", "--file", str(v1))
    assert out.returncode == 0 and "registered cli-value version 1" in out.stdout, out
    listed = _cli(node, "schemas", "list")
    assert listed.returncode == 0 and "cli-value" in listed.stdout, listed
    ok = _cli(node, "schemas", "check", "cli-value", "--file", str(v1))
    assert ok.returncode == 0 and "compatible" in ok.stdout, ok
    refused = _cli(node, "schemas", "check", "cli-value", "--file", str(bad))
    assert refused.returncode == 1 and "incompatible" in refused.stdout, refused
    assert "coupon" in refused.stdout  # the field that makes it so
    shown = _cli(node, "types", "show", "shop", "charge")
    assert shown.returncode == 0 and "queue: payments" in shown.stdout, shown


def test_the_catalog_survives_a_restart(tmp_path: Any) -> None:
    home = tmp_path / "home"
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start()
    try:
        body = {"agent_id": "a", "app": "shop", "version": "v1", "task_types": ["charge"]}
        body["definitions"] = [CHARGE]
        assert call(proc.base, "POST", "/worker/register", body)[0] == 200
        subject = call(proc.base, "GET", "/registry/subjects/shop.charge-value/versions/1")[1]
    finally:
        assert proc.stop() == 0, proc.logs()
    proc.start()
    try:
        again = call(proc.base, "GET", "/registry/subjects/shop.charge-value/versions/1")
        assert again == (200, subject)
        assert call(proc.base, "GET", f"/registry/schemas/ids/{subject['id']}")[0] == 200
        one = call(proc.base, "GET", "/v1/task-types/shop/charge")[1]
        assert one["defaults"]["queue"] == "payments"
        enq = {"task_type": "charge", "app": "shop", "payload": {"id": "x", "amount": 2}}
        assert call(proc.base, "POST", "/v1/tasks", enq)[0] in (200, 201)
    finally:
        assert proc.stop() == 0, proc.logs()


def test_an_agent_registers_its_handlers_schema_and_options(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_keys(home)
    node = NodeProcess(home, ("node", "--no-projection"))
    node.start()
    out = open(tmp_path / "agent.out", "wb")  # noqa: SIM115
    args = ["--app", "typed_shop_app:app", "--url", node.base, "--api-key", KEY_A, "--in-process"]
    path = ":".join(p for p in (str(HERE), os.environ.get("PYTHONPATH")) if p)
    agent = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "agent", *args, "--poll-wait-s", "1"],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": path, "CONVEYOR_HOME": str(tmp_path / "agent")},
    )
    try:
        deadline = time.monotonic() + 30
        while (got := call(node.base, "GET", "/v1/task-types/typed-shop/place"))[0] != 200:
            assert time.monotonic() < deadline and agent.poll() is None, got
            time.sleep(0.1)
        place = got[1]
        assert place["defaults"]["queue"] == "orders" and place["defaults"]["priority"] == 4
        assert place["defaults"]["attempts_max"] == 7
        schema = call(node.base, "GET", "/registry/subjects/typed-shop.place-value/versions/1")
        assert schema[0] == 200 and schema[1]["id"] == place["payload_schema_id"], schema
        assert json.loads(schema[1]["schema"])["name"] == "Order"
        bad = {"task_type": "place", "app": "typed-shop", "payload": {"order_id": "o1"}}
        status, refused = call(node.base, "POST", "/v1/tasks", bad)
        assert status == 400 and "payload.lines: missing" in refused["error"]["message"]
        good = {**bad, "payload": {"order_id": "o1", "lines": [{"sku": "a"}, {"sku": "b"}]}}
        status, created = call(node.base, "POST", "/v1/tasks", good)
        assert status in (200, 201), created
        task = call(node.base, "GET", f"/v1/tasks/{created['task_id']}?wait_ms=20000")[1]
        assert (task["status"], task["queue"], task["result"]) == (
            "SUCCEEDED",
            "orders",
            {"lines": 2},
        ), task
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        out.close()
        assert node.stop() == 0, node.logs()


def _cli(node: NodeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "conveyor.cli", *args, "--url", node.base, "--api-key", KEY_A]
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    env.update({k: os.environ[k] for k in ("PYTHONPATH",) if k in os.environ})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)
