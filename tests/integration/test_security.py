"""The security table of tests/PLAN.md (X1-X6, X8) against a real node on 127.0.0.1.

Two tenants, alpha and beta, each with its own key; "agent" calls use the tenant's key on the
worker API, as ``conveyor agent`` does. Every case tries the attack, asserts the refusal, and
then that nothing changed: the victim's task reads exactly as before. The figures (attempts,
accepted, effects) are recorded as test properties.

Not covered here: X4 for guest code (a guest never holds a lease id or a credential: it speaks
only to its agent over a local socket, see tests/integration/test_agent.py), X7 (agents are
authenticated per tenant, not per host: any agent of a tenant may heartbeat that tenant's
leases) and X9 (no per-tenant quotas beyond fair dispatch).
"""

from __future__ import annotations

import base64
import pickle
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gateway import KEY_A, KEY_B, NodeProcess, call, write_keys

pytestmark = pytest.mark.timeout(120)

APP = {"agent_id": "sec", "app": "sec", "version": "1", "task_types": ["job"]}


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("security") / "home"
    write_keys(home)
    proc = NodeProcess(home)
    proc.start()
    for key in (KEY_A, KEY_B):
        assert call(proc.base, "POST", "/worker/register", APP, key=key)[0] == 200
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def enqueue(base: str, key: str = KEY_A, *, queue: str, **fields: Any) -> dict[str, Any]:
    """Each test enqueues on a queue of its own and leases from it only."""
    body = {"task_type": "job", "app": "sec", "queue": queue, "payload": {"n": 1}, **fields}
    status, reply = call(base, "POST", "/v1/tasks", body, key=key)
    assert status in (200, 201), reply
    return dict(reply)


def lease(base: str, key: str = KEY_A, *, queue: str, lease_ms: int = 30_000) -> dict[str, Any]:
    body = {"agent_id": "sec", "app": "sec", "queues": [queue], "capacity": 1, "wait_ms": 5000}
    body["lease_ms"] = lease_ms
    status, reply = call(base, "POST", "/worker/poll", body, key=key)
    assert status == 200 and len(reply["leases"]) == 1, reply
    return dict(reply["leases"][0])


def read(base: str, task_id: str, key: str = KEY_A) -> dict[str, Any]:
    status, task = call(base, "GET", f"/v1/tasks/{task_id}", key=key)
    assert status == 200, task
    return dict(task)


def worker(base: str, path: str, items: list[dict[str, Any]], key: str = KEY_A) -> list[Any]:
    name = {"complete": "completions", "heartbeat": "leases", "checkpoint": "checkpoints"}
    status, reply = call(base, "POST", f"/worker/{path}", {name[path]: items}, key=key)
    assert status == 200, reply
    return list(reply.get("results") or reply.get("actions") or [])


def test_x1_another_tenants_task_ids_answer_404_and_change_nothing(
    node: NodeProcess, record_property: Any
) -> None:
    victim = enqueue(node.base, queue="x1")["task_id"]
    held = lease(node.base, queue="x1")  # the attacker learns both ids out of band
    before = read(node.base, victim)
    attempts = 0
    for method, path in (
        ("GET", f"/v1/tasks/{victim}"),
        ("POST", f"/v1/tasks/{victim}/cancel"),
        ("GET", f"/v1/tasks/{victim}/logs/{held['lease_id']}"),
    ):
        attempts += 1
        status, reply = call(node.base, method, path, key=KEY_B)
        assert (status, reply["error"]["code"]) == (404, "not_found"), (path, reply)
    ref = {"task_id": victim, "lease_id": held["lease_id"]}
    for path, item in (
        ("complete", {**ref, "outcome": "SUCCEEDED", "result": "stolen"}),
        ("checkpoint", {**ref, "value": "stolen"}),
    ):
        attempts += 1
        (result,) = worker(node.base, path, [item], key=KEY_B)
        assert result["ok"] is False, result
    attempts += 1
    (action,) = worker(node.base, "heartbeat", [ref], key=KEY_B)
    assert action["action"] == "LOST"  # the same answer as for a lease that does not exist
    attempts += 1
    status, listing = call(node.base, "GET", "/v1/tasks?limit=1000", key=KEY_B)
    assert status == 200 and victim not in {t["task_id"] for t in listing["tasks"]}
    attempts += 1
    status, op = call(node.base, "POST", "/v1/tasks:cancel", {"filter": {}}, key=KEY_B)
    assert status == 202, op  # a bulk cancel of "everything" is beta's everything
    wait_operation(node.base, op["operation_id"], KEY_B)
    after = read(node.base, victim)
    assert after == before and after["status"] == "LEASED"
    record_property("x1_cross_tenant_attempts", attempts)
    record_property("x1_effects", 0)


def wait_operation(base: str, operation_id: str, key: str) -> None:
    deadline = time.monotonic() + 30
    while True:
        status, op = call(base, "GET", f"/v1/operations/{operation_id}", key=key)
        assert status == 200, op
        if op["state"] in ("DONE", "done", "FAILED", "failed"):
            return
        assert time.monotonic() < deadline, op
        time.sleep(0.1)


def test_x2_a_tenant_in_the_body_is_refused(node: NodeProcess) -> None:
    body = {"task_type": "job", "app": "sec", "payload": 1, "tenant": "beta"}
    status, reply = call(node.base, "POST", "/v1/tasks", body, key=KEY_A)
    assert status == 400 and reply["error"]["field"] == "tenant", reply
    batch = {"tasks": [{"task_type": "job", "app": "sec", "tenant": "beta"}]}
    status, reply = call(node.base, "POST", "/v1/tasks:batch", batch, key=KEY_A)
    assert status == 400 and reply["error"]["field"] == "tasks[0].tenant", reply


