"""``show_payloads: false`` through a real ``conveyor node``: the client API shows the marker
instead of the payload (task detail, schedules), agents still get the payload, other tenants
are unaffected, and no client can store the marker itself."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gateway import KEY_A, KEY_B, NodeProcess, call

from conveyor.streams.gateway.tenants import HIDDEN

pytestmark = pytest.mark.timeout(120)

SECRET = {"card": "4111 1111 1111 1111"}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home: Path = tmp_path_factory.mktemp("tenant-settings") / "home"
    home.mkdir(parents=True)
    doc = {
        "keys": {KEY_A: {"tenant": "alpha"}, KEY_B: {"tenant": "beta"}},
        "tenants": {"alpha": {"show_payloads": False}},
    }
    (home / "keys.json").write_text(json.dumps(doc))
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start()
    for key in (KEY_A, KEY_B):
        body = {"agent_id": "setup", "app": "pii", "version": "1", "task_types": ["charge"]}
        assert call(proc.base, "POST", "/worker/register", body, key=key) == (200, {"warnings": []})
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def enqueue(node: NodeProcess, key: str) -> str:
    body = {"task_type": "charge", "app": "pii", "payload": SECRET}
    status, reply = call(node.base, "POST", "/v1/tasks", body, key=key)
    assert status == 201, reply
    return str(reply["task_id"])


def test_hidden_payloads_answer_the_marker(node: NodeProcess) -> None:
    hidden, shown = enqueue(node, KEY_A), enqueue(node, KEY_B)
    status, task = call(node.base, "GET", f"/v1/tasks/{hidden}", key=KEY_A)
    assert status == 200 and task["payload"] == HIDDEN, task
    assert "4111" not in json.dumps(task)
    status, task = call(node.base, "GET", f"/v1/tasks/{shown}", key=KEY_B)
    assert status == 200 and task["payload"] == SECRET, task

    # The agent that runs the task still gets its input.
    poll = {"agent_id": "a", "app": "pii", "capacity": 1, "wait_ms": 5000}
    status, reply = call(node.base, "POST", "/worker/poll", poll, key=KEY_A)
    assert status == 200 and [lease["payload"] for lease in reply["leases"]] == [SECRET], reply


def test_schedules_hide_the_template_payload(node: NodeProcess) -> None:
    body = {"schedule_id": "pii-nightly", "cron": "0 3 * * *"}
    body["task"] = {"task_type": "charge", "app": "pii", "payload": SECRET}
    status, created = call(node.base, "POST", "/v1/schedules", body, key=KEY_A)
    assert status == 201 and created["task"]["payload"] == HIDDEN, created
    status, listed = call(node.base, "GET", "/v1/schedules", key=KEY_A)
    assert [s["task"]["payload"] for s in listed["schedules"]] == [HIDDEN]


def test_the_marker_cannot_be_sent_as_a_payload(node: NodeProcess) -> None:
    body = {"task_type": "charge", "app": "pii", "payload": HIDDEN}
    status, reply = call(node.base, "POST", "/v1/tasks", body, key=KEY_B)
    assert status == 400, reply
    assert reply["error"]["field"] == "payload" and "reserved" in reply["error"]["message"]
