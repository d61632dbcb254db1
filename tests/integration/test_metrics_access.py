"""/metrics over real sockets: only the node's metrics key opens it, and tenant names show in
it only when the operator asks (``--metrics-tenant-labels``).

Before, /metrics answered anyone without a key, and ``conveyor_dispatched_total`` carried every
tenant's name.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gateway import (
    KEY_A,
    METRICS_KEY,
    NodeProcess,
    enqueue,
    poll,
    raw_http,
    register,
    write_keys,
)

pytestmark = pytest.mark.timeout(120)

TENANT = "alpha"  # KEY_A's tenant (write_keys)


def scrape(base: str, key: str | None) -> tuple[int, str]:
    request = urllib.request.Request(base + "/metrics")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _node(root: Path, *options: str) -> NodeProcess:
    home = root / "home"
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection", *options))
    proc.start()
    register(proc.base)
    enqueue(proc.base)  # one lease granted to alpha: the dispatch counter gets its series
    assert len(poll(proc.base, "shop")) == 1
    return proc


@pytest.fixture(scope="module")
def default_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    proc = _node(tmp_path_factory.mktemp("metrics-default"))
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


@pytest.mark.parametrize("key", [None, KEY_A, "not-the-metrics-key"], ids=["none", "api", "wrong"])
def test_metrics_without_the_metrics_key_is_a_json_401(
    default_node: NodeProcess, key: str | None
) -> None:
    status, body = scrape(default_node.base, key)
    assert status == 401, body
    assert '"code":"unauthorized"' in body and "--metrics-key" in body
    assert "conveyor_" not in body


def test_a_non_ascii_bearer_is_a_401_too(default_node: NodeProcess) -> None:
    head = "GET /metrics HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer cl\u00e9\r\nConnection: close"
    status, body = raw_http(default_node.port, head)
    assert (status, body["error"]["code"]) == (401, "unauthorized"), body


def test_metrics_with_the_metrics_key_show_the_series_and_hash_tenant_names(
    default_node: NodeProcess,
) -> None:
    """``conveyor node`` labels tenants with a pseudonym by default: per-tenant series (the
    fairness alert), no name."""
    status, body = scrape(default_node.base, METRICS_KEY)
    assert status == 200, body
    pseudonym = "t" + hashlib.sha256(TENANT.encode()).hexdigest()[:12]
    assert f'conveyor_dispatched_total{{tenant="{pseudonym}"}} 1.0' in body
    assert TENANT not in body


@pytest.mark.parametrize(
    ("labels", "series"),
    [("off", 'conveyor_dispatched_total{tenant=""} 1.0'), ("on", f'{{tenant="{TENANT}"}} 1.0')],
)
def test_tenant_labels_are_the_operators_choice(tmp_path: Path, labels: str, series: str) -> None:
    proc = _node(tmp_path, "--metrics-tenant-labels", labels)
    try:
        status, body = scrape(proc.base, METRICS_KEY)
    finally:
        assert proc.stop() == 0, proc.logs()
    assert status == 200 and series in body, body
    assert (TENANT in body) == (labels == "on")


def test_a_node_without_a_metrics_key_serves_metrics_to_nobody(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start(env={**os.environ, "CONVEYOR_METRICS_KEY": ""})
    try:
        status, body = scrape(proc.base, "")
        assert status == 401 and "serves /metrics to no one" in body, body
        assert scrape(proc.base, KEY_A)[0] == 401
    finally:
        assert proc.stop() == 0, proc.logs()
