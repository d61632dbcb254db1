"""Webhooks over real sockets: ``conveyor node`` processes delivering to an aiohttp receiver on
127.0.0.1 that checks every delivery with ``standardwebhooks``' ``Webhook.verify``.

Tasks are driven through the worker protocol by the test (poll, complete, cancel), so every
terminal event it expects is one it caused. The outage and kill -9 tests share a node (the
second kills it with -9 and starts it again); the address policy and the retry window need
nodes of their own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from standardwebhooks import Webhook, WebhookVerificationError

from tests.integration.test_gateway import (
    KEY_A,
    KEY_B,
    NodeProcess,
    call,
    complete,
    free_port,
    poll,
    write_keys,
)

pytestmark = pytest.mark.timeout(150)

APP = "hooks"
TERMINAL = ["task.succeeded", "task.failed", "task.canceled"]
FAST = ("--webhooks-allow-private", "--webhooks-backoff-max-s", "1")


class Receiver:
    """An HTTP server on 127.0.0.1 in a thread of its own; ``stop``/``start`` take it down and
    bring it back on the same port. ``status`` is what it answers a verified delivery."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/hook"
        self.secret: str | None = None
        self.status = 200
        self.attempts: list[str] = []  # the webhook-id of every verified request
        self.delivered: dict[str, dict[str, Any]] = {}  # webhook-id -> body, on 2xx answers
        self.bodies: dict[str, set[str]] = {}  # webhook-id -> every raw body seen with it
        self.refused: list[str] = []  # requests that failed verification
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.Response:
        raw = await request.read()
        try:
            assert self.secret is not None
            body = Webhook(self.secret).verify(raw, dict(request.headers))
        except (WebhookVerificationError, AssertionError) as exc:
            self.refused.append(repr(exc))
            return web.Response(status=400)
        msg_id = request.headers["webhook-id"]
        self.attempts.append(msg_id)
        self.bodies.setdefault(msg_id, set()).add(raw.decode())
        if 200 <= self.status < 300:
            self.delivered[msg_id] = body
        return web.Response(status=self.status)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_post("/hook", self._handle)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def start(self) -> None:
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self._loop).result(10)

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def task_ids(self) -> dict[str, str]:
        """task id -> the webhook-id it was delivered with (one per task: asserted)."""
        found: dict[str, str] = {}
        for msg_id, body in list(self.delivered.items()):
            task_id = body["data"]["task_id"]
            assert found.setdefault(task_id, msg_id) == msg_id, f"{task_id}: two webhook-ids"
        return found


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    r.start()
    try:
        yield r
    finally:
        r.close()


def start_node(tmp_path: Path, name: str, *flags: str) -> NodeProcess:
    home = tmp_path / name
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection", *flags))
    proc.start()
    body = {"agent_id": "setup", "app": APP, "version": "1", "task_types": ["echo"]}
    assert call(proc.base, "POST", "/worker/register", body)[0] == 200
    return proc


@contextlib.contextmanager
def running(tmp_path: Path, name: str, *flags: str) -> Iterator[NodeProcess]:
    proc = start_node(tmp_path, name, *flags)
    try:
        yield proc
    finally:
        proc.stop(signal.SIGTERM)


@pytest.fixture(scope="module")
def fast_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """Loopback allowed, at most 1 s between attempts, the default retry window."""
    node = start_node(tmp_path_factory.mktemp("webhooks"), "fast", *FAST)
    try:
        yield node
    finally:
        node.stop()


def create_hook(base: str, url: str, events: list[str] = TERMINAL, **extra: Any) -> dict[str, Any]:
    status, reply = call(base, "POST", "/v1/webhooks", {"url": url, "events": events, **extra})
    assert status == 201, reply
    assert reply["secret"].startswith("whsec_")
    return dict(reply)


