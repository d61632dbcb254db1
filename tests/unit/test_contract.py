"""The HTTP contract: the OpenAPI document is generated from the models that validate, every
route the gateway registers is an operation of it, and what the document allows the
validators accept (requests generated from the document itself, no server)."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import msgspec
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from openapi_spec_validator import validate
from schemathesis.core import NotSet
from schemathesis.generation.modes import GenerationMode

from conveyor import wire
from conveyor.contract import replies
from conveyor.errors import ContractError
from conveyor.schemas.types import Attempt, CancelCause, EventWait, Task, TaskStatus
from conveyor.store.memory import MemoryKV
from conveyor.streams.gateway import openapi, render, schedules, validation, worker_requests
from conveyor.streams.gateway.app import build_app
from conveyor.streams.gateway.auth import KeyStore
from conveyor.streams.gateway.contract import decode
from conveyor.streams.gateway.contract import requests as req
from conveyor.streams.gateway.contract.operations import (
    NOT_OPERATIONS,
    OPERATIONS,
    REGISTRY_OPERATIONS,
)
from conveyor.streams.gateway.registry import Registry
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.node import Node


def _registered_routes() -> set[tuple[str, str]]:
    node = Node(MemoryLog(1), MemoryLog(1), [MemoryKV()])
    app = build_app(node, KeyStore({}), Registry())
    out = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter") or ""
        path = re.sub(r"\{(\w+):[^}]*\}", r"{\1}", path)  # {path:.*} -> {path}
        out.add((route.method.lower(), path))
    return out


def test_every_route_is_an_operation_of_a_document_and_back() -> None:
    routes = {(m, p) for m, p in _registered_routes() if p not in NOT_OPERATIONS}
    documented = {(op.method, op.path) for op in OPERATIONS + REGISTRY_OPERATIONS}
    missing = sorted(routes - documented)
    assert not missing, f"routes with no row in contract/operations.py: {missing}"
    assert not sorted(documented - routes), "rows in contract/operations.py with no route"


def test_the_documents_are_valid_openapi_and_say_what_is_required() -> None:
    for doc in (openapi.document(), openapi.registry_document()):
        validate(doc)
        ids = [op["operationId"] for item in doc["paths"].values() for op in item.values()]
        assert len(ids) == len(set(ids)), "operationIds are unique"
        for name, schema in doc["components"]["schemas"].items():
            assert schema.get("required") != [], name
    tasks = openapi.document()["components"]["schemas"]["TaskRequest"]
    assert tasks["required"] == ["task_type", "app"]
    assert tasks["properties"]["retry"]["anyOf"][0] == {"$ref": "#/components/schemas/RetryPolicy"}
    factor = openapi.document()["components"]["schemas"]["RetryPolicy"]["properties"]
    assert factor["backoff_factor"]["anyOf"][0]["maximum"] == validation.BACKOFF_FACTOR_MAX


def _accepts(parse: Callable[[Any], Any]) -> Callable[[Any], None]:
    def check(body: Any) -> None:
        parse(body)

    return check


# operationId -> the parser of its body, as the handler calls it.
PARSERS: dict[str, Callable[[Any], Any]] = {
    "enqueue_task": validation.parse_task,
    "enqueue_workflow": validation.parse_task,
    # enqueue_tasks: its items are enqueue_task's bodies (generating 1000-item batches is slow)
    "upsert_schedule": schedules.parse_schedule,
    "retry_tasks": validation.parse_retry,
    "cancel_tasks": validation.parse_bulk_cancel,
    "cancel_task": validation.parse_cancel,
    "register_agent": worker_requests.parse_register,
    "poll": worker_requests.parse_poll,
    "heartbeat": worker_requests.parse_heartbeat,
    "wait_signals": worker_requests.parse_signals,
    "complete": worker_requests.parse_complete,
    "checkpoint": worker_requests.parse_checkpoint,
    "record_steps": worker_requests.parse_steps,
}
QUERIES: dict[str, Callable[[Any], Any]] = {
    "list_tasks": validation.parse_list_query,
    "get_task": validation.parse_wait_ms,
}


@pytest.fixture(scope="module")
def schema() -> Any:
    return schemathesis.openapi.from_dict(openapi.document())


def _operation(schema: Any, operation_id: str) -> Any:
    op = next(o for o in OPERATIONS if o.operation_id == operation_id)
    return schema[op.path][op.method.upper()]


def _stringify(query: dict[str, Any]) -> dict[str, str]:
    """A query as the server reads it: every value a string."""
    out = {}
    for name, value in query.items():
        if "<" in name:  # payload.<field>: a pattern of names, not a parameter
            continue
        if isinstance(value, bool):
            value = str(value).lower()
        out[name] = value if isinstance(value, str) else str(value)
    return out


EXAMPLES = 10


@pytest.mark.parametrize("operation_id", sorted(PARSERS))
def test_what_the_document_allows_the_validators_accept(schema: Any, operation_id: str) -> None:
    parse = PARSERS[operation_id]

    @given(
        case=_operation(schema, operation_id).as_strategy(generation_mode=GenerationMode.POSITIVE)
    )
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        body = None if isinstance(case.body, NotSet) else case.body  # a body left out
        try:
            parse(body)
        except ContractError as exc:
            raise AssertionError(f"schema-valid body refused: {exc}\n{case.body!r}") from None

    run()


@pytest.mark.parametrize("operation_id", sorted(QUERIES))
def test_query_parameters_the_document_allows_are_accepted(schema: Any, operation_id: str) -> None:
    parse = QUERIES[operation_id]

    @given(
        case=_operation(schema, operation_id).as_strategy(generation_mode=GenerationMode.POSITIVE)
    )
    @settings(
        max_examples=EXAMPLES,
        derandomize=True,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        parse(_stringify(case.query or {}))

    run()


def test_decode_errors_name_the_field_and_what_to_send() -> None:
    ok = {"task_type": "echo", "app": "shop"}
    cases = [
        (
            {"tasks": [ok, {**ok, "priority": "high"}]},
            "tasks[1].priority",
            'must be an integer 0..9, got "high"',
        ),
        (
            {"tasks": [ok, {**ok, "retry": {"x": 1}}]},
            "tasks[1].retry.x",
            "unknown field; expected one of: attempts_max",
        ),
        ({"tasks": [{"app": "shop"}]}, "tasks[0].task_type", "is required (1..200 characters"),
        ({"tasks": []}, "tasks", "must be an array of 1..1000 items, got 0 items"),
        ({"tasks": [{**ok, "queue": "a b"}]}, "tasks[0].queue", "U+0020"),
    ]
    for body, field, words in cases:
        with pytest.raises(ContractError) as info:
            decode.model(body, req.TaskBatch)
        assert info.value.field == field, str(info.value)
        assert str(info.value).startswith(f"{field}: ") and words in str(info.value), str(
            info.value
        )


def test_the_rules_no_type_states_are_in_the_document_and_checked() -> None:
    schemas = openapi.document()["components"]["schemas"]
    assert "not" in schemas["TaskRequest"]  # delay_ms and run_at, not both
    assert "allOf" in schemas["Completion"]  # SLEEP needs sleep, ...
    both = {"task_type": "echo", "app": "shop", "delay_ms": 1, "run_at": "2030-01-01T00:00:00Z"}
    with pytest.raises(ContractError, match="exclusive"):
        validation.parse_task(both)
    assert re.fullmatch(req.CRON_PATTERN, "0 9 * * 1-5")
    assert not re.fullmatch(req.CRON_PATTERN, "")
    assert not re.fullmatch(req.CRON_PATTERN, "0 0 0 1 *")  # no day 0


def test_the_reply_models_name_every_task_status() -> None:
    """``replies.Status`` spells the machine's statuses out (the SDK imports the models, not
    the machine's types): the two lists are one."""
    assert list(replies.Status.__args__) == [s.value for s in TaskStatus]  # type: ignore[attr-defined]


