"""The SDK decodes replies with the contract's models (``conveyor.contract.replies``).

What the node may send (a null the document allows, an optional field left out, a field the
client does not know yet) decodes; what the contract does not allow is a ContractError naming
the field at fault, never a TypeError or KeyError from inside the client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import httpx
import pytest

import conveyor
from conveyor import wire
from conveyor.codecs import Compression, encode_value
from conveyor.contract import replies as contract
from conveyor.schemas.envelope import is_envelope

ERROR = {"class": "ValueError", "message": "bad size", "stack": "Traceback ..."}


def row(**fields: Any) -> dict[str, Any]:
    """A listing row (``TaskSummary``) as the node writes it, ``fields`` changed."""
    base: dict[str, Any] = {
        "task_id": "b" * 32,
        "app": "shop",
        "task_type": "resize",
        "queue": "images",
        "priority": 3,
        "status": "FAILED",
        "attempt": 2,
        "created_ms": 1_700_000_000_000,
        "updated_ms": 1_700_000_005_000,
        "run_at_ms": None,
        "finished_ms": 1_700_000_005_000,
        "error": ERROR,
        "cancel_requested": False,
    }
    return {**base, **fields}


def detail(**fields: Any) -> dict[str, Any]:
    """A ``GET /v1/tasks/{id}`` reply (``Task``), ``fields`` changed."""
    attempt = {
        "attempt": 1,
        "worker": "agent-1",
        "started_ms": 1_700_000_001_000,
        "finished_ms": 1_700_000_002_000,
        "outcome": "FAILED",
        "error": ERROR,
        "log_url": f"/v1/tasks/{'b' * 32}/logs/4",
    }
    base = row(
        payload={"image": "a.png"},
        result=None,
        checkpoint={"done": 3},
        attempts=[attempt],
        resume="latest",
    )
    return {**base, **fields}


def test_a_task_detail_decodes_into_the_sdk_view() -> None:
    info = wire.task_info(detail())
    assert info.task_id == "b" * 32 and info.status == "FAILED" and info.finished
    assert (info.queue, info.priority, info.attempt) == ("images", 3, 2)
    assert info.payload == {"image": "a.png"} and info.checkpoint == {"done": 3}
    assert info.error == conveyor.ErrorInfo(
        error_class="ValueError", message="bad size", stack="Traceback ..."
    )
    [attempt] = info.attempts
    assert attempt.worker == "agent-1" and attempt.outcome == "FAILED"
    assert attempt.log_url == f"/v1/tasks/{'b' * 32}/logs/4"
    assert conveyor.TaskInfo.from_json(detail()) == info


def test_a_null_priority_and_missing_optional_fields_decode() -> None:
    """The snapshot's rows have no priority (null): ``int(None)`` once crashed the client."""
    page = conveyor.TaskPage.from_json({"tasks": [row(priority=None, run_at_ms=None)]})
    assert page.tasks[0].priority is None and page.tasks[0].run_at_ms is None
    assert page.next_cursor is None and page.may_trail is False  # optional, left out
    info = wire.task_info(detail(priority=None, error=None))  # no app_version, waiting_for...
    assert info.priority is None and info.error is None


def test_fields_the_sdk_does_not_know_are_ignored() -> None:
    """A field added to a reply is not a breaking change for an older client."""
    info = wire.task_info(detail(waiting_for_event=None, unavailable={"payload": "gone"}))
    assert info.task_id == "b" * 32


def test_an_error_without_a_class_is_an_error_and_no_error_is_none() -> None:
    info = wire.task_info(detail(error={"class": None, "message": "lost", "stack": None}))
    assert info.error is not None and info.error.error_class == "Error"
    assert conveyor.ErrorInfo.from_json(None) is None


@pytest.mark.parametrize(
    ("reply", "field", "words"),
    [
        ({"tasks": [row(), row(priority="high")]}, "tasks[1].priority", "Expected `int | null`"),
        ({"tasks": [row(status="RUNNING")]}, "tasks[0].status", "Invalid enum value 'RUNNING'"),
        ({"tasks": [{k: v for k, v in row().items() if k != "app"}]}, "tasks[0].app", "missing"),
        ({"tasks": None}, "tasks", "Expected `array`, got `null`"),
        ([], None, "Expected `object`, got `array`"),
    ],
    ids=["wrong-type", "unknown-status", "missing-field", "null-list", "not-an-object"],
)
def test_a_reply_the_contract_refuses_is_a_contract_error_naming_the_field(
    reply: Any, field: str | None, words: str
) -> None:
    with pytest.raises(conveyor.ContractError) as err:
        conveyor.TaskPage.from_json(reply)
    assert err.value.field == field
    assert words in str(err.value) and "TaskPage" in str(err.value)
    assert "upgrade the older of the two" in str(err.value)