def test_x3_one_idempotency_key_never_spans_tenants(node: NodeProcess) -> None:
    a = enqueue(node.base, KEY_A, queue="x3", idempotency_key="shared-key")
    b = enqueue(node.base, KEY_B, queue="x3", idempotency_key="shared-key")
    assert a["created"] and b["created"] and a["task_id"] != b["task_id"]
    assert read(node.base, a["task_id"], KEY_A)["status"] == "ENQUEUED"
    assert call(node.base, "GET", f"/v1/tasks/{a['task_id']}", key=KEY_B)[0] == 404
    again = enqueue(node.base, KEY_B, queue="x3", idempotency_key="shared-key")
    assert (again["task_id"], again["created"]) == (b["task_id"], False)


def test_x4_forged_completions_are_refused_and_change_nothing(
    node: NodeProcess, record_property: Any
) -> None:
    target = enqueue(node.base, queue="x4")["task_id"]
    held = lease(node.base, queue="x4")
    assert held["task_id"] == target
    other = enqueue(node.base, queue="x4")["task_id"]  # never leased
    before = {t: read(node.base, t) for t in (target, other)}
    forgeries = [
        {"task_id": target, "lease_id": held["lease_id"] + 1},  # incremented
        {"task_id": target, "lease_id": 987_654_321},  # random
        {"task_id": other, "lease_id": held["lease_id"]},  # another task, a real lease id
        {"task_id": "f" * 32, "lease_id": held["lease_id"]},  # made up
    ]
    accepted = 0
    for ref in forgeries:
        for path, item in (
            ("complete", {**ref, "outcome": "SUCCEEDED", "result": "forged"}),
            ("complete", {**ref, "outcome": "FATAL", "error": {"class": "Forged"}}),
            ("checkpoint", {**ref, "value": "forged"}),
        ):
            (result,) = worker(node.base, path, [item])
            accepted += bool(result["ok"])
        (action,) = worker(node.base, "heartbeat", [ref])
        accepted += action["action"] != "LOST"
    assert accepted == 0
    assert {t: read(node.base, t) for t in (target, other)} == before
    record_property("x4_forgeries_tried", len(forgeries) * 4)
    record_property("x4_accepted", accepted)


def test_x5_a_stale_lease_cannot_fail_or_finish_the_task(node: NodeProcess) -> None:
    no_backoff = {"backoff_base_ms": 0, "backoff_cap_ms": 0}
    task_id = enqueue(node.base, queue="x5", retry=no_backoff)["task_id"]
    first = lease(node.base, queue="x5", lease_ms=300)
    deadline = time.monotonic() + 10
    while read(node.base, task_id)["status"] != "ENQUEUED":  # the lease lapsed
        assert time.monotonic() < deadline
        time.sleep(0.05)
    second = lease(node.base, queue="x5")
    assert second["lease_id"] > first["lease_id"]
    stale = {"task_id": task_id, "lease_id": first["lease_id"]}
    (result,) = worker(node.base, "complete", [{**stale, "outcome": "FAILED"}])
    assert result["ok"] is False and "stale lease" in result["reason"]
    assert read(node.base, task_id)["status"] == "LEASED"  # no RETRY_WAIT from the stale fail
    live = {"task_id": task_id, "lease_id": second["lease_id"], "outcome": "SUCCEEDED"}
    (result,) = worker(node.base, "complete", [live])
    assert result["ok"] is True


def test_x6_a_replayed_completion_is_idempotent(node: NodeProcess, record_property: Any) -> None:
    task_id = enqueue(node.base, queue="x6")["task_id"]
    held = lease(node.base, queue="x6")
    done = {"task_id": task_id, "lease_id": held["lease_id"], "outcome": "SUCCEEDED"}
    results = [worker(node.base, "complete", [{**done, "result": n}])[0] for n in range(10)]
    assert [r["ok"] for r in results] == [True] + [False] * 9
    task = read(node.base, task_id)
    assert task["status"] == "SUCCEEDED" and task["result"] == 0  # the first one stands
    assert [a["outcome"] for a in task["attempts"]] == ["SUCCEEDED"]
    record_property("x6_replays_accepted", sum(r["ok"] for r in results[1:]))


def test_x8_payloads_are_data_never_code(node: NodeProcess) -> None:
    """Nothing the platform does with a payload evaluates it: what goes in comes out equal,
    to the agent and to the client, whatever it looks like."""

    class Boom:
        def __reduce__(self) -> Any:
            return (print, ("pwned",))

    payloads = [
        {"pickle": base64.b64encode(pickle.dumps(Boom())).decode()},
        {"__reduce__": ["os.system", "touch /tmp/pwned"], "__class__": "subprocess.Popen"},
        "!!python/object/apply:os.system ['touch /tmp/pwned']",
        {"$type": "System.Diagnostics.Process", "{{7*7}}": "${jndi:ldap://x}"},
        ["__import__('os').system('id')"],
    ]
    for payload in payloads:
        task_id = enqueue(node.base, queue="x8", payload=payload)["task_id"]
        assert read(node.base, task_id)["payload"] == payload
        held = lease(node.base, queue="x8")
        assert held["task_id"] == task_id and held["payload"] == payload
        item = {"task_id": task_id, "lease_id": held["lease_id"], "outcome": "SUCCEEDED"}
        worker(node.base, "complete", [{**item, "result": payload}])
        assert read(node.base, task_id)["result"] == payload
    assert not Path("/tmp/pwned").exists()
