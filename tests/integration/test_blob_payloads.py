"""Large payloads through a real ``conveyor node``: blob references cannot be forged, blobs are
per tenant, and a task whose blob went missing fails alone (``gateway/payloads.py``)."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gateway import KEY_A, KEY_B, NodeProcess, call, write_keys

from conveyor.streams.gateway.fields import compact

pytestmark = pytest.mark.timeout(120)

APP = "blobs"
BIG = 300 * 1024


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home: Path = tmp_path_factory.mktemp("blob-payloads") / "home"
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start()
    for key in (KEY_A, KEY_B):
        for app in (APP, "missing"):
            body = {"agent_id": "setup", "app": app, "version": "1", "task_types": ["echo"]}
            assert call(proc.base, "POST", "/worker/register", body, key=key)[0] == 200
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def enqueue(node: NodeProcess, payload: Any, key: str = KEY_A, app: str = APP) -> str:
    body = {"task_type": "echo", "app": app, "payload": payload}
    status, reply = call(node.base, "POST", "/v1/tasks", body, key=key)
    assert status == 201, reply
    return str(reply["task_id"])


def digest_of(payload: Any) -> str:
    return hashlib.sha256(compact(payload)).hexdigest()


def blob_files(node: NodeProcess, tenant: str, digest: str) -> list[Path]:
    return list((node.home / "blobs").rglob(digest))


def poll(node: NodeProcess, key: str, app: str, capacity: int = 1) -> list[dict[str, Any]]:
    body = {"agent_id": f"agent-{app}", "app": app, "capacity": capacity, "wait_ms": 2000}
    status, reply = call(node.base, "POST", "/worker/poll", body, key=key)
    assert status == 200, reply
    return list(reply["leases"])


def test_another_tenants_blob_reference_is_plain_data(node: NodeProcess) -> None:
    secret = {"card": "s" * BIG}
    enqueue(node, secret)  # tenant alpha's 300 KiB payload, in a blob
    ref = f"sha256:{digest_of(secret)}"
    forged = {"$blob": ref, "x": 1}
    task_id = enqueue(node, forged, key=KEY_B)
    status, task = call(node.base, "GET", f"/v1/tasks/{task_id}", key=KEY_B)
    assert status == 200 and task["payload"] == forged, str(task)[:200]
    (lease,) = poll(node, KEY_B, APP)
    assert lease["task_id"] == task_id and lease["payload"] == forged
    # The reserved shape stays a 400, so no new record ever holds an old reference.
    body = {"task_type": "echo", "app": APP, "payload": {"$blob": ref}}
    status, reply = call(node.base, "POST", "/v1/tasks", body, key=KEY_B)
    assert status == 400 and reply["error"]["field"] == "payload", reply


def test_equal_payloads_of_two_tenants_are_two_blobs(node: NodeProcess) -> None:
    payload = {"same": "e" * BIG}
    a, b = enqueue(node, payload), enqueue(node, payload, key=KEY_B)
    digest = digest_of(payload)
    root = node.home / "blobs"
    files = sorted(p.relative_to(root).parts[:2] for p in blob_files(node, "", digest))
    assert files == [("tenants", "alpha"), ("tenants", "beta")]
    (node.home / "blobs" / "tenants" / "alpha" / digest[:2] / digest).unlink()
    status, task = call(node.base, "GET", f"/v1/tasks/{b}", key=KEY_B)
    assert status == 200 and task["payload"] == payload  # beta's copy is its own
    status, task = call(node.base, "GET", f"/v1/tasks/{a}")
    assert status == 200 and task["payload"] is None and "unavailable" in task


def test_a_missing_blob_fails_its_task_alone_and_the_poll_delivers_the_rest(
    node: NodeProcess,
) -> None:
    lost = {"lost": "l" * BIG}
    lost_id = enqueue(node, lost, app="missing")
    small = {enqueue(node, {"n": n}, app="missing") for n in range(2)}
    (path,) = blob_files(node, "alpha", digest_of(lost))
    path.unlink()  # deleted by hand, or lost with a disk

    status, task = call(node.base, "GET", f"/v1/tasks/{lost_id}")
    assert status == 200, task
    assert (task["status"], task["payload"]) == ("ENQUEUED", None)
    assert "missing" in task["unavailable"]["payload"], task

    delivered: set[str] = set()
    deadline = time.monotonic() + 20
    while delivered != small and time.monotonic() < deadline:
        delivered |= {lease["task_id"] for lease in poll(node, KEY_A, "missing", capacity=3)}
    assert delivered == small  # the other leases of the poll were handed over
    status, task = call(node.base, "GET", f"/v1/tasks/{lost_id}")
    assert status == 200 and task["status"] == "FAILED", task
    assert task["error"]["class"] == "PayloadUnavailable", task
    assert "missing" in task["error"]["message"] and "restore" in task["error"]["message"]
    for task_id in small:
        status, other = call(node.base, "GET", f"/v1/tasks/{task_id}")
        assert status == 200 and other["status"] == "LEASED", other
