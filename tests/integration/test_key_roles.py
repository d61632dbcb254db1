"""Key roles against a real node: a client key cannot speak the worker protocol, an agent key
only speaks it for its own app (and version), and a legacy key (no role) keeps doing both with
one deprecation warning. Each refusal is a 403 ``forbidden`` that changes nothing."""

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
from test_gateway import NodeProcess, call
from test_security import read

pytestmark = pytest.mark.timeout(120)

CLIENT = "cvk_client-alpha-0123456789"
AGENT_A = "cvk_agent-shop-0123456789"
AGENT_B = "cvk_agent-billing-0123456789"
AGENT_V3 = "cvk_agent-shop-v3-0123456789"
LEGACY = "cvk_legacy-alpha-0123456789"
KEYS = {
    CLIENT: {"tenant": "alpha", "role": "client"},
    AGENT_A: {"tenant": "alpha", "role": "agent", "app": "shop"},
    AGENT_B: {"tenant": "alpha", "role": "agent", "app": "billing"},
    AGENT_V3: {"tenant": "alpha", "role": "agent", "app": "shop", "version": "v3"},
    LEGACY: {"tenant": "alpha"},
}
HERE = Path(__file__).parent  # agent_app.py
APPS = {AGENT_A: "shop", AGENT_B: "billing", LEGACY: "legacy"}


def register(base: str, key: str, app: str, version: str = "1") -> tuple[int, Any]:
    body = {"agent_id": app, "app": app, "version": version, "task_types": ["job"]}
    return call(base, "POST", "/worker/register", body, key=key)


def poll(base: str, key: str, app: str, *, queue: str, version: str = "1") -> tuple[int, Any]:
    body = {"agent_id": app, "app": app, "version": version, "queues": [queue], "capacity": 1}
    return call(base, "POST", "/worker/poll", {**body, "wait_ms": 5000}, key=key)


def enqueue(base: str, key: str, app: str, *, queue: str) -> str:
    body = {"task_type": "job", "app": app, "queue": queue, "payload": {"n": 1}}
    status, reply = call(base, "POST", "/v1/tasks", body, key=key)
    assert status == 201, reply
    return str(reply["task_id"])


def forbidden(reply: tuple[int, Any]) -> str:
    status, body = reply
    assert (status, body["error"]["code"]) == (403, "forbidden"), reply
    return str(body["error"]["message"])


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("roles") / "home"
    home.mkdir()
    (home / "keys.json").write_text(json.dumps({"keys": KEYS}))
    proc = NodeProcess(home)
    proc.start()
    for key, app in APPS.items():
        assert register(proc.base, key, app) == (200, {"warnings": []})
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def test_a_client_key_cannot_call_the_worker_protocol(node: NodeProcess) -> None:
    task_id = enqueue(node.base, CLIENT, "shop", queue="client-poll")
    message = forbidden(poll(node.base, CLIENT, "shop", queue="client-poll"))
    assert "agent key" in message and "conveyor keys create" in message
    forbidden(register(node.base, CLIENT, "shop"))
    ref = {"task_id": task_id, "lease_id": 1}
    body = {"completions": [{**ref, "outcome": "SUCCEEDED"}]}
    forbidden(call(node.base, "POST", "/worker/complete", body, key=CLIENT))
    assert read(node.base, task_id, CLIENT)["status"] == "ENQUEUED"


def test_an_agent_key_cannot_register_or_poll_another_app(node: NodeProcess) -> None:
    task_id = enqueue(node.base, CLIENT, "billing", queue="other-app")
    message = forbidden(poll(node.base, AGENT_A, "billing", queue="other-app"))
    assert "bound to app 'shop', not 'billing'" in message
    forbidden(register(node.base, AGENT_A, "billing"))
    assert read(node.base, task_id, CLIENT)["status"] == "ENQUEUED"  # nothing was leased
    # A key bound to a version polls that version only.
    forbidden(poll(node.base, AGENT_V3, "shop", queue="other-app", version="v4"))
    assert poll(node.base, AGENT_V3, "shop", queue="nothing-here", version="v3")[0] == 200


