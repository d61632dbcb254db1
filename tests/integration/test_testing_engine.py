"""``conveyor.testing.Engine``: the real node (RocksDB + local log) behind the real gateway
on loopback, and a real agent running handlers in-process, on a fake clock. What users' own
tests will look like."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import conveyor
import conveyor.testing

pytestmark = pytest.mark.timeout(120)

app = conveyor.App("engine-tests")
seen: dict[str, list[Any]] = {}


def note(key: str, value: Any) -> None:
    seen.setdefault(key, []).append(value)


@app.task
def double(payload: int) -> int:
    return payload * 2


@app.task(retry=conveyor.Retry(attempts=5, base="1s"))
def flaky(ctx: conveyor.Context, payload: dict[str, Any]) -> int:
    if ctx.attempt < payload["succeed_on"]:
        raise RuntimeError(f"attempt {ctx.attempt} failed")
    return ctx.attempt


@app.task
async def fatal(ctx: conveyor.Context, payload: Any) -> None:
    raise conveyor.FatalError("the payload is not an order")


@app.task(retry=conveyor.Retry(attempts=5, non_retryable=(ValueError,)))
def strict(ctx: conveyor.Context, payload: str) -> Any:
    if payload == "json":
        return json.loads("{not json")  # JSONDecodeError: a ValueError subclass
    if payload == "key":
        raise KeyError("missing")
    raise ValueError("bad value")


@app.task(retry=conveyor.Retry(attempts=3, base="1s"))
def resumable(ctx: conveyor.Context, payload: int) -> Any:
    note("resumable", (ctx.attempt, ctx.last_checkpoint))
    if ctx.attempt == 1:
        ctx.checkpoint({"cursor": payload})
        raise RuntimeError("crashed half way")
    return ctx.last_checkpoint


@app.task(cancel_grace="30s")
def patient(ctx: conveyor.Context, payload: str) -> str:
    note(payload, "started")
    if ctx.wait_cancelled(timeout=30):
        note(payload, "saw cancel")
        return "stopped"
    return "finished"


@app.task(timeout="10s", cancel_grace="5s", retry=conveyor.Retry(attempts=1))
def slow(ctx: conveyor.Context, payload: str) -> str:
    note(payload, "started")
    if ctx.wait_cancelled(timeout=30):
        note(payload, "saw cancel")
    return "late"


@pytest.fixture(scope="module")
def engine() -> Iterator[conveyor.testing.Engine]:
    with conveyor.testing.Engine(app) as running:
        yield running


def wait_for(what: str, check: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_success(engine: conveyor.testing.Engine) -> None:
    handle = engine.client.enqueue(double, 21)
    assert handle.result(timeout=10) == 42
    info = handle.get()
    assert info.status == "SUCCEEDED" and info.payload == 21 and info.attempt == 1


def test_task_enqueue_sugar_uses_the_engine(engine: conveyor.testing.Engine) -> None:
    handle = double.enqueue(5)
    assert handle.result(timeout=10) == 10


def test_retry_then_success(engine: conveyor.testing.Engine) -> None:
    handle = engine.client.enqueue(flaky, {"succeed_on": 3})
    engine.run_until_idle()
    assert handle.status() == "RETRY_WAIT"  # backoff is fake time: nothing moves by itself
    engine.drain()
    assert handle.result() == 3
    info = handle.get()
    assert [(a.attempt, a.outcome) for a in info.attempts] == [
        (1, "FAILED"),
        (2, "FAILED"),
        (3, "SUCCEEDED"),
    ]
    assert info.attempts[0].error is not None
    assert info.attempts[0].error.error_class == "RuntimeError"


def test_fatal_error_fails_at_once_and_result_raises(engine: conveyor.testing.Engine) -> None:
    handle = engine.client.enqueue(fatal, {"order": None})
    engine.run_until_idle()
    info = handle.get()
    assert info.status == "FAILED" and info.attempt == 1
    assert info.error is not None and info.error.error_class == "FatalError"
    with pytest.raises(conveyor.TaskFailed) as err:
        handle.result()
    assert err.value.state == "FAILED" and "not an order" in str(err.value)


@pytest.mark.parametrize(
    ("payload", "error_class"), [("value", "ValueError"), ("json", "JSONDecodeError")]
)
def test_non_retryable_classes_fail_without_retries(
    engine: conveyor.testing.Engine, payload: str, error_class: str
) -> None:
    handle = engine.client.enqueue(strict, payload)
    engine.run_until_idle()
    info = handle.get()
    assert (info.status, info.attempt) == ("FAILED", 1)
    assert info.error is not None and info.error.error_class == error_class


def test_non_retryable_by_name_at_enqueue(engine: conveyor.testing.Engine) -> None:
    retry = conveyor.Retry(attempts=5, non_retryable=("KeyError",))
    handle = engine.client.enqueue(strict, "key", retry=retry)
    engine.run_until_idle()
    assert (handle.status(), handle.get().attempt) == ("FAILED", 1)


def test_delay_fires_after_advance(engine: conveyor.testing.Engine) -> None:
    handle = engine.client.enqueue(double, 4, delay="10m")
    engine.run_until_idle()
    assert handle.status() == "ENQUEUED"
    engine.advance("9m")
    assert handle.status() == "ENQUEUED"
    engine.advance(60)
    assert handle.status() == "SUCCEEDED" and handle.result() == 8


def test_cancel_a_waiting_task(engine: conveyor.testing.Engine) -> None:
    handle = engine.client.enqueue(double, 1, delay="1h")
    assert handle.cancel() == "CANCELED"
    engine.advance("2h")
    assert handle.status() == "CANCELED"
    with pytest.raises(conveyor.TaskFailed):
        handle.result()


def test_cancel_reaches_a_running_handler(engine: conveyor.testing.Engine) -> None:
    handle = engine.client.enqueue(patient, "cancel-me")
    wait_for("the handler to start", lambda: seen.get("cancel-me") == ["started"])
    engine.client.cancel(handle.id)
    engine.run_until_idle()
    assert seen["cancel-me"] == ["started", "saw cancel"]
    assert handle.status() == "CANCELED"


def test_start_to_close_asks_the_handler_to_stop(engine: conveyor.testing.Engine) -> None:
    handle = engine.client.enqueue(slow, "too-slow")
    wait_for("the handler to start", lambda: seen.get("too-slow") == ["started"])
    engine.advance("11s")
    info = handle.get()
    assert seen["too-slow"] == ["started", "saw cancel"]
    assert info.status == "FAILED" and info.error is not None
    assert info.error.error_class == "StartToCloseTimeout"


def test_checkpoint_is_seen_by_the_next_attempt(engine: conveyor.testing.Engine) -> None:
    handle = engine.client.enqueue(resumable, 7)
    engine.drain()
    assert handle.result() == {"cursor": 7}
    assert seen["resumable"] == [(1, None), (2, {"cursor": 7})]
    assert handle.get().checkpoint == {"cursor": 7}


def test_idempotency_key_returns_the_first_task(engine: conveyor.testing.Engine) -> None:
    first = engine.client.enqueue(double, 1, idempotency_key="order-1")
    again = engine.client.enqueue(double, 1, idempotency_key="order-1")
    assert first.created and not again.created and again.id == first.id


@pytest.mark.parametrize(
    ("payload", "options", "named"),
    [(2, {}, "payload"), (1, {"queue": "slow"}, "queue"), (1, {"priority": 3}, "priority")],
)
def test_a_key_that_names_another_task_is_the_409s_conflict(
    engine: conveyor.testing.Engine, payload: int, options: dict[str, Any], named: str
) -> None:
    """As over HTTP: the same error class the SDK raises for a 409, and nothing created."""
    first = engine.client.enqueue(double, 1, idempotency_key=f"twin-{named}")
    with pytest.raises(conveyor.Conflict, match=f"{first.id}, which differs in {named}"):
        engine.client.enqueue(double, payload, idempotency_key=f"twin-{named}", **options)
    again = engine.client.enqueue(double, 1, idempotency_key=f"twin-{named}")
    assert (again.id, again.created) == (first.id, False)


def test_unknown_task_type_is_a_contract_error(engine: conveyor.testing.Engine) -> None:
    """The gateway's own 400, naming the field and the types the agent registered."""
    with pytest.raises(conveyor.ContractError, match="'nope' is not registered") as caught:
        engine.client.enqueue("nope", 1)
    assert caught.value.field == "task_type" and "double" in str(caught.value)


