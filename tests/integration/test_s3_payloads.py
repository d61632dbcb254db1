"""Large payloads through a real node whose blob store is S3 (moto's server on 127.0.0.1,
reached by boto3 over HTTP through ``AWS_ENDPOINT_URL``, as a MinIO or real S3 would be)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer
from test_gateway import KEY_A, NodeProcess, call, free_port, register, write_keys

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def s3_url(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    for name, value in (
        ("AWS_ENDPOINT_URL", endpoint),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)  # the node process inherits them
    boto3.client("s3").create_bucket(Bucket="conveyor-payloads")
    try:
        yield "s3://conveyor-payloads/big/"
    finally:
        server.stop()


def test_a_payload_over_the_inline_cap_lives_in_s3(tmp_path: Path, s3_url: str) -> None:
    home = tmp_path / "home"
    write_keys(home)
    node = NodeProcess(home, ("node", "--blobs-url", s3_url, "--no-projection"))
    node.start()
    try:
        register(node.base)
        payload = {"blob": "y" * 300_000}
        body = {"task_type": "echo", "app": "shop", "payload": payload}
        status, reply = call(node.base, "POST", "/v1/tasks", body)
        assert status == 201, reply
        status, task = call(node.base, "GET", f"/v1/tasks/{reply['task_id']}", key=KEY_A)
        assert status == 200 and task["payload"] == payload
        keys = [
            o["Key"]
            for o in boto3.client("s3").list_objects_v2(Bucket="conveyor-payloads")["Contents"]
        ]
        stored = boto3.client("s3").get_object(Bucket="conveyor-payloads", Key=keys[0])
        data = stored["Body"].read()
        assert keys == [f"big/tenants/alpha/{hashlib.sha256(data).hexdigest()}"]
        assert b"y" * 1000 in data
    finally:
        assert node.stop() == 0, node.logs()


def test_a_bad_blobs_url_stops_the_node_with_a_clear_error(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_keys(home)
    node = NodeProcess(home, ("node", "--blobs-url", "ftp://nowhere", "--no-projection"))
    with pytest.raises(AssertionError, match="is not s3://<bucket>/<prefix>"):
        node.start()
