"""Request bodies decode through the contract's models (``contract/requests.py``): a refusal
names the field, what it takes and what was sent, and the checks no type states still run."""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import pytest

from conveyor.contract.shapes import NAME_PATTERN, TASK_ID_PATTERN, TEXT_PATTERN
from conveyor.errors import ContractError
from conveyor.schemas.types import TaskStatus
from conveyor.streams.gateway import openapi, reruns, schedules, validation, workflows
from conveyor.streams.gateway import worker_requests as w

LEASE = {"task_id": "c" * 32, "lease_id": 1}


def refusal(parse: Any, body: Any) -> tuple[str | None, str]:
    with pytest.raises(ContractError) as info:
        parse(body)
    return info.value.field, str(info.value)


@pytest.mark.parametrize(
    ("parse", "body", "field", "words"),
    [
        (w.parse_poll, [], None, "body: must be an object, got an array"),
        (w.parse_poll, {"app": "shop"}, "agent_id", "is required (1..200 bytes of UTF-8"),
        (w.parse_poll, {"agent_id": "a", "app": "s", "capacity": 0}, "capacity", "1..1000, got 0"),
        (w.parse_poll, {"agent_id": "a\n", "app": "s"}, "agent_id", "control characters"),
        (w.parse_poll, {"agent_id": "a", "app": "s", "queues": ["é" * 150]}, "queues[0]", "300"),
        (w.parse_register, {"agent_id": "a", "app": "shop\n", "task_types": []}, "app", "U+000A"),
        (
            w.parse_register,
            {"agent_id": "a", "app": "s", "task_types": ["a b"]},
            "task_types[0]",
            "U+0020",
        ),
        (
            w.parse_heartbeat,
            {"leases": [{"task_id": "c" * 32}]},
            "leases[0].lease_id",
            "is required (an integer 0..9223372036854775807)",
        ),
        (w.parse_heartbeat, {"leases": []}, "leases", "1..1000 items, got 0 items"),
        (
            w.parse_complete,
            {"completions": [{**LEASE, "outcome": "SLEEP"}]},
            "completions[0].sleep",
            "is required with outcome SLEEP",
        ),
        (
            w.parse_complete,
            {"completions": [{**LEASE, "outcome": "FAILED", "error": {"message": "é" * 9000}}]},
            "completions[0].error.message",
            "at most 16384 bytes of UTF-8, got 18000 bytes",
        ),
        (
            w.parse_complete,
            {"completions": [{**LEASE, "outcome": "FAILED", "log": "x" * 70000}]},
            "completions[0].log",
            "got 70000 characters",
        ),
        (
            w.parse_steps,
            {"steps": [{**LEASE, "op": "CLAIM", "identity": "a", "position": -2}]},
            "steps[0].position",
            "must be an integer -1..",
        ),
        (
            w.parse_checkpoint,
            {"checkpoints": [{**LEASE, "value": {"$blob": "x"}}]},
            "checkpoints[0].value",
            "reserved",
        ),
    ],
)
def test_worker_bodies_are_refused_naming_the_field(
    parse: Any, body: Any, field: str | None, words: str
) -> None:
    at, message = refusal(parse, body)
    assert at == field and words in message, message


def test_worker_bodies_decode_to_the_handlers_values() -> None:
    poll = w.parse_poll({"agent_id": "a", "app": "shop", "wait_ms": 250.0, "task_types": ["x"]})
    assert (poll.wait_ms, poll.capacity, poll.task_types, poll.open_breakers) == (
        250,
        8,
        frozenset({"x"}),
        [],
    )
    fan_out = {"identity": "p#0", "position": 2, "mode": "COLLECT", "children": [{"a": 1}]}
    (done,) = w.parse_complete(
        {"completions": [{**LEASE, "outcome": "FAN_OUT", "fan_out": fan_out}]}
    )
    assert done.fan_out is not None and done.fan_out.children == [{"a": 1}]
    assert done.error_class is None and done.sleep is None and done.path == "completions[0]"
    assert w.parse_signals({"agent_id": "a", "app": "shop"}).wait_ms == 20_000


def test_operator_bodies_decode_through_the_models_with_their_rules() -> None:
    retry = validation.parse_retry({"filter": {"status": "failed", "queue": "q"}, "limit": 5})
    assert retry.filter is not None and retry.filter.statuses == {TaskStatus.FAILED}
    assert validation.parse_retry({"filter": {"status": ""}}).filter == validation.TaskFilter()
    field, message = refusal(validation.parse_retry, {"filter": {"status": ["LEASED"]}})
    assert field == "filter.status" and "FAILED tasks only" in message
    field, message = refusal(validation.parse_retry, {"task_ids": [], "filter": {}})
    assert field == "task_ids" and "1..1000 items, got 0 items" in message
    field, message = refusal(validation.parse_bulk_cancel, {"filter": {"status": "done"}})
    assert field == "filter.status" and "unknown status 'DONE'" in message
    assert validation.parse_cancel({"reason": ""}) == "canceled by request"
    field, message = refusal(validation.parse_cancel, {"reason": "x" * 1025})
    assert field == "reason" and "got 1025 characters" in message
    assert reruns.parse_run({"idempotency_key": "k-1"}) == "k-1"
    field, message = refusal(reruns.parse_run, {"idempotency_key": "k\n"})
    assert field == "idempotency_key" and "control characters" in message
    name, payload = workflows.parse_event({"name": "approved", "payload": {"by": "ann"}})
    assert (name, payload) == ("approved", b'{"by":"ann"}')
    field, message = refusal(workflows.parse_event, {"name": "a" * 123})
    assert field == "name" and "1..122 characters" in message


