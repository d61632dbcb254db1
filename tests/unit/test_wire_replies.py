"""The SDK decodes replies with the contract's models (``conveyor.contract.replies``).

What the node may send (a null the document allows, an optional field left out, a field the
client does not know yet) decodes; what the contract does not allow is a ContractError naming
the field at fault, never a TypeError or KeyError from inside the client.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

import conveyor
from conveyor import wire

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


def test_the_client_checks_workflow_and_webhook_replies_and_returns_them_as_sent() -> None:
    hook = {
        "webhook_id": "w1",
        "url": "https://example.com/hook",
        "events": ["task.failed"],
        "task_types": None,
        "created_ms": 1_700_000_000_000,
        "note": "a field this client does not know",
    }
    history = {
        "steps": [
            {"identity": "a", "position": 0, "claims": 1, "committed": True, "value": {"n": 1}}
        ],
        "next_cursor": None,
    }

    def gateway(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/webhooks":
            return httpx.Response(200, json={"webhooks": [hook]})
        if request.url.path.endswith("/history"):
            return httpx.Response(200, json=history)
        workflow = row(resume="latest")
        return httpx.Response(200, json={"workflow": workflow, "steps": [], "parallel": None})

    with conveyor.Client("http://gw", "k", transport=httpx.MockTransport(gateway)) as client:
        assert client.webhooks() == (hook,)
        assert client.workflow_history("b" * 32)["steps"][0]["value"] == {"n": 1}
        with pytest.raises(conveyor.ContractError) as err:
            client.get_workflow("b" * 32)
        assert err.value.field == "parallel"