def run_tasks(base: str, n: int) -> dict[str, str]:
    """Enqueue ``n`` tasks and end each: a third succeed, a third fail (FATAL), a third are
    canceled. task id -> the terminal event type expected."""
    body = {"tasks": [{"task_type": "echo", "app": APP, "payload": {"i": i}} for i in range(n)]}
    status, reply = call(base, "POST", "/v1/tasks:batch", body)
    assert status in (200, 201), reply
    ids = [r["task_id"] for r in reply["results"]]
    expected: dict[str, str] = {}
    for task_id in ids[2 * n // 3 :]:
        assert call(base, "POST", f"/v1/tasks/{task_id}/cancel")[0] == 200
        expected[task_id] = "task.canceled"
    leased: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while len(leased) < 2 * n // 3 and time.monotonic() < deadline:
        leased += poll(base, APP, capacity=2 * n // 3 - len(leased))
    assert len(leased) == 2 * n // 3
    for i, lease in enumerate(leased):
        if i % 2:
            complete(base, lease, outcome="FATAL", error={"class": "Boom", "message": "no"})
            expected[lease["task_id"]] = "task.failed"
        else:
            complete(base, lease)
            expected[lease["task_id"]] = "task.succeeded"
    return expected


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def deliveries(base: str, webhook_id: str, **query: str) -> list[dict[str, Any]]:
    qs = "&".join(f"{k}={v}" for k, v in {"limit": "1000", **query}.items())
    status, reply = call(base, "GET", f"/v1/webhooks/{webhook_id}/deliveries?{qs}")
    assert status == 200, reply
    return list(reply["deliveries"])


def check_delivered(receiver: Receiver, expected: dict[str, str]) -> None:
    got = receiver.task_ids()
    assert set(got) == set(expected), f"missing: {set(expected) - set(got)}"
    for msg_id, body in receiver.delivered.items():
        assert body["type"] == expected[body["data"]["task_id"]]
        assert msg_id == body["data"]["id"]
    # A duplicate is only ever the same delivery again: one body per webhook-id.
    assert all(len(bodies) == 1 for bodies in receiver.bodies.values())
    assert receiver.refused == []


def test_every_terminal_event_is_delivered_after_the_receiver_was_down(
    fast_node: NodeProcess, receiver: Receiver
) -> None:
    node = fast_node
    hook = create_hook(node.base, receiver.url, task_types=["echo"])
    try:
        _outage(node, receiver, hook)
    finally:
        call(node.base, "DELETE", f"/v1/webhooks/{hook['webhook_id']}")


def _outage(node: NodeProcess, receiver: Receiver, hook: dict[str, Any]) -> None:
    receiver.secret = hook["secret"]
    expected = run_tasks(node.base, 9)
    wait_for(lambda: len(receiver.delivered) == 9, 20, "the first deliveries")
    receiver.stop()
    expected |= run_tasks(node.base, 15)
    time.sleep(10)  # down ~10 s: attempts fail with connection refused meanwhile
    pending = deliveries(node.base, hook["webhook_id"], status="pending")
    assert len(pending) == 15
    assert all(d["attempts"] >= 1 and d["last_error"] for d in pending)
    receiver.start()
    wait_for(lambda: set(receiver.task_ids()) == set(expected), 30, "every delivery")
    check_delivered(receiver, expected)
    wait_for(
        lambda: not deliveries(node.base, hook["webhook_id"], status="pending"),
        10,
        "no pending delivery",
    )
    listed = deliveries(node.base, hook["webhook_id"])
    assert {d["status"] for d in listed} == {"succeeded"}
    assert max(d["attempts"] for d in listed) > 1  # the outage was seen and retried


def test_a_kill_9_of_the_node_loses_no_pending_delivery(
    fast_node: NodeProcess, receiver: Receiver
) -> None:
    node = fast_node
    hook = create_hook(node.base, receiver.url)
    receiver.secret = hook["secret"]
    receiver.stop()  # every delivery stays pending
    expected = run_tasks(node.base, 12)
    wait_for(
        lambda: len(deliveries(node.base, hook["webhook_id"], status="pending")) >= 4,
        15,
        "pending deliveries",
    )
    assert node.stop(signal.SIGKILL) == -signal.SIGKILL
    node.start()  # the same home and port
    status, listed = call(node.base, "GET", "/v1/webhooks")
    assert status == 200
    assert hook["webhook_id"] in [h["webhook_id"] for h in listed["webhooks"]]
    assert all("secret" not in h for h in listed["webhooks"])
    body = {"agent_id": "setup", "app": APP, "version": "1", "task_types": ["echo"]}
    assert call(node.base, "POST", "/worker/register", body)[0] == 200
    expected |= run_tasks(node.base, 6)
    receiver.start()
    wait_for(lambda: set(receiver.task_ids()) == set(expected), 30, "every delivery")
    check_delivered(receiver, expected)


def test_private_addresses_are_refused_unless_allowed(tmp_path: Path, receiver: Receiver) -> None:
    with running(tmp_path, "strict") as node:
        for url in (
            receiver.url,  # loopback
            "http://localhost:9/hook",  # a name for loopback
            "http://10.1.2.3/hook",
            "http://192.168.0.10/hook",
            "http://169.254.169.254/latest/meta-data",  # link-local: cloud metadata
            "http://[::1]:9/hook",
            "http://[::ffff:127.0.0.1]:9/hook",
            "http://0.0.0.0:9/hook",
        ):
            status, reply = call(
                node.base, "POST", "/v1/webhooks", {"url": url, "events": TERMINAL}
            )
            assert status == 400, (url, reply)
            assert reply["error"]["field"] == "url"
            assert "--webhooks-allow-private" in reply["error"]["message"]
        for url in ("ftp://example.com/x", "http://user:pw@example.com/x", "not a url"):
            status, reply = call(
                node.base, "POST", "/v1/webhooks", {"url": url, "events": TERMINAL}
            )
            assert (status, reply["error"]["field"]) == (400, "url"), url
        status, reply = call(node.base, "GET", "/v1/webhooks")
        assert reply["webhooks"] == []  # nothing was stored
        # A public address is taken (it is never reached here: no test sends to it).
        hook = create_hook(node.base, "http://93.184.215.14/hook")
        status, _ = call(node.base, "DELETE", f"/v1/webhooks/{hook['webhook_id']}")
        assert status == 200
        cli_round_trip(node)


def conveyor(node: NodeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "conveyor.cli", "webhooks", *args]
    cmd += ["--url", node.base, "--api-key", KEY_A]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def cli_round_trip(node: NodeProcess) -> None:
    """``conveyor webhooks create|list|deliveries|delete``, and a refusal in one line."""
    made = conveyor(node, "create", "http://93.184.215.14/hook", "--event", "task.failed", "--json")
    assert made.returncode == 0, made.stderr
    hook = json.loads(made.stdout)
    listed = conveyor(node, "list", "--json")
    assert [h["webhook_id"] for h in json.loads(listed.stdout)] == [hook["webhook_id"]]
    assert hook["secret"] not in listed.stdout
    shown = conveyor(node, "deliveries", hook["webhook_id"], "--json")
    assert (shown.returncode, json.loads(shown.stdout)) == (0, [])
    assert conveyor(node, "delete", hook["webhook_id"]).returncode == 0
    refused = conveyor(node, "create", "http://10.0.0.1/x", "--event", "task.failed")
    assert refused.returncode != 0
    assert "private" in refused.stderr and "Traceback" not in refused.stderr


def test_a_failed_delivery_is_redelivered_with_the_same_webhook_id(
    tmp_path: Path, receiver: Receiver
) -> None:
    flags = ("--webhooks-allow-private", "--webhooks-retry-s", "1")
    flags += ("--webhooks-backoff-max-s", "0.2")
    with running(tmp_path, "redeliver", *flags) as node:
        hook = create_hook(node.base, receiver.url, events=["task.canceled"])
        receiver.secret, receiver.status = hook["secret"], 500
        expected = {k: v for k, v in run_tasks(node.base, 3).items() if v == "task.canceled"}
        wait_for(
            lambda: len(deliveries(node.base, hook["webhook_id"], status="failed")) == 1,
            20,
            "the delivery to fail for good",
        )
        (failed,) = deliveries(node.base, hook["webhook_id"], status="failed")
        assert failed["last_status"] == 500 and failed["last_error"] == "HTTP 500"
        assert failed["attempts"] >= 1
        tried = set(receiver.attempts)
        assert tried == {failed["delivery_id"]}
        receiver.status = 200
        path = f"/v1/webhooks/{hook['webhook_id']}/deliveries/{failed['delivery_id']}:redeliver"
        status, reply = call(node.base, "POST", path)
        assert (status, reply["status"]) == (200, "pending")
        wait_for(lambda: len(receiver.delivered) == 1, 10, "the redelivery")
        check_delivered(receiver, expected)
        assert set(receiver.delivered) == tried  # the same webhook-id as the failed attempts
        (done,) = deliveries(node.base, hook["webhook_id"])
        assert done["status"] == "succeeded"
        # Another tenant sees neither the webhook nor its deliveries; a wrong id is a 404.
        assert call(node.base, "POST", path, key=KEY_B)[0] == 404
        assert (
            call(node.base, "GET", f"/v1/webhooks/{hook['webhook_id']}/deliveries", key=KEY_B)[0]
            == 404
        )
        assert call(node.base, "GET", "/v1/webhooks", key=KEY_B)[1] == {"webhooks": []}
        wrong = f"/v1/webhooks/{hook['webhook_id']}/deliveries/evt_0_0_9:redeliver"
        assert call(node.base, "POST", wrong, key=KEY_A)[0] == 404
