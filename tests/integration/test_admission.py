"""Per-tenant enqueue admission against a real node: over the rate is a 429 with Retry-After
that writes nothing, other tenants are untouched, and the SDK waits and resends by itself."""

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