def test_a_schedule_decodes_with_its_cron_checked_in_its_own_words() -> None:
    task = {"task_type": "e", "app": "a"}
    body: dict[str, Any] = {
        "schedule_id": "s",
        "cron": "@daily",
        "overlap": "SKIP",
        "task": task,
    }
    sched = schedules.parse_schedule(body)
    assert (sched.overlap, sched.timezone, sched.task.path) == ("SKIP", "UTC", "task")
    field, message = refusal(schedules.parse_schedule, {**body, "cron": "* * * * * *"})
    assert field == "cron" and "expected 5 fields" in message
    field, message = refusal(schedules.parse_schedule, {**body, "task": {**task, "run_at": "x"}})
    assert field == "task.run_at"


def test_a_final_line_feed_is_refused_as_the_document_refuses_it() -> None:
    """Python's ``$`` matches before a final line feed, JSON Schema's does not; the shared
    patterns are anchored so that both refuse it, wherever a model is decoded."""
    ok = {"task_type": "echo", "app": "shop"}
    for body, field in (
        ({**ok, "task_type": "echo\n"}, "task_type"),
        ({**ok, "queue": "q\n"}, "queue"),
        ({**ok, "idempotency_key": "k\n"}, "idempotency_key"),
    ):
        at, message = refusal(validation.parse_task, body)
        assert at == field and ("U+000A" in message or "control characters" in message), message
    register = {"agent_id": "a", "app": "shop", "version": "1", "task_types": ["echo\n"]}
    at, _ = refusal(w.parse_register, register)
    assert at == "task_types[0]"
    for pattern in (NAME_PATTERN, TEXT_PATTERN, TASK_ID_PATTERN):
        assert re.search(pattern, "0" * 32) and not re.search(pattern, "0" * 32 + "\n")


DOCUMENT = openapi.document()
SCHEDULE = {"schedule_id": "s", "cron": "@daily", "task": {"task_type": "e", "app": "a"}}


def _document_takes(component: str, body: Any) -> bool:
    schema = {"$ref": f"#/components/schemas/{component}", "components": DOCUMENT["components"]}
    return bool(jsonschema.Draft202012Validator(schema).is_valid(body))


def _node_takes(parse: Any, body: Any) -> bool:
    try:
        parse(copy.deepcopy(body))  # the parsers write the normalised names into the body
    except ContractError:
        return False
    return True


@pytest.mark.parametrize(
    ("component", "parse", "body", "taken"),
    [
        *(
            ("RetryRequest", validation.parse_retry, {"filter": {"status": status}}, taken)
            for status, taken in (
                (["failed"], True),
                (["Failed", " FAILED "], True),
                ("failed , FAILED", True),
                ("", True),  # no status named: any, as a listing reads it
                (["", "failed"], True),
                (["leased"], False),
                ("fail", False),
                ("failed\n", False),
                (["\tfailed"], False),
            )
        ),
        *(
            ("BulkCancelRequest", validation.parse_bulk_cancel, {"filter": {"status": s}}, t)
            for s, t in ((["enqueued", "Leased"], True), ("sleeping,waiting", True))
        ),
        (
            "BulkCancelRequest",
            validation.parse_bulk_cancel,
            {"filter": {"status": "failed"}},
            False,
        ),
        *(
            ("ScheduleRequest", schedules.parse_schedule, {**SCHEDULE, name: value}, taken)
            for name, value, taken in (
                ("overlap", "skip", True),
                ("overlap", "SKIP", True),
                ("overlap", "Cancel_Previous", True),
                ("catch_up", "NONE", True),
                ("overlap", "later", False),
                ("overlap", "skip\n", False),
                ("catch_up", " once", False),
            )
        ),
    ],
)
def test_statuses_and_schedule_policies_are_taken_in_any_case_as_the_document_says(
    component: str, parse: Any, body: Any, taken: bool
) -> None:
    """The node reads a filter's statuses and a schedule's policies in any case (callers
    send failed and FAILED alike); the document says so, so neither refuses what the other
    takes."""
    assert _node_takes(parse, body) is taken
    assert _document_takes(component, body) is taken


@pytest.mark.parametrize(
    ("status", "taken"),
    [("failed,Leased", True), (" enqueued ", True), ("", True), ("failed,,x", False)],
)
def test_the_listings_status_query_is_read_in_any_case_as_the_document_says(
    status: str, taken: bool
) -> None:
    assert _node_takes(validation.parse_list_query, {"status": status}) is taken
    pattern = DOCUMENT["paths"]["/v1/tasks"]["get"]["parameters"]
    (param,) = [p for p in pattern if p["name"] == "status"]
    assert bool(re.search(param["schema"]["pattern"], status)) is taken
