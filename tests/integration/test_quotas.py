"""Per-tenant quotas against a real node. Admission: over the enqueue rate is a 429 with
Retry-After that writes nothing, other tenants are untouched, and the SDK waits and resends by
itself. Dispatch: a tenant at its concurrency cap is dealt no lease until one of its leases
ends, while other tenants' work goes on."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest
from test_gateway import KEY_A, KEY_B, NodeProcess, register

import conveyor

pytestmark = pytest.mark.timeout(120)


def test_a_tenant_over_its_enqueue_rate_is_told_when_to_come_back(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    keys = {KEY_A: {"tenant": "alpha"}, KEY_B: {"tenant": "beta"}}
    tenants = {"alpha": {"enqueue_rate": 2, "enqueue_burst": 5}}
    (home / "keys.json").write_text(json.dumps({"keys": keys, "tenants": tenants}))
    node = NodeProcess(home, ("node", "--no-projection"))
    node.start()
    try:
        register(node.base)
        register(node.base, KEY_B)
        body = {"task_type": "echo", "app": "shop", "payload": 1}
        with httpx.Client(base_url=node.base) as http:
            alpha = {"Authorization": f"Bearer {KEY_A}"}
            for _ in range(5):  # the burst
                assert http.post("/v1/tasks", json=body, headers=alpha).status_code == 201
            refused = http.post("/v1/tasks", json=body, headers=alpha)
            assert refused.status_code == 429, refused.text
            assert refused.json()["error"]["code"] == "rate_limited"
            assert 1 <= int(refused.headers["Retry-After"]) <= 2
            listed = http.get("/v1/tasks", params={"limit": 100}, headers=alpha).json()
            assert len(listed["tasks"]) == 5  # the refusal wrote nothing
            beta = {"Authorization": f"Bearer {KEY_B}"}
            for _ in range(10):  # beta has no limit, and alpha's does not touch it
                assert http.post("/v1/tasks", json=body, headers=beta).status_code == 201
        with conveyor.Client(node.base, KEY_A, app="shop") as client:
            started = time.monotonic()
            handle = client.enqueue("echo", 2)  # waits for its token, then goes through
            assert handle.created and time.monotonic() - started >= 0.2
    finally:
        assert node.stop() == 0, node.logs()


def test_a_tenant_at_its_concurrency_cap_gets_no_more_leases(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    keys = {KEY_A: {"tenant": "alpha"}, KEY_B: {"tenant": "beta"}}
    (home / "keys.json").write_text(json.dumps({"keys": keys, "tenants": {"alpha": CAPPED}}))
    node = NodeProcess(home, ("node", "--no-projection"))
    node.start()
    try:
        register(node.base)
        register(node.base, KEY_B)
        with httpx.Client(base_url=node.base, timeout=30) as http:
            a, b = ({"Authorization": f"Bearer {k}"} for k in (KEY_A, KEY_B))
            batch = {"tasks": [{"task_type": "echo", "app": "shop"} for _ in range(10)]}
            assert http.post("/v1/tasks:batch", json=batch, headers=a).status_code == 201
            assert http.post("/v1/tasks:batch", json=batch, headers=b).status_code == 201

            def poll(headers: dict[str, str], capacity: int) -> list[dict[str, object]]:
                body = {"agent_id": "q", "app": "shop", "capacity": capacity, "wait_ms": 300}
                reply = http.post("/worker/poll", json=body, headers=headers)
                assert reply.status_code == 200, reply.text
                return list(reply.json()["leases"])

            def poll_all(headers: dict[str, str], capacity: int) -> list[dict[str, object]]:
                """A poll answers with what it holds (its late grants go to the next one):
                poll for the slots left until a poll comes back empty."""
                leases: list[dict[str, object]] = []
                while len(leases) < capacity and (more := poll(headers, capacity - len(leases))):
                    leases += more
                return leases

            held = poll_all(a, 10)
            assert len(held) == 3  # alpha's cap, though 10 are ready; no more while they run
            assert len(poll_all(b, 10)) == 10  # beta has no cap
            done = {"task_id": held[0]["task_id"], "lease_id": held[0]["lease_id"]}
            reply = http.post(
                "/worker/complete",
                json={"completions": [{**done, "outcome": "SUCCEEDED"}]},
                headers=a,
            )
            assert reply.json()["results"][0]["ok"] is True
            assert len(poll(a, 10)) == 1  # one ended: room for one more
    finally:
        assert node.stop() == 0, node.logs()


CAPPED = {"max_concurrent": 3}
