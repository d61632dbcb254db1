"""``GET /v1/events`` over real sockets: a ``conveyor node`` process, SSE and JSON long polls.

One node serves the module (tenants alpha and beta). Tasks are driven through the worker
protocol by the test itself (poll, complete), so every event it expects is one it caused.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.aclient import AsyncClient
from conveyor.client import Client
from conveyor.contract.replies import Events
from conveyor.errors import ContractError
from tests.integration.test_gateway import (
    KEY_A,
    KEY_B,
    NodeProcess,
    call,
    complete,
    poll,
    write_keys,
)

pytestmark = pytest.mark.timeout(120)

APP = "events"
READ_TIMEOUT_S = 15.0


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("events") / "home"
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start()
    for key in (KEY_A, KEY_B):
        body = {"agent_id": "setup", "app": APP, "version": "1", "task_types": ["echo", "other"]}
        assert call(proc.base, "POST", "/worker/register", body, key=key)[0] == 200
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def enqueue(
    base: str, key: str, n: int, task_type: str = "echo", queue: str = "default"
) -> list[str]:
    task = {"task_type": task_type, "app": APP, "queue": queue}
    body = {"tasks": [{**task, "payload": {"i": i}} for i in range(n)]}
    status, reply = call(base, "POST", "/v1/tasks:batch", body, key=key)
    assert status in (200, 201), reply
    return [r["task_id"] for r in reply["results"]]


def tail_cursor(base: str, key: str = KEY_A) -> str:
    status, reply = call(base, "GET", "/v1/events?wait_ms=0", key=key)
    assert status == 200, reply
    assert reply["events"] == []
    return str(reply["cursor"])


def collect(base: str, key: str, cursor: str, query: str, n: int) -> list[dict[str, Any]]:
    """Long-poll from ``cursor`` until ``n`` events came (the events log trails the acks by
    the outbox's shipping), then once more to show nothing else does."""
    found: list[dict[str, Any]] = []
    deadline = time.monotonic() + READ_TIMEOUT_S
    wait_ms = 2_000
    while time.monotonic() < deadline:
        status, reply = call(
            base, "GET", f"/v1/events?after={cursor}&wait_ms={wait_ms}{query}", key=key
        )
        assert status == 200, reply
        found += reply["events"]
        cursor = reply["cursor"]
        if wait_ms == 300:
            return found
        if len(found) >= n:
            wait_ms = 300
    raise AssertionError(f"{len(found)} events of {n} came")


class Sse:
    """An SSE connection to /v1/events, read frame by frame."""

    def __init__(self, base: str, key: str, query: str = "", last_event_id: str | None = None):
        host, port = base.removeprefix("http://").split(":")
        self.conn = http.client.HTTPConnection(host, int(port), timeout=READ_TIMEOUT_S)
        headers = {"Authorization": f"Bearer {key}", "Accept": "text/event-stream"}
        if last_event_id is not None:
            headers["Last-Event-ID"] = last_event_id
        self.conn.request("GET", "/v1/events" + query, headers=headers)
        self.response = self.conn.getresponse()

    def events(self, n: int) -> list[tuple[str, str, dict[str, Any]]]:
        """The next ``n`` events as (id, event, data)."""
        found: list[tuple[str, str, dict[str, Any]]] = []
        frame: dict[str, str] = {}
        while len(found) < n:
            line = self.response.fp.readline().decode().rstrip("\n")
            if line == "":
                if "data" in frame:
                    found.append((frame["id"], frame["event"], json.loads(frame["data"])))
                frame = {}
            elif not line.startswith(":"):
                name, _, value = line.partition(": ")
                frame[name] = value
        return found

    def close(self) -> None:
        self.conn.close()


def test_sse_resume_with_last_event_id_skips_nothing_and_repeats_nothing(
    node: NodeProcess,
) -> None:
    start = tail_cursor(node.base)
    first = enqueue(node.base, KEY_A, 30)
    enqueue(node.base, KEY_B, 10)  # another tenant's, interleaved: never shown to alpha
    stream = Sse(node.base, KEY_A, f"?after={start}&type=task.enqueued")
    assert stream.response.status == 200
    assert stream.response.getheader("Content-Type") == "text/event-stream"
    seen = stream.events(12)
    stream.close()  # a disconnect mid-stream
    later = enqueue(node.base, KEY_A, 20)
    resumed = Sse(node.base, KEY_A, "?type=task.enqueued", last_event_id=seen[-1][0])
    seen += resumed.events(len(first) + len(later) - len(seen))
    resumed.close()
    ids = [data["task_id"] for _, _, data in seen]
    assert len(ids) == len(set(ids)), "an event was repeated after the resume"
    assert set(ids) == set(first) | set(later), "an event was skipped (or another tenant's shown)"
    assert {kind for _, kind, _ in seen} == {"task.enqueued"}
    assert len({event_id for event_id, _, _ in seen}) == len(seen)  # one cursor per event


def test_json_long_poll_pages_with_the_cursor_and_filters_by_state_and_type(
    node: NodeProcess,
) -> None:
    start = tail_cursor(node.base)
    enqueue(node.base, KEY_A, 4, task_type="other")
    leases = poll(node.base, APP, capacity=4, task_types=["other"])
    assert len(leases) == 4
    for lease in leases[:3]:
        complete(node.base, lease)
    done = {lease["task_id"] for lease in leases[:3]}
    cursor, succeeded, pages = start, [], 0
    while len(succeeded) < 3 and pages < 50:
        path = f"/v1/events?after={cursor}&state=SUCCEEDED&task_type=other&limit=2&wait_ms=5000"
        status, reply = call(node.base, "GET", path)
        assert status == 200, reply
        assert len(reply["events"]) <= 2
        succeeded += reply["events"]
        cursor, pages = reply["cursor"], pages + 1
    assert {e["task_id"] for e in succeeded} == done
    assert all(e["type"] == "task.succeeded" and e["status"] == "SUCCEEDED" for e in succeeded)
    # From the last cursor nothing more matches: an empty answer after the wait, same cursor
    # or later, never an event before it.
    status, reply = call(node.base, "GET", f"/v1/events?after={cursor}&state=SUCCEEDED&wait_ms=300")
    assert (status, reply["events"]) == (200, [])


def test_a_long_poll_answers_as_soon_as_an_event_comes(node: NodeProcess) -> None:
    start = tail_cursor(node.base)
    timer = threading.Timer(0.5, lambda: enqueue(node.base, KEY_A, 1))
    timer.start()
    began = time.monotonic()
    status, reply = call(node.base, "GET", f"/v1/events?after={start}&wait_ms=20000")
    timer.join()
    assert status == 200, reply
    assert [e["type"] for e in reply["events"]] == ["task.enqueued"]
    assert 0.4 < time.monotonic() - began < 10.0


def test_another_tenants_events_are_never_shown(node: NodeProcess) -> None:
    start = tail_cursor(node.base)
    beta = set(enqueue(node.base, KEY_B, 5, queue="shared"))
    alpha = set(enqueue(node.base, KEY_A, 5, queue="shared"))
    stream = Sse(node.base, KEY_B, f"?after={start}")
    shown = {data["task_id"] for _, _, data in stream.events(5)}
    stream.close()
    assert shown == beta
    # Alpha asking with filters beta's tasks match too (queue, type) sees only its own.
    shown_a = collect(node.base, KEY_A, start, "&queue=shared&task_type=echo", len(alpha))
    assert {e["task_id"] for e in shown_a} == alpha and len(shown_a) == len(alpha)
    shown_b = collect(node.base, KEY_B, start, "", len(beta))
    assert {e["task_id"] for e in shown_b} == beta and len(shown_b) == len(beta)


@pytest.mark.parametrize(
    "cursor",
    [
        "garbage",
        "c1.!!!",
        "c2.W1swLDAsLTFdXQ",  # another version
        "c1.W1swLDAsLTFdXQ",  # one partition, the node has 4
        "c1.W1s5OTk5OTksMCwtMV0sWzAsMCwtMV0sWzAsMCwtMV0sWzAsMCwtMV1d",  # past the end
        "c1.W1stMSwwLC0xXSxbMCwwLC0xXSxbMCwwLC0xXSxbMCwwLC0xXV0",  # a negative offset
    ],
)
def test_a_bad_cursor_is_a_400_naming_it(node: NodeProcess, cursor: str) -> None:
    status, reply = call(node.base, "GET", f"/v1/events?after={cursor}")
    assert status == 400, reply
    assert reply["error"]["field"] == "after"
    assert "cursor" in reply["error"]["message"]
    stream = Sse(node.base, KEY_A, last_event_id=cursor)  # the same through SSE's resume
    assert stream.response.status == 400
    assert json.loads(stream.response.read())["error"]["field"] == "after"
    stream.close()


def test_a_bad_filter_is_a_400(node: NodeProcess) -> None:
    status, reply = call(node.base, "GET", "/v1/events?state=DONE")
    assert (status, reply["error"]["field"]) == (400, "state")
    # spaces around a value are allowed, as the document's pattern says; a tab is not
    status, reply = call(node.base, "GET", "/v1/events?state=%20FAILED%20,CANCELED")
    assert status == 200, reply
    status, reply = call(node.base, "GET", "/v1/events?state=%09FAILED")
    assert (status, reply["error"]["field"]) == (400, "state")
    status, reply = call(node.base, "GET", "/v1/events?tenant=beta")
    assert (status, reply["error"]["field"]) == (400, "tenant")
    for bad in ("wait_ms=%C2%B2", "wait_ms=-1", "limit=0", "limit=1e3", "wait_ms=99999999"):
        status, reply = call(node.base, "GET", f"/v1/events?{bad}")
        assert status == 400, (bad, reply)  # a superscript digit was a 500
    status, reply = call(node.base, "GET", "/v1/webhooks/wh_x/deliveries?limit=%C2%B2")
    assert (status, reply["error"]["field"]) == (400, "limit")


def test_events_need_a_client_key(node: NodeProcess, tmp_path: Path) -> None:
    status, reply = call(node.base, "GET", "/v1/events", key=None)
    assert status == 401, reply


def test_the_clients_read_events_and_manage_webhooks(node: NodeProcess) -> None:
    start = tail_cursor(node.base)
    (task_id,) = enqueue(node.base, KEY_A, 1)
    with Client(node.base, KEY_A) as client:
        page = client.events(start, wait_s=5, type="task.enqueued")
        assert [e.task_id for e in page.events] == [task_id]
        with pytest.raises(ContractError):
            client.events("c1.bogus")
        # This node sends to public addresses only; a literal one is never resolved.
        hook = client.create_webhook("http://93.184.215.14/hook", ["task.failed"])
        assert hook.secret.startswith("whsec_")
        assert [h.webhook_id for h in client.webhooks()] == [hook.webhook_id]
        status, listed = call(node.base, "GET", "/v1/webhooks")  # what the node sends
        assert status == 200 and all("secret" not in h for h in listed["webhooks"]), listed
        assert Client(node.base, KEY_B).webhooks() == ()
        assert client.webhook_deliveries(hook.webhook_id) == ()
        client.delete_webhook(hook.webhook_id)
        assert client.webhooks() == ()

    async def read() -> Events:
        async with AsyncClient(node.base, KEY_A) as aclient:
            return await aclient.events(page.cursor, wait_s=0)

    assert asyncio.run(read()).events == []


def test_a_stream_that_is_not_read_holds_back_no_one_and_loses_nothing(node: NodeProcess) -> None:
    """A client that reads nothing while 3,000 events pass (a 4 KiB receive buffer) neither
    delays another reader nor misses an event once it reads. That its stream holds a bounded
    amount in the node follows from its queue and aiohttp's drain (``gateway/events.py`` rule
    4); this volume may fit in the sockets' buffers, so it is not measured here."""
    start = tail_cursor(node.base)
    stalled = socket.create_connection(("127.0.0.1", node.port))
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.sendall(
        f"GET /v1/events?after={start} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY_A}\r\n"
        "Accept: text/event-stream\r\n\r\n".encode()
    )
    ids = [t for _ in range(6) for t in enqueue(node.base, KEY_A, 500)]
    reader = Sse(node.base, KEY_A, f"?after={start}")  # another client reads meanwhile
    got = [d["task_id"] for _, _, d in reader.events(len(ids))]
    reader.close()
    assert sorted(got) == sorted(ids)
    stalled.settimeout(READ_TIMEOUT_S)
    seen, buffer = 0, b""
    while seen < len(ids):
        chunk = stalled.recv(65536)
        assert chunk, "the stalled stream was closed"
        buffer += chunk
        seen = buffer.count(b"\nevent: task.enqueued\n")
    stalled.close()
    assert all(task_id.encode() in buffer for task_id in ids)