def test_an_agent_key_cannot_report_on_another_apps_lease(node: NodeProcess) -> None:
    task_id = enqueue(node.base, CLIENT, "billing", queue="forge")
    status, reply = poll(node.base, AGENT_B, "billing", queue="forge")
    assert status == 200 and len(reply["leases"]) == 1, reply
    ref = {"task_id": task_id, "lease_id": reply["leases"][0]["lease_id"]}
    before = read(node.base, task_id, CLIENT)
    for path, body in (
        ("complete", {"completions": [{**ref, "outcome": "SUCCEEDED", "result": "forged"}]}),
        ("heartbeat", {"leases": [ref]}),
        ("checkpoint", {"checkpoints": [{**ref, "value": "forged"}]}),
        ("steps", {"steps": [{**ref, "op": "CLAIM", "identity": "s", "position": 0}]}),
    ):
        message = forbidden(call(node.base, "POST", f"/worker/{path}", body, key=AGENT_A))
        assert "not a task of app 'shop'" in message, message
    after = read(node.base, task_id, CLIENT)
    assert after == before and after["status"] == "LEASED"
    # The legitimate agent of billing still finishes it.
    body = {"completions": [{**ref, "outcome": "SUCCEEDED", "result": "real"}]}
    status, done = call(node.base, "POST", "/worker/complete", body, key=AGENT_B)
    assert status == 200 and done["results"][0]["ok"] is True, done
    assert read(node.base, task_id, CLIENT)["result"] == "real"


def test_an_agent_key_cannot_call_the_client_api(node: NodeProcess) -> None:
    body = {"task_type": "job", "app": "shop", "queue": "agent-enqueue", "payload": {}}
    message = forbidden(call(node.base, "POST", "/v1/tasks", body, key=AGENT_A))
    assert "client key" in message
    forbidden(call(node.base, "GET", "/v1/tasks?limit=10", key=AGENT_A))
    status, page = call(node.base, "GET", "/v1/tasks?limit=1000", key=CLIENT)
    assert status == 200 and all(t["queue"] != "agent-enqueue" for t in page["tasks"])


def test_a_legacy_key_still_does_both_and_warns_once(node: NodeProcess) -> None:
    task_id = enqueue(node.base, LEGACY, "legacy", queue="legacy")
    status, reply = poll(node.base, LEGACY, "legacy", queue="legacy")
    assert status == 200 and len(reply["leases"]) == 1, reply
    ref = {"task_id": task_id, "lease_id": reply["leases"][0]["lease_id"]}
    body = {"completions": [{**ref, "outcome": "SUCCEEDED", "result": 7}]}
    status, done = call(node.base, "POST", "/worker/complete", body, key=LEGACY)
    assert status == 200 and done["results"][0]["ok"] is True, done
    assert read(node.base, task_id, LEGACY)["result"] == 7
    logs = node.logs()
    assert logs.count("deprecated") == 1, logs
    assert "of 'alpha'" in logs and LEGACY not in logs


@pytest.mark.parametrize(("key", "why"), [(CLIENT, "a client key"), (AGENT_A, "not 'agent-tests'")])
def test_an_agent_with_the_wrong_key_stops_saying_so(node: NodeProcess, key: str, why: str) -> None:
    args = ["--app", "agent_app:app", "--url", node.base, "--api-key", key, "--in-process"]
    done = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "agent", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
        },
    )
    assert done.returncode == 4, done  # refused
    assert "POST /worker/register: the node refused this agent's API key" in done.stderr, done
    assert why in done.stderr and key not in done.stderr + done.stdout


def conveyor(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "conveyor.cli", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def test_keys_create_mints_a_key_the_running_node_takes(node: NodeProcess) -> None:
    home = str(node.home)
    made = conveyor("keys", "create", "--home", home, "--tenant", "alpha", "--role", "agent")
    assert made.returncode == 1 and 'needs an "app"' in made.stderr, made
    made = conveyor(
        "keys", "create", "--home", home, "--tenant", "alpha", "--role", "agent", "--app", "new"
    )
    assert made.returncode == 0, made
    key = made.stdout.strip()
    assert key.startswith("cvk_") and "shown only this once" in made.stderr
    deadline = time.monotonic() + 10  # the node re-reads keys.json within a second
    while (status := register(node.base, key, "new")[0]) == 401 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status == 200
    forbidden(register(node.base, key, "shop"))
    listed = conveyor("keys", "list", "--home", home, "--json")
    assert listed.returncode == 0 and key not in listed.stdout, listed
    rows = json.loads(listed.stdout)
    (row,) = [r for r in rows if r["app"] == "new"]
    assert row["key"] == key[:6] + "..." and row["version"] is None
    assert (row["tenant"], row["role"]) == ("alpha", "agent")
    assert {r["role"] for r in rows} == {"client", "agent", "client+agent (legacy)"}
