"""Gateway request validation: pure functions, no server. Every rejection names its field."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.errors import ContractError
from conveyor.schemas.types import Outcome, TaskStatus
from conveyor.streams.gateway.errors import PayloadTooLarge, classify
from conveyor.streams.gateway.fields import (
    BODY_BYTES_MAX,
    DEPTH_MAX,
    _check,
    _HugeInt,
    _sound,
    check_name,
    compact,
    is_name,
    parse_json,
)
from conveyor.streams.gateway.validation import (
    BATCH_MAX,
    parse_batch,
    parse_bulk_cancel,
    parse_list_query,
    parse_retry,
    parse_task,
    parse_wait_ms,
    to_spec,
)
from conveyor.streams.gateway.worker_requests import (
    parse_complete,
    parse_heartbeat,
    parse_poll,
    parse_register,
    parse_steps,
)

OK = {"task_type": "echo", "app": "shop"}


def rejects(fn: Any, body: Any, field: str | None) -> ContractError:
    with pytest.raises(ContractError) as info:
        fn(body)
    assert info.value.field == field, str(info.value)
    if field is not None:
        assert str(info.value).startswith(f"{field}: ")
    return info.value


# --- parse_json ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        (b"", None, "empty"),
        (b'{"a": ', None, "malformed JSON"),
        (b'{"a": "\xff"}', None, "UTF-8"),
        (b'{"a": 1, "a": 2}', None, "duplicate key"),
        (b'{"a": NaN}', "a", "finite"),
        (b'{"a": [Infinity]}', "a[0]", "finite"),
        (b'{"a": {"b": 1e999}}', "a.b", "finite"),
        (b'{"n": 9223372036854775808}', "n", "64-bit"),
        (b'{"n": -9223372036854775809}', "n", "64-bit"),
        (b'{"n": 1' + b"0" * 5000 + b"}", "n", "64-bit"),
        (b'{"s": "\\udc80"}', "s", "surrogate"),
        (b'{"\\ud800": 1}', None, "surrogate"),
    ],
)
def test_parse_json_rejects(raw: bytes, field: str | None, words: str) -> None:
    error = rejects(parse_json, raw, field)
    assert words in str(error)


def test_parse_json_accepts_the_edges() -> None:
    limits = b'{"lo": -9223372036854775808, "hi": 9223372036854775807, "f": 1.5e300}'
    assert parse_json(limits) == {"lo": -(2**63), "hi": 2**63 - 1, "f": 1.5e300}
    deep = "[" * (DEPTH_MAX - 1) + "]" * (DEPTH_MAX - 1)
    assert parse_json(f'{{"d": {deep}}}'.encode()) is not None


def test_parse_json_depth_and_size() -> None:
    deep = "[" * DEPTH_MAX + "]" * DEPTH_MAX
    error = rejects(parse_json, f'{{"d": {deep}}}'.encode(), "d" + "[0]" * (DEPTH_MAX - 1))
    assert "nested deeper" in str(error)
    assert "nested deeper" in str(rejects(parse_json, b"[" * 100_000, None))
    with pytest.raises(PayloadTooLarge):
        parse_json(b" " * (BODY_BYTES_MAX + 1))
    assert classify(PayloadTooLarge("x")) == (413, "payload_too_large")


# --- tasks --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"colour": 1}, "colour"),
        ({"priority": "high"}, "priority"),
        ({"priority": -1}, "priority"),
        ({"priority": 2.5}, "priority"),
        ({"priority": False}, "priority"),
        ({"task_type": ""}, "task_type"),
        ({"task_type": 3}, "task_type"),
        ({"app": "a\nb"}, "app"),
        ({"queue": "x" * 201}, "queue"),
        ({"delay_ms": -5}, "delay_ms"),
        ({"delay_ms": "10s"}, "delay_ms"),
        ({"delay_ms": 1, "run_at": "2030-01-01T00:00:00Z"}, "run_at"),
        ({"run_at": "2030-01-01"}, "run_at"),
        ({"run_at": "2030-01-01T00:00:00"}, "run_at"),
        ({"run_at": "2030-13-01T00:00:00Z"}, "run_at"),
        ({"run_at": 1893456000}, "run_at"),
        ({"retry": {"attempts_max": 0}}, "retry.attempts_max"),
        ({"retry": {"backoff_base_ms": -1}}, "retry.backoff_base_ms"),
        ({"retry": {"backoff_factor": 0.99}}, "retry.backoff_factor"),
        ({"retry": {"backoff_factor": "2"}}, "retry.backoff_factor"),
        ({"run_at": "1970-01-01T00:00:00+01:00"}, "run_at"),
        ({"run_at": "2030-02-30T00:00:00Z"}, "run_at"),
        ({"retry": {"non_retryable": "ValueError"}}, "retry.non_retryable"),
        ({"retry": {"non_retryable": ["ok", 1]}}, "retry.non_retryable[1]"),
        ({"retry": []}, "retry"),
        ({"timeouts": {"start_to_close_ms": 0}}, "timeouts.start_to_close_ms"),
        ({"timeouts": {"deadline_ms": 5}}, "timeouts.deadline_ms"),
        ({"cancel_grace_ms": -1}, "cancel_grace_ms"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"idempotency_key": "é" * 129}, "idempotency_key"),
        ({"payload": {"$blob": "sha256:00"}}, "payload"),
        ({"resume": "sticky"}, "resume"),
        ({"resume": 1}, "resume"),
    ],
)
def test_parse_task_rejects(extra: dict[str, Any], field: str) -> None:
    rejects(parse_task, {**OK, **extra}, field)


def test_parse_task_messages_show_what_was_sent() -> None:
    error = rejects(parse_task, {**OK, "priority": "high"}, "priority")
    assert str(error) == 'priority: must be an integer 0..9, got "high"'
    rejects(parse_task, {"app": "shop"}, "task_type")
    rejects(parse_task, [OK], None)


def test_parse_task_defaults_and_nulls() -> None:
    req = parse_task({**OK, "queue": None, "delay_ms": None, "retry": None, "timeouts": None})
    spec = to_spec(req, task_id="0" * 32, tenant="t", payload=req.payload, now_ms=1_000)
    assert (spec.queue, spec.priority, spec.run_at_ms, spec.attempts_max) == ("default", 0, None, 5)
    assert spec.payload == b"null" and spec.idempotency_key is None


def test_parse_task_full() -> None:
    body = {
        **OK,
        "payload": {"b": [1, 2], "a": "é"},
        "priority": 9,
        "idempotency_key": "k" * 256,
        "retry": {
            "attempts_max": 3,
            "backoff_base_ms": 0,
            "backoff_factor": 1,
            "backoff_cap_ms": 0,
            "non_retryable": ["ValueError"],
        },
        "timeouts": {"schedule_to_start_ms": 10, "start_to_close_ms": None},
        "cancel_grace_ms": 0,
    }
    req = parse_task(body)
    assert req.payload == compact(body["payload"]) == '{"b":[1,2],"a":"é"}'.encode()
    spec = to_spec(req, task_id="0" * 32, tenant="t", payload=req.payload, now_ms=0)
    assert (spec.attempts_max, spec.backoff_factor, spec.non_retryable) == (3, 1.0, ["ValueError"])
    assert (spec.schedule_to_start_ms, spec.start_to_close_ms) == (10, None)


def test_delay_and_run_at_become_absolute() -> None:
    delayed = parse_task({**OK, "delay_ms": 5_000})
    spec = to_spec(delayed, task_id="0" * 32, tenant="t", payload=b"1", now_ms=1_000)
    assert spec.run_at_ms == 6_000
    at = parse_task({**OK, "run_at": "2030-01-01T01:00:00.123456789+01:00"})
    assert at.run_at_ms == 1_893_456_000_123


def test_edges_the_document_allows_are_accepted() -> None:
    """What the OpenAPI document allows the node takes: a cap below the base bounds every
    delay (the lifecycle takes the smaller); null is absent."""
    req = parse_task({**OK, "retry": {"backoff_base_ms": 10, "backoff_cap_ms": 9}})
    assert (req.backoff_base_ms, req.backoff_cap_ms) == (10, 9)
    assert parse_task({**OK, "run_at": "9999-12-31T23:59:59.999Z"}).run_at_ms == 253_402_300_799_999
    assert parse_task({**OK, "delay_ms": 5, "run_at": None}).delay_ms == 5
    assert parse_task({**OK, "priority": 2.0, "retry": {"attempts_max": 3.0}}).priority == 2


def test_parse_batch() -> None:
    assert len(parse_batch({"tasks": [OK] * BATCH_MAX})) == BATCH_MAX
    rejects(parse_batch, {"tasks": []}, "tasks")
    rejects(parse_batch, {"tasks": [OK] * (BATCH_MAX + 1)}, "tasks")
    rejects(parse_batch, {"tasks": OK}, "tasks")
    rejects(parse_batch, {"tasks": [OK, OK, OK, {**OK, "priority": "high"}]}, "tasks[3].priority")
    rejects(parse_batch, {"tasks": [OK], "extra": 1}, "extra")
    reqs = parse_batch({"tasks": [OK, OK]})
    assert [r.field("priority") for r in reqs] == ["tasks[0].priority", "tasks[1].priority"]


# --- queries and bulk operations ------------------------------------------------------------


def test_list_query() -> None:
    q = parse_list_query({"status": "failed,ENQUEUED", "limit": "10", "since_ms": "5"})
    assert q.filter.statuses == {TaskStatus.FAILED, TaskStatus.ENQUEUED}
    assert (q.limit, q.filter.since_ms, q.cursor) == (10, 5, None)
    assert parse_list_query({}).limit == 100
    rejects(parse_list_query, {"status": "DONE"}, "status")
    rejects(parse_list_query, {"limit": "0"}, "limit")
    rejects(parse_list_query, {"limit": "ten"}, "limit")
    rejects(parse_list_query, {"since_ms": "99999999999999999999999"}, "since_ms")
    rejects(parse_list_query, {"sort": "asc"}, "sort")
    assert parse_wait_ms({"wait_ms": "250"}) == 250
    rejects(parse_wait_ms, {"wait_ms": "60001"}, "wait_ms")


def test_retry_request() -> None:
    ids = parse_retry({"task_ids": ["a" * 32]})
    assert ids.task_ids == ["a" * 32] and ids.filter is None
    flt = parse_retry({"filter": {"task_type": "x"}, "limit": 5})
    assert flt.filter is not None and flt.filter.task_type == "x" and flt.limit == 5
    rejects(parse_retry, {}, "task_ids")
    rejects(parse_retry, {"task_ids": ["a" * 32], "filter": {}}, "task_ids")
    rejects(parse_retry, {"task_ids": ["nope"]}, "task_ids[0]")
    # A filter takes the list API's filters; a retry takes FAILED tasks only.
    full = parse_retry({"filter": {"status": ["failed"], "error_text": "sku", "since_ms": 7}})
    assert full.filter is not None and full.filter.statuses == {TaskStatus.FAILED}
    assert (full.filter.error_text, full.filter.since_ms, full.limit) == ("sku", 7, None)
    rejects(parse_retry, {"filter": {"status": "ENQUEUED"}}, "filter.status")
    rejects(parse_retry, {"filter": {"status": ["NOPE"]}}, "filter.status")
    rejects(parse_retry, {"filter": {"colour": "red"}}, "filter.colour")
    rejects(parse_retry, {"task_ids": ["a" * 32], "limit": 5}, "limit")


def test_bulk_cancel_request() -> None:
    req = parse_bulk_cancel({"filter": {"queue": "q", "status": "ENQUEUED,leased"}})
    assert req.filter.queue == "q" and req.reason == "canceled by request"
    assert req.filter.statuses == {TaskStatus.ENQUEUED, TaskStatus.LEASED}
    rejects(parse_bulk_cancel, {}, "filter")
    rejects(parse_bulk_cancel, {"filter": {"status": ["SUCCEEDED"]}}, "filter.status")
    rejects(parse_bulk_cancel, {"filter": {}, "limit": 0}, "limit")
    # The operation's reason is stored in PostgreSQL, whose text cannot hold U+0000.
    assert "NUL" in str(rejects(parse_bulk_cancel, {"filter": {}, "reason": "a\x00b"}, "reason"))


# --- worker requests ----------------------------------------------------------------------


def test_worker_requests() -> None:
    reg = parse_register({"agent_id": "a", "app": "shop", "task_types": ["x", "y"]})
    assert reg.task_types == ["x", "y"] and reg.version is None
    rejects(parse_register, {"agent_id": "a", "app": "shop"}, "task_types")
    poll = parse_poll({"agent_id": "a", "app": "shop"})
    assert (poll.capacity, poll.wait_ms, poll.lease_ms, poll.queues) == (8, 20_000, 30_000, [])
    rejects(parse_poll, {"agent_id": "a", "app": "shop", "capacity": 0}, "capacity")
    rejects(parse_poll, {"agent_id": "a", "app": "shop", "wait_ms": 600_000}, "wait_ms")
    refs = parse_heartbeat({"leases": [{"task_id": "b" * 32, "lease_id": 3}]})
    assert (refs[0].task_id, refs[0].lease_id) == ("b" * 32, 3)
    rejects(parse_heartbeat, {"leases": [{"task_id": "b" * 32}]}, "leases[0].lease_id")


def test_completions() -> None:
    item = {
        "task_id": "c" * 32,
        "lease_id": 1,
        "outcome": "FAILED",
        "error": {"class": "E", "message": "m\nmore", "stack": "line1\nline2"},
    }
    (done,) = parse_complete({"completions": [item]})
    assert done.outcome == Outcome.FAILED and done.error_stack == "line1\nline2"
    rejects(
        parse_complete, {"completions": [{**item, "outcome": "DONE"}]}, "completions[0].outcome"
    )
    rejects(parse_complete, {"completions": [{**item, "outcome": {}}]}, "completions[0].outcome")
    rejects(
        parse_complete,
        {"completions": [{**item, "error": {"kind": "E"}}]},
        "completions[0].error.kind",
    )
    rejects(
        parse_complete,
        {"completions": [{**item, "result": {"$blob": "x"}}]},
        "completions[0].result",
    )


def test_step_identities_refuse_nul() -> None:
    """A step identity is stored in PostgreSQL text (the snapshot's steps), which cannot hold
    U+0000: refused at the door rather than halting the projection later."""
    step = {"task_id": "c" * 32, "lease_id": 1, "op": "CLAIM", "identity": "a#0", "position": 0}
    (ok,) = parse_steps({"steps": [step]})
    assert ok.identity == "a#0"
    rejects(parse_steps, {"steps": [{**step, "identity": "a\x00#0"}]}, "steps[0].identity")
    sleep = {"identity": "nap\x00#0", "position": 0, "sleep_ms": 5}
    item = {"task_id": "c" * 32, "lease_id": 1, "outcome": "SLEEP", "sleep": sleep}
    rejects(parse_complete, {"completions": [item]}, "completions[0].sleep.identity")


def test_error_body_shape() -> None:
    error = rejects(parse_task, {**OK, "priority": "high"}, "priority")
    body = json.loads(json.dumps(error.to_json()))
    assert body["error"]["field"] == "priority" and classify(error) == (400, "invalid_request")


def test_the_resume_policy_reaches_the_spec_and_defaults_to_latest() -> None:
    for body, resume in (({**OK}, "latest"), ({**OK, "resume": "pinned"}, "pinned")):
        req = parse_task(body)
        spec = to_spec(req, task_id="0" * 32, tenant="t", payload=req.payload, now_ms=1_000)
        assert spec.resume == resume
    error = rejects(parse_task, {**OK, "resume": "sticky"}, "resume")
    assert "latest|pinned" in str(error)


def assert_same_verdict(explain: Callable[[], object], quick: bool) -> None:
    """A quick check says yes exactly when its explaining twin raises nothing."""
    try:
        explain()
    except ContractError:
        assert not quick
    else:
        assert quick


@given(
    value=st.one_of(st.text(max_size=12), st.integers(), st.none(), st.lists(st.text())),
    bytes_max=st.integers(0, 12),
)
def test_the_quick_name_check_lets_through_exactly_what_the_explaining_one_does(
    value: Any, bytes_max: int
) -> None:
    assert_same_verdict(lambda: check_name(value, "f", bytes_max), is_name(value, bytes_max))


_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(),  # NaN and the infinities too
    st.text(max_size=4),
    # the edges, which the draws above seldom hit: lone surrogates cannot be UTF-8
    st.sampled_from(["\udc80", "\ud800x", "é", float("nan"), float("-inf"), 1.5e300]),
    st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, _HugeInt("1" + "0" * 30)]),
)
_JSON = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.text(max_size=3) | st.just("\udc80"), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(value=_JSON, depth=st.integers(DEPTH_MAX - 3, DEPTH_MAX + 1))
def test_the_quick_body_walk_passes_exactly_what_the_explaining_one_does(
    value: Any, depth: int
) -> None:
    assert_same_verdict(lambda: _check(value, "", depth), _sound(value, depth))