def machine_task(**fields: Any) -> Task:
    base: dict[str, Any] = {
        "task_id": "e" * 32,
        "tenant": "default",
        "app": "shop",
        "task_type": "resize",
        "queue": "images",
        "priority": 4,
        "status": TaskStatus.LEASED,
        "attempt": 2,
        "budget_base": 0,
        "lease_id": 7,
        "created_ms": 1_700_000_000_000,
        "run_at_ms": 1_700_000_000_000,
        "updated_ms": 1_700_000_003_000,
        "ready_seq": 0,
        "version": 12,
        "cancel_grace_ms": 0,
        "agent_id": "agent-2",
        "leased_ms": 1_700_000_002_000,
        "cancel_cause": CancelCause.CANCEL,
        "resume": "pinned",
        "app_version": "v3",
    }
    return Task(**{**base, **fields})


def test_what_the_node_renders_is_what_the_models_state_and_the_sdk_reads() -> None:
    """The task replies are rendered through the models; decoded strictly (every pattern and
    bound of the document checked), they read back, and the SDK's views read them."""
    failed = Attempt(
        task_id="e" * 32,
        attempt=1,
        lease_id=6,
        agent_id="agent-1",
        started_ms=1_700_000_001_000,
        finished_ms=1_700_000_001_500,
        outcome="FAILED",
        error_class="ValueError",
        error_message="bad size",
    )
    task = machine_task()
    detail = render.task_detail(
        task, [failed], payload={"image": "a.png"}, result=None, checkpoint=None, logged={6}
    )
    sent = msgspec.json.encode(detail)
    assert msgspec.json.decode(sent, type=replies.Task) == detail
    info = wire.task_info(msgspec.json.decode(sent))
    assert (info.status, info.priority, info.cancel_requested) == ("LEASED", 4, True)
    assert [a.attempt for a in info.attempts] == [1, 2]  # the one under way from the task row
    assert info.attempts[0].error is not None and info.attempts[0].log_url is not None
    assert info.attempts[1].worker == "agent-2" and info.attempts[1].outcome is None

    waiting = machine_task(status=TaskStatus.WAITING, cancel_cause=None)
    wait = EventWait(identity="approve", position=0, name="approved")
    why, event = render.waiting(waiting, wait, [])
    assert why is not None and "approved" in why
    assert event == replies.EventWaiting(name="approved", step="approve", deadline_ms=None)

    summary = render.task_summary(machine_task(status=TaskStatus.ENQUEUED, run_at_ms=1))
    page = msgspec.json.encode(replies.TaskPage(tasks=[summary], next_cursor=None))
    [row] = msgspec.json.decode(page, type=replies.TaskPage).tasks
    assert row.status == "ENQUEUED" and row.error is None
    assert wire.TaskPage.from_json(msgspec.json.decode(page)).tasks[0].task_id == "e" * 32