def test_a_nested_missing_field_is_named_by_its_path() -> None:
    reply = detail()
    del reply["attempts"][0]["attempt"]
    with pytest.raises(conveyor.ContractError) as err:
        wire.task_info(reply)
    assert err.value.field == "attempts[0].attempt"


def test_the_client_raises_a_contract_error_for_a_reply_it_cannot_read() -> None:
    def gateway(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/tasks":
            return httpx.Response(200, json={"task_id": "c" * 32, "created": "yes"})
        return httpx.Response(200, json=detail(attempt=None))

    with conveyor.Client("http://gw", "k", transport=httpx.MockTransport(gateway)) as client:
        with pytest.raises(conveyor.ContractError) as err:
            client.get("b" * 32)
        assert err.value.field == "attempt"
        with pytest.raises(conveyor.ContractError) as err:
            client.enqueue("resize", {}, app="shop")
        assert err.value.field == "created"


def test_operations_and_schedules_decode_through_their_models() -> None:
    op = conveyor.wire.OperationInfo.from_json(
        {"operation_id": "d" * 32, "kind": "retry", "state": "running", "matched": None}
    )
    assert op.matched is None and op.done == 0 and not op.finished
    with pytest.raises(conveyor.ContractError) as err:
        conveyor.wire.OperationInfo.from_json({"operation_id": "d" * 32, "kind": "rerun"})
    assert err.value.field == "kind"
    schedule = {
        "schedule_id": "nightly",
        "cron": "0 3 * * *",
        "timezone": "UTC",
        "overlap": "skip",
        "catch_up": "once",
        "task": {
            "task_type": "report",
            "app": "shop",
            "queue": "default",
            "priority": 0,
            "payload": None,
        },
        "next_fire_ms": 1_700_000_000_000,
        "last_fire_ms": None,
        "last_task_id": None,
        "fired": 0,
        "skipped": 0,
        "paused": False,
        "created_ms": 1_700_000_000_000,
        "updated_ms": 1_700_000_000_000,
    }
    [info] = wire.schedule_list({"schedules": [schedule]})
    assert (info.task_type, info.app, info.last_fire_ms) == ("report", "shop", None)
    with pytest.raises(conveyor.ContractError) as err:
        wire.schedule_list({"schedules": [{**schedule, "fired": -1}]})
    assert err.value.field == "schedules[0].fired"


def test_the_operator_replies_decode_through_their_models() -> None:
    """Cancel, event, rerun, schedule run and retry replies give the values the client always
    returned; one the contract refuses names its field."""
    old, new = "b" * 32, "c" * 32
    assert wire.canceled_status({"task_id": old, "status": "CANCELED"}) == "CANCELED"
    assert wire.event_status({"workflow_id": old, "name": "paid", "status": "WAITING"}) == (
        "WAITING"
    )
    assert wire.rerun_id({"task_id": old, "new_task_id": new, "created": True}) == new
    assert wire.schedule_run_id({"schedule_id": "n", "task_id": new, "created": False}) == new
    assert wire.retried({"retried": [{"task_id": old, "new_task_id": new}]}) == {old: new}
    with pytest.raises(conveyor.ContractError) as err:
        wire.canceled_status({"task_id": old, "status": "GONE"})
    assert err.value.field == "status"
    with pytest.raises(conveyor.ContractError) as err:
        wire.retried({"retried": [{"task_id": old}]})
    assert err.value.field == "retried[0].new_task_id"


HOOK = {
    "webhook_id": "w1",
    "url": "https://example.com/hook",
    "events": ["task.failed"],
    "task_types": None,
    "created_ms": 1_700_000_000_000,
    "note": "a field this client does not know",
}
CHILD = {"index": 0, "task_id": "c" * 32, "status": "SUCCEEDED", "created_ms": None}
PARALLEL = {
    "identity": "squares#0",
    "position": 0,
    "mode": "COLLECT",
    "total": 2,
    "fired": True,
    "created_ms": 1_700_000_000_000,
    "counts": {"SUCCEEDED": 2},
    "children": [CHILD, {**CHILD, "index": 1, "task_id": "d" * 32}],
    "children_truncated": False,
}
STEP = {"identity": "squares#0", "position": 0, "kind": "parallel", "state": "COMMITTED"}


def workflow_reply(**fields: Any) -> dict[str, Any]:
    """A ``GET /v1/workflows/{id}`` reply (``Workflow``), ``fields`` changed."""
    base = {
        "workflow": row(status="WAITING", error=None, resume="latest"),
        "steps": [{**STEP, "claims": 1}],
        "parallel": [PARALLEL],
    }
    return {**base, **fields}


def history_reply(*values: Any) -> dict[str, Any]:
    """A ``GET /v1/workflows/{id}/history`` page whose step rows hold ``values``."""
    steps = [
        {"identity": f"s{i}#0", "position": i, "claims": 1, "committed": True, "value": value}
        for i, value in enumerate(values)
    ]
    return {"steps": steps, "next_cursor": None}


def replies(workflow: Any, history: Any) -> dict[str, Any]:
    """What a node answers, by path: a workflow, its history, events and webhooks."""
    event = {
        "id": "e1",
        "type": "task.failed",
        "task_id": "b" * 32,
        "app": "shop",
        "task_type": "resize",
        "queue": "images",
        "status": "FAILED",
        "attempt": 2,
        "ts_ms": 1_700_000_005_000,
        "error": ERROR,
    }
    delivery = {"delivery_id": "e1", "event_type": "task.failed", "status": "failed"}
    return {
        f"/v1/workflows/{'b' * 32}": workflow,
        f"/v1/workflows/{'b' * 32}/history": history,
        "/v1/events": {"events": [event], "cursor": "c1.x"},
        "/v1/webhooks": {"webhooks": [HOOK]},
        "/v1/webhooks/w1/deliveries": {
            "webhook_id": "w1",
            "deliveries": [{**delivery, "attempts": 3, "last_status": 500}],
        },
    }


def client_of(answers: dict[str, Any], codec: Any = None) -> conveyor.Client:
    def gateway(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            return httpx.Response(200, json={**HOOK, "secret": "whsec_x"})
        return httpx.Response(200, json=answers[request.url.path])

    return conveyor.Client("http://gw", "k", codec=codec, transport=httpx.MockTransport(gateway))


def test_workflow_event_and_webhook_replies_are_the_contracts_models() -> None:
    with client_of(replies(workflow_reply(), history_reply({"n": 1}))) as client:
        wf = client.get_workflow("b" * 32)
        assert isinstance(wf, contract.Workflow)
        assert wf.workflow.status == "WAITING" and wf.workflow.resume == "latest"
        assert wf.steps[0].kind == "parallel" and wf.steps[0].started_ms is None
        assert wf.parallel[0].counts == {"SUCCEEDED": 2}
        assert [c.task_id for c in wf.parallel[0].children] == ["c" * 32, "d" * 32]
        page = client.workflow_history("b" * 32)
        assert isinstance(page, contract.WorkflowHistory)
        assert page.steps[0].value == {"n": 1} and page.next_cursor is None
        events = client.events("c0.x")
        assert isinstance(events, contract.Events) and events.cursor == "c1.x"
        assert events.events[0].error == ERROR and events.events[0].agent_id is None
        hook = client.create_webhook("https://example.com/hook", ["task.failed"])
        assert isinstance(hook, contract.NewWebhook) and hook.secret == "whsec_x"
        (listed,) = client.webhooks()
        assert type(listed) is contract.Webhook and listed.webhook_id == "w1"
        assert listed.task_types is None and not hasattr(listed, "note")  # unknown: left out
        (delivery,) = client.webhook_deliveries("w1")
        assert isinstance(delivery, contract.Delivery)
        assert (delivery.status, delivery.attempts, delivery.last_status) == ("failed", 3, 500)
        assert delivery.next_attempt_ms is None  # optional, left out


def test_the_async_client_decodes_the_same_replies_to_the_same_models() -> None:
    answers = replies(workflow_reply(), history_reply({"n": 1}))
    with client_of(answers) as client:
        expected = (
            client.get_workflow("b" * 32),
            client.workflow_history("b" * 32),
            client.events(),
            client.create_webhook("https://example.com/hook", ["task.failed"]),
            client.webhooks(),
            client.webhook_deliveries("w1"),
        )

    async def read() -> tuple[Any, ...]:
        aclient = conveyor.AsyncClient("http://127.0.0.1:1", "k")

        async def send(method: str, path: str, **_: Any) -> Any:
            return {**HOOK, "secret": "whsec_x"} if method == "POST" else answers[path]

        aclient._send = send  # type: ignore[method-assign]
        return (
            await aclient.get_workflow("b" * 32),
            await aclient.workflow_history("b" * 32),
            await aclient.events(),
            await aclient.create_webhook("https://example.com/hook", ["task.failed"]),
            await aclient.webhooks(),
            await aclient.webhook_deliveries("w1"),
        )

    assert asyncio.run(read()) == expected


def test_payload_envelopes_in_a_workflow_reply_are_decoded_by_the_clients_codec() -> None:
    """A step's value, and each result of a parallel step, reach the caller as the code sent
    them; a client without the codec sees the envelopes the node holds."""
    codec = Compression(threshold_bytes=1)
    quote, square = "a quote " * 20, [4] * 50
    sealed = [encode_value(codec, v) for v in (quote, square)]
    assert all(is_envelope(v) for v in sealed)
    history = history_reply(sealed[0], {"results": [sealed[1], None]})
    with client_of(replies(workflow_reply(), history), codec=codec) as client:
        page = client.workflow_history("b" * 32)
        assert [s.value for s in page.steps] == [quote, {"results": [square, None]}]
        assert client.get_workflow("b" * 32).parallel[0].counts == {"SUCCEEDED": 2}
    with client_of(replies(workflow_reply(), history)) as plain:
        assert plain.workflow_history("b" * 32).steps[0].value == sealed[0]
    assert wire.workflow_history_page(codec, history) == page  # the decode both clients call


@pytest.mark.parametrize(
    ("path", "reply", "field", "model"),
    [
        ("/v1/workflows/" + "b" * 32, workflow_reply(parallel=None), "parallel", "Workflow"),
        (
            "/v1/workflows/" + "b" * 32,
            workflow_reply(parallel=[{**PARALLEL, "mode": "ANY"}]),
            "parallel[0].mode",
            "Workflow",
        ),
        (
            "/v1/workflows/" + "b" * 32,
            workflow_reply(steps=[{**STEP, "state": "CLAIMED"}]),
            "steps[0].claims",
            "Workflow",
        ),
        (f"/v1/workflows/{'b' * 32}/history", {"steps": []}, "next_cursor", "WorkflowHistory"),
        ("/v1/events", {"events": [], "cursor": None}, "cursor", "Events"),
        (
            "/v1/webhooks",
            {"webhooks": [{**HOOK, "events": "task.failed"}]},
            "webhooks[0].events",
            "Webhooks",
        ),
        (
            "/v1/webhooks/w1/deliveries",
            {"webhook_id": "w1", "deliveries": [{"delivery_id": "e1", "status": "failed"}]},
            "deliveries[0].event_type",
            "Deliveries",
        ),
    ],
    ids=[
        "null-list",
        "unknown-mode",
        "missing-claims",
        "missing-cursor",
        "null-cursor",
        "string-for-list",
        "missing-event-type",
    ],
)
def test_a_malformed_workflow_or_webhook_reply_is_a_contract_error_naming_the_field(
    path: str, reply: Any, field: str, model: str
) -> None:
    calls: dict[str, Callable[[conveyor.Client], object]] = {
        "/v1/workflows/" + "b" * 32: lambda c: c.get_workflow("b" * 32),
        f"/v1/workflows/{'b' * 32}/history": lambda c: c.workflow_history("b" * 32),
        "/v1/events": lambda c: c.events(),
        "/v1/webhooks": lambda c: c.webhooks(),
        "/v1/webhooks/w1/deliveries": lambda c: c.webhook_deliveries("w1"),
    }
    with client_of({path: reply}) as client, pytest.raises(conveyor.ContractError) as err:
        calls[path](client)
    assert err.value.field == field
    assert f"({model} at {field}:" in str(err.value), err.value
    assert "upgrade the older of the two" in str(err.value)
