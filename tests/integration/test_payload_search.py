"""Search tasks by payload field through real processes: ``GET /v1/tasks?payload.<f>=<v>``
answered from the Postgres query snapshot of a real ``conveyor node`` (processors, projector,
embedded PostgreSQL), the SDK clients' ``list(payload=...)``, and ``conveyor list --payload``
as a subprocess against a real ``conveyor dev``.

- three customers enqueued: each customer's search lists exactly its tasks; two fields narrow
  it; no match is an empty page; values compare as JSON (``n=3`` is not ``n="3"``);
- another tenant's tasks with the same fields are never listed;
- a bad field name is a 400 naming the field; a tenant that hides payloads cannot search;
- a payload that is not an object, or a codec's envelope, is never found.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gateway import KEY_A, KEY_B, NodeProcess, call

pytestmark = pytest.mark.timeout(240)

KEY_C = "test-key-gamma-0123456789"
APP = "shop"


def _root(prefix: str) -> Iterator[Path]:
    """A directory outside pytest's basetemp: every pytest run resets /tmp/pytest-of-<user> to
    0700, which locks out the PostgreSQL pgserver runs as its own user when we run as root."""
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def node() -> Iterator[NodeProcess]:
    root = Path(tempfile.mkdtemp(prefix="conveyor-payload-search-"))  # _root says why
    home = root / "home"
    home.mkdir()
    doc = {
        "keys": {
            KEY_A: {"tenant": "alpha"},
            KEY_B: {"tenant": "beta"},
            KEY_C: {"tenant": "gamma"},
        },
        "tenants": {"beta": {"show_payloads": False}},
    }
    (home / "keys.json").write_text(json.dumps(doc))
    proc = NodeProcess(home)
    proc.start()
    for key in (KEY_A, KEY_B, KEY_C):
        body = {"agent_id": "setup", "app": APP, "version": "1", "task_types": ["charge"]}
        assert call(proc.base, "POST", "/worker/register", body, key=key) == (200, {"warnings": []})
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()
        shutil.rmtree(root, ignore_errors=True)


def enqueue(base: str, payload: Any, key: str = KEY_A) -> str:
    body = {"task_type": "charge", "app": APP, "payload": payload}
    status, reply = call(base, "POST", "/v1/tasks", body, key=key)
    assert status == 201, reply
    return str(reply["task_id"])


def search(base: str, key: str = KEY_A, **fields: str) -> tuple[int, Any]:
    query = urllib.parse.urlencode({f"payload.{k}": v for k, v in fields.items()})
    return call(base, "GET", f"/v1/tasks?limit=1000&{query}", key=key)


def found(base: str, key: str = KEY_A, **fields: str) -> set[str]:
    status, page = search(base, key, **fields)
    assert status == 200, page
    assert page["may_trail"] is False, page
    return {t["task_id"] for t in page["tasks"]}


def test_tasks_are_found_by_their_payload_fields(node: NodeProcess) -> None:
    base = node.base
    acme_eu = enqueue(base, {"customer": "acme", "region": "eu", "n": 3, "lines": [1, 2]})
    acme_us = enqueue(base, {"customer": "acme", "region": "us", "n": "3"})
    globex = enqueue(base, {"customer": "globex", "region": "eu", "vip": True})
    initech = enqueue(base, {"customer": "initech", "note": None})
    enqueue(base, ["customer", "acme"])  # not an object: nothing to search
    enqueue(base, {"$codec": "conveyor/v1", "encoding": [], "metadata": {}, "data": "YWNtZQ=="})
    enqueue(base, {"customer": "acme"}, key=KEY_C)  # another tenant's
    assert found(base, customer="acme") == {acme_eu, acme_us}
    assert found(base, customer="globex") == {globex}
    assert found(base, customer="initech") == {initech}
    assert found(base, customer="acme", region="eu") == {acme_eu}
    assert found(base, region="eu") == {acme_eu, globex}
    assert found(base, customer="acme", region="asia") == set()
    assert found(base, customer="nobody") == set()
    # JSON scalars: 3 is the number, "3" (quoted) the string; true and null are themselves
    assert found(base, n="3") == {acme_eu}
    assert found(base, n='"3"') == {acme_us}
    assert found(base, vip="true") == {globex}
    assert found(base, note="null") == {initech}
    # nested values are not kept; the envelope's fields are not the payload's
    assert found(base, lines="[1,2]") == set()
    assert found(base, data="YWNtZQ==") == set()
    # the same search as OpenAPI's deepObject style writes it: payload[<field>]=<value>
    status, page = call(base, "GET", "/v1/tasks?payload%5Bcustomer%5D=globex")
    assert status == 200 and [t["task_id"] for t in page["tasks"]] == [globex], page
    # with the other filters, and counted
    status, page = call(base, "GET", "/v1/tasks?payload.customer=acme&count=true")
    assert status == 200 and page["count"] == 2, page


def test_a_bad_search_is_a_400_naming_the_field(node: NodeProcess) -> None:
    status, reply = search(node.base, **{"cust omer": "acme"})
    assert status == 400, reply
    assert reply["error"]["field"] == "payload.cust omer", reply
    assert "U+0020" in reply["error"]["message"], reply
    status, reply = call(node.base, "GET", "/v1/tasks?payload.n=1&payload.n=2")
    assert status == 400 and reply["error"]["field"] == "payload.n", reply


def test_a_tenant_that_hides_payloads_cannot_search_them(node: NodeProcess) -> None:
    enqueue(node.base, {"card": "4111 1111 1111 1111"}, key=KEY_B)
    status, reply = search(node.base, KEY_B, card="4111 1111 1111 1111")
    assert status == 400, reply
    assert "hidden" in reply["error"]["message"] and "4111" not in json.dumps(reply), reply


def test_the_sdk_clients_search_by_payload(node: NodeProcess) -> None:
    import conveyor

    base = node.base
    ids = {enqueue(base, {"customer": "hooli", "tier": t}) for t in ("1", "gold")}
    quoted = enqueue(base, {"customer": "hooli", "tier": 1})
    with conveyor.Client(base, KEY_A, app=APP) as client:
        page = client.list(payload={"customer": "hooli"}, limit=1000)
        assert {t.task_id for t in page.tasks} == {*ids, quoted}
        # a str is the string even when it reads as a number; an int the number
        page = client.list(payload={"customer": "hooli", "tier": "1"})
        assert len(page.tasks) == 1 and page.tasks[0].task_id in ids
        assert [t.task_id for t in client.list(payload={"tier": 1}).tasks] == [quoted]
        with pytest.raises(TypeError, match="tier"):
            client.list(payload={"tier": [1]})

    async def listed() -> set[str]:
        async with conveyor.AsyncClient(base, KEY_A, app=APP) as aclient:
            page = await aclient.list(payload={"customer": "hooli", "tier": "gold"})
            return {t.task_id for t in page.tasks}

    assert len(asyncio.run(listed()) & ids) == 1


DEV_APP = """
import conveyor