def test_list_and_retry_failed(engine: conveyor.testing.Engine) -> None:
    handle = engine.client.enqueue(fatal, "again")
    engine.run_until_idle()
    failed = engine.client.list(status="FAILED", task_type="fatal")
    assert handle.id in {t.task_id for t in failed.tasks}
    retried = engine.client.retry_failed([handle.id])
    assert list(retried) == [handle.id] and retried[handle.id] != handle.id
    engine.run_until_idle()
    assert engine.client.get(retried[handle.id]).status == "FAILED"
    assert engine.client.get(retried[handle.id]).payload == "again"


def test_the_in_memory_engine_works_too() -> None:
    with conveyor.testing.Engine(app, durable=False) as memory:
        assert memory.client.enqueue(double, 3).result(timeout=10) == 6


release = threading.Event()


@app.task
def holds(payload: str) -> str:
    note(payload, "started")
    assert release.wait(30), "the test never released the handler"
    return "done"


def test_a_long_jump_of_fake_time_keeps_a_running_handlers_lease(
    engine: conveyor.testing.Engine,
) -> None:
    """The gateway grants leases of an hour at most; a jump of a day while a handler runs is
    taken in steps with the agent's leases renewed between them, so the attempt is not lost
    and the task succeeds on its first attempt."""
    release.clear()
    handle = engine.client.enqueue(holds, "long-jump")
    wait_for("the handler to start", lambda: seen.get("long-jump") == ["started"])
    engine.advance("1d", settle=False)
    assert handle.status() == "LEASED"
    release.set()
    engine.run_until_idle()
    info = handle.get()
    assert (info.status, info.attempt, handle.result()) == ("SUCCEEDED", 1, "done")


def test_the_client_is_a_conveyor_client_on_the_gateway_over_loopback(
    engine: conveyor.testing.Engine,
) -> None:
    """The same replies as a deployed node, from the same code: an unknown task is the
    gateway's 404, a request with a key it does not know its 401."""
    assert isinstance(engine.client, conveyor.Client)
    assert engine.url.startswith("http://127.0.0.1:")
    with pytest.raises(conveyor.NotFound):
        engine.client.get("0" * 32)
    stranger = conveyor.Client(
        engine.url, "cvk_not-a-key", retries=0, transport=httpx.HTTPTransport()
    )
    with stranger, pytest.raises(conveyor.Unauthorized):
        stranger.list()


def test_a_proxy_named_in_the_environment_is_not_between_a_test_and_the_engine(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CI machines often set $HTTP_PROXY: the client and the agent reach the engine's loopback
    port directly (through the dead proxy set here, nothing would run)."""
    for name in ("HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    with conveyor.testing.Engine(app, durable=False) as engine:
        handle = engine.client.enqueue(double, 4)
        engine.run_until_idle()
        assert handle.result() == 8
