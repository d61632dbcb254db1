"""``GET /v1/tenants/me/usage`` through a real ``conveyor node``: with the Postgres snapshot
(counts from it, dispatch share from the metrics) and with ``--no-projection`` (RocksDB scan,
no dispatch field)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_gateway import KEY_A, KEY_B, NodeProcess, call, write_keys

pytestmark = pytest.mark.timeout(180)

STATUSES = {
    "ENQUEUED",
    "LEASED",
    "RETRY_WAIT",
    "SUCCEEDED",
    "FAILED",
    "CANCELED",
    "EXPIRED",
    "SLEEPING",
    "WAITING",
}


@pytest.fixture(scope="module", params=["snapshot", "scan"])
def node(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp(f"usage-{request.param}") / "home"
    write_keys(home)
    command = ("node",) if request.param == "snapshot" else ("node", "--no-projection")
    proc = NodeProcess(home, command)
    proc.start()
    for key in (KEY_A, KEY_B):
        body = {"agent_id": "setup", "app": "use", "version": "1", "task_types": ["echo"]}
        assert call(proc.base, "POST", "/worker/register", body, key=key) == (200, {"warnings": []})
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def usage(node: NodeProcess, key: str = KEY_A) -> dict[str, Any]:
    status, body = call(node.base, "GET", "/v1/tenants/me/usage", key=key)
    assert status == 200, body
    return dict(body)


def settled(node: NodeProcess, want: dict[str, int], key: str = KEY_A) -> dict[str, Any]:
    """The usage once its counts match ``want`` (the snapshot trails by the projection lag)."""
    deadline = time.monotonic() + 15
    while True:
        body = usage(node, key)
        if all(body["tasks"][s] == n for s, n in want.items()) or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def test_usage_counts_the_callers_tasks_only(node: NodeProcess) -> None:
    def enqueue(key: str) -> str:
        body = {"task_type": "echo", "app": "use", "payload": {}}
        status, reply = call(node.base, "POST", "/v1/tasks", body, key=key)
        assert status == 201, reply
        return str(reply["task_id"])

    for _ in range(3):
        enqueue(KEY_A)
    enqueue(KEY_B)
    canceled = enqueue(KEY_A)
    assert call(node.base, "POST", f"/v1/tasks/{canceled}/cancel")[0] == 200
    poll = {"agent_id": "a", "app": "use", "capacity": 2, "wait_ms": 5000}
    status, reply = call(node.base, "POST", "/worker/poll", poll)
    assert status == 200 and len(reply["leases"]) == 2, reply

    body = settled(node, {"ENQUEUED": 1, "LEASED": 2, "CANCELED": 1})
    assert body["tenant"] == "alpha" and body["complete"] is True
    assert set(body["tasks"]) == STATUSES
    assert body["tasks"]["ENQUEUED"] == 1 and body["tasks"]["CANCELED"] == 1, body
    assert body["running"] == body["tasks"]["LEASED"] == 2, body
    assert body["total"] == 4

    other = settled(node, {"ENQUEUED": 1}, KEY_B)
    assert other["tenant"] == "beta" and other["total"] == 1 and other["running"] == 0

    assert body["source"] == ("snapshot" if node.command == ("node",) else "scan")
    # The dispatch share is folded by the processors as they commit, projector or not.
    assert body["dispatch"]["window_s"] == 300
    assert body["dispatch"]["dispatched"] == body["dispatch"]["dispatched_all_tenants"] == 2
    assert body["dispatch"]["share"] == 1.0
    assert usage(node, KEY_B)["dispatch"]["share"] == 0.0


def test_usage_needs_a_key(node: NodeProcess) -> None:
    status, body = call(node.base, "GET", "/v1/tenants/me/usage", key=None)
    assert status == 401 and body["error"]["code"] == "unauthorized"


def test_usage_is_in_the_openapi_document(node: NodeProcess) -> None:
    status, doc = call(node.base, "GET", "/openapi.json", key=None)
    assert status == 200 and "get" in doc["paths"]["/v1/tenants/me/usage"]
