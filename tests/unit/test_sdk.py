"""The SDK without a server: durations, decorator options on the wire, arity, client retries.

The client tests put an ``httpx.MockTransport`` under the real ``Client``/``AsyncClient``: the
transport plays a gateway that loses acks and answers 503, and records what was sent.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import conveyor
from conveyor.ahttp import proxy_for
from conveyor.context import Context
from conveyor.durations import to_ms
from conveyor.wire import MINTED_KEY_PREFIX, Enqueue, enqueue_body

# --- durations --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "ms"),
    [
        (0, 0),
        (1, 1_000),
        (1.5, 1_500),
        (timedelta(minutes=2), 120_000),
        ("250ms", 250),
        ("10s", 10_000),
        ("10m", 600_000),
        ("1h30m", 5_400_000),
        ("1.5h", 5_400_000),
        ("2d", 172_800_000),
        ("1m30s", 90_000),
        ("45", 45_000),
        (" 1H ", 3_600_000),
    ],
)
def test_durations_become_integer_milliseconds(value: Any, ms: int) -> None:
    assert to_ms(value) == ms


@pytest.mark.parametrize("bad", ["", "10x", "m10", "1h 30m", "-5s", -1, True, None, [1], "1e3s"])
def test_bad_durations_are_contract_errors_naming_the_option(bad: Any) -> None:
    with pytest.raises(conveyor.ContractError) as err:
        to_ms(bad, field="timeout")
    assert "timeout" in str(err.value)
    assert err.value.field == "timeout"


def test_a_bad_duration_fails_at_decoration_time() -> None:
    app = conveyor.App("t")
    with pytest.raises(conveyor.ContractError, match="cancel_grace"):

        @app.task(cancel_grace="soon")
        def handler(payload: Any) -> None: ...


# --- the decorator and the wire ---------------------------------------------------------------


def make_app() -> tuple[conveyor.App, Any, Any]:
    app = conveyor.App("shop")

    @app.task(
        name="resize",
        queue="images",
        priority=7,
        retry=conveyor.Retry(
            attempts=3, base="500ms", factor=3, cap="10m", non_retryable=(KeyError,)
        ),
        timeout="10m",
        schedule_to_start=60,
        schedule_to_close=timedelta(hours=2),
        cancel_grace="5s",
    )
    def resize_image(ctx: Context, payload: dict[str, Any]) -> str:
        return "resized"

    @app.task
    def plain(payload: int) -> int:
        return payload + 1

    return app, resize_image, plain


def test_decorator_options_become_wire_fields() -> None:
    _, resize, _ = make_app()
    body = enqueue_body(Enqueue(resize, {"image": "a.png"}), None)
    key = body.pop("idempotency_key")
    assert isinstance(key, str) and key.startswith(MINTED_KEY_PREFIX) and len(key) <= 64
    assert body == {
        "task_type": "resize",
        "app": "shop",
        "payload": {"image": "a.png"},
        "queue": "images",
        "priority": 7,
        "retry": {
            "attempts_max": 3,
            "backoff_base_ms": 500,
            "backoff_factor": 3.0,
            "backoff_cap_ms": 600_000,
            "non_retryable": ["KeyError"],
        },
        "timeouts": {
            "schedule_to_start_ms": 60_000,
            "start_to_close_ms": 600_000,
            "schedule_to_close_ms": 7_200_000,
        },
        "cancel_grace_ms": 5_000,
    }


def test_enqueue_options_override_the_task_defaults() -> None:
    _, resize, _ = make_app()
    body = enqueue_body(
        Enqueue(resize, None, queue="bulk", priority=0, timeout=None, delay="90s"), None
    )
    assert body["queue"] == "bulk" and body["priority"] == 0
    assert body["timeouts"]["start_to_close_ms"] is None
    assert body["timeouts"]["schedule_to_start_ms"] == 60_000  # the default stays
    assert body["delay_ms"] == 90_000 and "run_at" not in body


def test_a_task_named_by_string_needs_an_app_and_sends_only_what_was_given() -> None:
    with pytest.raises(conveyor.ContractError, match="needs an app"):
        enqueue_body(Enqueue("resize", 1), None)
    body = enqueue_body(Enqueue("resize", 1, idempotency_key="k1"), "shop")
    assert body == {
        "task_type": "resize",
        "app": "shop",
        "payload": 1,
        "idempotency_key": "k1",
    }


def test_run_at_is_rfc3339_and_excludes_delay() -> None:
    when = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    assert enqueue_body(Enqueue("t", app="a", run_at=when), None)["run_at"] == (
        "2030-01-02T03:04:05Z"
    )
    with pytest.raises(conveyor.ContractError, match="exclusive"):
        enqueue_body(Enqueue("t", app="a", run_at=when, delay=1), None)
    with pytest.raises(conveyor.ContractError, match="timezone"):
        enqueue_body(Enqueue("t", app="a", run_at=datetime(2030, 1, 1)), None)


@pytest.mark.parametrize("priority", [-1, 10, True, "3"])
def test_priority_is_checked(priority: Any) -> None:
    app = conveyor.App("t")
    with pytest.raises(conveyor.ContractError, match="priority"):
        app.task(priority=priority)


def test_the_decorated_function_stays_callable_and_named() -> None:
    app, resize, plain = make_app()
    assert plain(41) == 42
    assert resize(None, {}) == "resized"
    assert plain.name == "plain" and resize.name == "resize"
    assert set(app.tasks) == {"resize", "plain"}
    with pytest.raises(conveyor.ContractError, match="already has"):
        app.task(name="plain")(lambda p: p)


# --- arity --------------------------------------------------------------------------------------


def test_arity_decides_whether_the_handler_gets_a_context() -> None:
    app = conveyor.App("t")

    @app.task
    def two(ctx: Any, payload: Any) -> Any: ...

    @app.task
    def one(payload: Any) -> Any: ...

    @app.task
    async def async_two(ctx: Any, payload: Any) -> Any: ...

    @app.task
    def defaulted(ctx: Any, payload: Any = None) -> Any: ...

    assert two.takes_context and async_two.takes_context and defaulted.takes_context
    assert not one.takes_context
    assert async_two.is_async and not two.is_async

    @app.task
    def three(a: Any, b: Any, c: Any) -> None: ...  # Celery-style arguments (conveyor.typed)

    @app.task
    def none() -> None: ...

    assert three.binding.style == "arguments" and not three.takes_context
    assert none.binding.style == "none"
    with pytest.raises(conveyor.ContractError, match="keyword-only"):

        @app.task
        def starred(ctx: Any, *, flag: bool) -> None: ...


def test_non_retryable_matches_subclasses_and_names() -> None:
    retry = conveyor.Retry(non_retryable=(ValueError, "KeyError"))
    assert retry.matches(json.JSONDecodeError("x", "", 0))  # a ValueError subclass
    assert retry.matches(KeyError("k"))
    assert not retry.matches(RuntimeError())
    assert retry.class_names() == ["ValueError", "KeyError"]


def test_checkpoints_must_be_json() -> None:
    sent: list[Any] = []

    class Channel:
        def heartbeat(self, progress: Any) -> None: ...

        def checkpoint(self, value: Any) -> None:
            sent.append(value)

    ctx = Context(task_id="t", task_type="x", attempt=1, checkpoint=None, channel=Channel())
    ctx.checkpoint({"cursor": 3})
    assert ctx.last_checkpoint == {"cursor": 3} and sent == [{"cursor": 3}]
    with pytest.raises(conveyor.ContractError, match="JSON"):
        ctx.checkpoint(object())
    assert not ctx.cancelled
    ctx.request_cancel()
    assert ctx.cancelled
    with pytest.raises(conveyor.Cancelled):
        ctx.raise_if_cancelled()


# --- the client over a flaky transport ----------------------------------------------------------


def task_reply(**fields: Any) -> dict[str, Any]:
    """A ``GET /v1/tasks/{id}`` reply as the contract states it, ``fields`` changed."""
    reply: dict[str, Any] = {
        "task_id": "a" * 32,
        "app": "shop",
        "task_type": "resize",
        "queue": "default",
        "priority": 0,
        "status": "ENQUEUED",
        "attempt": 1,
        "created_ms": 1_700_000_000_000,
        "updated_ms": 1_700_000_000_000,
        "run_at_ms": None,
        "finished_ms": None,
        "error": None,
        "cancel_requested": False,
        "payload": {"image": "a.png"},
        "result": None,
        "checkpoint": None,
        "attempts": [],
        "resume": "latest",
    }
    return {**reply, **fields}


class FlakyGateway:
    """Answers POST /v1/tasks: first by losing the ack (the request arrived, the reply did
    not), then 503, then for real. Dedupes by idempotency key like the platform does. Serves
    the sync client as an ``httpx.MockTransport`` and the async one as a real aiohttp route."""

    def __init__(self, failures: list[str]) -> None:
        self.failures = failures
        self.bodies: list[dict[str, Any]] = []
        self.tasks: dict[str, str] = {}  # idempotency key -> task id

    def answer(self, body: dict[str, Any]) -> tuple[int, dict[str, Any], dict[str, str]] | None:
        """Status, JSON and headers of the reply; None when the ack is lost."""
        self.bodies.append(body)
        created = body["idempotency_key"] not in self.tasks
        task_id = self.tasks.setdefault(body["idempotency_key"], f"{len(self.tasks):032x}")
        if self.failures:
            if self.failures.pop(0) == "lost-ack":
                return None
            return 503, {"error": {}}, {"Retry-After": "0"}
        reply = {"task_id": task_id, "created": created, "status": "ENQUEUED"}
        return 201 if created else 200, reply, {}

    def __call__(self, request: httpx.Request) -> httpx.Response:
        answer = self.answer(json.loads(request.content))
        if answer is None:
            raise httpx.ReadError("connection reset by peer", request=request)
        status, body, headers = answer
        return httpx.Response(status, headers=headers, json=body)

    async def serve(self, request: web.Request) -> web.StreamResponse:
        answer = self.answer(await request.json())
        if answer is None:
            assert request.transport is not None
            request.transport.abort()  # the request arrived; no reply leaves
            return web.Response()
        status, body, headers = answer
        return web.json_response(body, status=status, headers=headers)


def test_transport_retries_reuse_the_minted_idempotency_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("conveyor.client.backoff_s", lambda attempt, after=None: 0.0)
    gateway = FlakyGateway(["lost-ack", "503"])
    _, resize, _ = make_app()
    with conveyor.Client("http://gw", "key", transport=httpx.MockTransport(gateway)) as client:
        handle = client.enqueue(resize, {"image": "a.png"})
    keys = {b["idempotency_key"] for b in gateway.bodies}
    assert len(gateway.bodies) == 3 and len(keys) == 1
    assert len(gateway.tasks) == 1  # one task, not three
    assert handle.id == gateway.tasks[keys.pop()]


def test_each_enqueue_call_mints_a_new_key_and_a_given_key_is_kept() -> None:
    gateway = FlakyGateway([])
    with conveyor.Client("http://gw", "key", transport=httpx.MockTransport(gateway)) as client:
        client.enqueue("t", 1, app="a")
        client.enqueue("t", 1, app="a")
        client.enqueue("t", 1, app="a", idempotency_key="order-7")
        again = client.enqueue("t", 1, app="a", idempotency_key="order-7")
    assert [b["idempotency_key"] for b in gateway.bodies][2:] == ["order-7", "order-7"]
    assert gateway.bodies[0]["idempotency_key"] != gateway.bodies[1]["idempotency_key"]
    assert not again.created


def test_enqueue_many_sends_batches_of_1000_with_a_key_each() -> None:
    seen: list[int] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        tasks = json.loads(request.content)["tasks"]
        seen.append(len(tasks))
        assert len({t["idempotency_key"] for t in tasks}) == len(tasks)
        return httpx.Response(
            200,
            json={
                "results": [
                    {"task_id": f"{i:032x}", "created": True, "status": "ENQUEUED"}
                    for i, _ in enumerate(tasks)
                ]
            },
        )

    with conveyor.Client("http://gw", "k", app="a", transport=httpx.MockTransport(gateway)) as c:
        handles = c.enqueue_many([("t", i) for i in range(2500)])
    assert seen == [1000, 1000, 500] and len(handles) == 2500


def test_server_errors_become_typed_errors_with_the_server_message() -> None:
    def gateway(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/cancel"):
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no task"}})
        return httpx.Response(
            400,
            json={
                "error": {
                    "code": "unknown_task_type",
                    "message": "app shop has no task type 'resise'",
                    "field": "task_type",
                }
            },
        )

    with conveyor.Client("http://gw", "k", transport=httpx.MockTransport(gateway)) as client:
        with pytest.raises(conveyor.ContractError) as err:
            client.enqueue("resise", app="shop")
        assert err.value.code == "unknown_task_type" and err.value.field == "task_type"
        assert "resise" in str(err.value)
        with pytest.raises(conveyor.NotFound, match="no task"):
            client.cancel("0" * 32)


def test_result_long_polls_and_raises_task_failed() -> None:
    waits: list[str | None] = []

    def gateway(request: httpx.Request) -> httpx.Response:
        waits.append(request.url.params.get("wait_ms"))
        status = "LEASED" if len(waits) == 1 else "FAILED"
        error = {"class": "FatalError", "message": "bad payload", "stack": "..."}
        return httpx.Response(200, json=task_reply(status=status, error=error))

    with conveyor.Client("http://gw", "k", transport=httpx.MockTransport(gateway)) as client:
        handle = conveyor.TaskHandle(client, "a" * 32)
        with pytest.raises(conveyor.TaskFailed) as err:
            handle.result(timeout=60)
    assert err.value.state == "FAILED" and err.value.error_class == "FatalError"
    assert "bad payload" in str(err.value)
    assert len(waits) == 2 and all(w is not None and int(w) > 0 for w in waits)


def test_async_client_retries_with_the_same_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("conveyor.aclient.backoff_s", lambda attempt, after=None: 0.0)
    gateway = FlakyGateway(["lost-ack", "lost-ack", "503"])
    server_app = web.Application()
    server_app.router.add_post("/v1/tasks", gateway.serve)

    async def main() -> str:
        async with TestServer(server_app, host="127.0.0.1") as server:
            url = str(server.make_url("/"))
            async with conveyor.AsyncClient(url, "k", app="a") as c:
                handle = await c.enqueue("t", {"x": 1})
                return handle.id

    task_id = asyncio.run(main())
    assert len({b["idempotency_key"] for b in gateway.bodies}) == 1
    assert len(gateway.bodies) == 4 and task_id == next(iter(gateway.tasks.values()))


def test_task_enqueue_uses_the_default_client() -> None:
    _, resize, _ = make_app()
    calls: list[tuple[Any, Any]] = []

    class Recorder:
        def enqueue(self, task: Any, payload: Any = None, **opts: Any) -> str:
            calls.append((task, payload))
            return "handle"

    previous = conveyor.set_default_client(Recorder())
    try:
        assert resize.enqueue({"image": "b.png"}) == "handle"
    finally:
        conveyor.set_default_client(previous)
    assert calls == [(resize, {"image": "b.png"})]


def test_a_workflow_resume_policy_is_checked_at_decoration_and_sent_when_pinned() -> None:
    app = conveyor.App("shop")
    with pytest.raises(conveyor.ContractError, match=r"resume=.*'latest', 'pinned'.*'sticky'"):
        app.workflow(resume="sticky")
    pinned = app.workflow(name="checkout", resume="pinned")(lambda ctx, order: order)
    assert enqueue_body(Enqueue(pinned, 1), None)["resume"] == "pinned"

    @app.workflow
    def latest(ctx: Context, order: int) -> int:
        return order

    assert "resume" not in enqueue_body(Enqueue(latest, 1), None)  # the default


def test_the_async_clients_take_the_proxy_from_the_environment_like_the_sync_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("HTTP_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "localhost,gw.near")
    assert proxy_for("http://gw.far:7400") == "http://proxy.internal:3128"
    assert proxy_for("http://gw.near:7400") is None
    assert proxy_for("https://gw.far") is None  # no HTTPS_PROXY: straight there
    monkeypatch.delenv("HTTP_PROXY")
    assert proxy_for("http://gw.far:7400") is None


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("pay\u202eyalp", "U+202E at index 3"),
        ("pay\x07", "U+0007 at index 3"),
        ("pay out", "U+0020"),
    ],
    ids=["bidi_override", "control_char", "space"],
)
def test_a_name_the_gateway_would_refuse_fails_at_decoration(name: str, shown: str) -> None:
    """Names are what ``conveyor.schemas.limits`` allows (the gateway answers 400 to others):
    found when the module is imported, not at the first enqueue."""
    app, got = conveyor.App("shop"), re.escape(shown)
    with pytest.raises(conveyor.ContractError, match=rf"task name must be .*; got {got}"):
        app.task(name=name)(lambda p: p)
    with pytest.raises(conveyor.ContractError, match=r"pass name=\.\.\."):
        app.task(lambda p: p)  # a lambda's __name__ is "<lambda>"
    with pytest.raises(conveyor.ContractError, match=rf"queue must be .*; got {got}"):
        app.task(queue=name)
    with pytest.raises(conveyor.ContractError, match=rf"app must be .*; got {got}"):
        conveyor.App(name)
    assert app.task(name="shop.tasks:resize-v2")(lambda p: p).name == "shop.tasks:resize-v2"
    assert app.tasks.keys() == {"shop.tasks:resize-v2"}