app = conveyor.App("shop")


@app.task
def charge(ctx, payload):
    return None
"""


@pytest.fixture
def root() -> Iterator[Path]:
    yield from _root("conveyor-payload-search-dev-")


def test_conveyor_list_payload_against_conveyor_dev(root: Path) -> None:
    (root / "searchapp.py").write_text(DEV_APP)
    home = root / "home"
    home.mkdir()
    # trusted code, our own: no sandbox needed (nor bubblewrap installed)
    dev = NodeProcess(home, ("dev", "--app", "searchapp:app", "--sandbox", "none"))
    env = {k: v for k, v in os.environ.items() if k not in ("CONVEYOR_HOME", "COLUMNS")}
    env.pop("CONVEYOR_API_KEY", None)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    dev.start(cwd=root, env=env)
    try:
        keys = json.loads((home / "keys.json").read_text())["keys"]
        key = next(k for k, e in keys.items() if e.get("role") != "agent")
        ids = {}
        deadline = time.monotonic() + 60  # the agent registers the app a moment after start
        for customer in ("acme", "globex", "initech"):
            body = {"task_type": "charge", "app": APP, "payload": {"customer": customer}}
            status, reply = call(dev.base, "POST", "/v1/tasks", body, key=key)
            while status == 400 and reply["error"]["code"] == "unknown_task_type":
                assert time.monotonic() < deadline, (reply, dev.logs())
                time.sleep(0.1)
                status, reply = call(dev.base, "POST", "/v1/tasks", body, key=key)
            assert status == 201, (reply, dev.logs())
            ids[customer] = reply["task_id"]

        def cli(*args: str) -> subprocess.CompletedProcess[str]:
            cmd = [sys.executable, "-m", "conveyor.cli", "list", *args]
            cmd += ["--url", dev.base, "--home", str(home)]
            return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)

        for customer, task_id in ids.items():
            listed = cli("--payload", f"customer={customer}", "--json")
            assert listed.returncode == 0, listed.stderr
            assert [t["task_id"] for t in json.loads(listed.stdout)] == [task_id]
        table = cli("--payload", "customer=globex")
        assert table.returncode == 0 and ids["globex"] in table.stdout, table.stderr
        none = cli("--payload", "customer=acme", "--payload", "customer2=x", "--json")
        assert none.returncode == 0 and json.loads(none.stdout) == [], none.stderr
        malformed = cli("--payload", "customer")
        assert malformed.returncode == 2 and "FIELD=VALUE" in malformed.stderr, malformed.stderr
        bad_name = cli("--payload", "cust omer=acme")
        assert bad_name.returncode == 2, bad_name.stdout + bad_name.stderr
        assert "payload.cust omer" in bad_name.stderr and "Traceback" not in bad_name.stderr
    finally:
        assert dev.stop(signal.SIGINT) == 0, dev.logs()
