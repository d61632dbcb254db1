"""Schemathesis against the gateway's own ``/openapi.json`` on a real node (tests/PLAN.md).

Every operation gets a small, fixed number of generated requests (valid, and invalid where it
takes input: ``_takes_input``; derandomized so a run is reproducible) sent with a valid API key.
Checks: no 5xx, the status code and content type are ones the document declares, the JSON body
matches the declared schema, and no request hangs (each has a timeout). Long-poll durations are
capped first, so a legitimate long poll is not mistaken for a hang. Both directions of the
contract are checked: a request the document refuses is a 4xx (``negative_data_rejection``), and
one it allows is never refused as malformed (``schema_valid_is_not_invalid``): no 400
``invalid_request``. A refusal for the node's state (an unknown task type, a missing task, a
finished workflow) has its own code and passes; the few ``invalid_request`` refusals that depend
on more than the body are listed in ``BEYOND_THE_BODY`` with their reason.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import schemathesis

# Imported here, at collection, not lazily inside the fixture: pytest rewrites the asserts of
# schemathesis' modules as it imports them, and CPython 3.11.7 can fail that compile with a
# spurious "AST constructor recursion depth mismatch" SystemError when it runs after Hypothesis
# has changed the recursion limit in this process (fixed in CPython 3.11.8).
import schemathesis.specs.openapi.schemas
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.internal import lambda_sources
from schemathesis.checks import not_a_server_error
from schemathesis.generation.modes import GenerationMode
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    response_schema_conformance,
    status_code_conformance,
)
from test_gateway import KEY_A, NodeProcess

from conveyor.streams.gateway.contract.operations import OPERATIONS, Operation

pytestmark = pytest.mark.timeout(120)


def _described_without_ast_errors(describe: Any) -> Any:
    """The same CPython bug bites Hypothesis itself: to print a strategy that maps with a
    lambda it parses the lambda's source with ``ast``, and inside a test (recursion limit
    raised) that parse can raise the spurious SystemError, failing an example that did nothing
    wrong. A description is only ever printed, so such a lambda is described as unknown."""

    def described(f: Any) -> Any:
        try:
            return describe(f)
        except SystemError:
            return "lambda: <unknown>"

    return described


lambda_sources._lambda_description = _described_without_ast_errors(
    lambda_sources._lambda_description
)

EXAMPLES_PER_OPERATION = 15
REQUEST_TIMEOUT_S = 5.0  # far above any answer but a long poll, and those are capped below
WAIT_MS_CAP = 100
RUN_BUDGET_S = 150.0  # the whole module; operations past it are skipped, not failed
# operationId -> (field, why): a body the document allows that the node may still refuse as
# invalid, for a reason that is not in the body.
_OPAQUE = "a cursor is a token the node issued (next_cursor); any other string is refused"
BEYOND_THE_BODY = {
    "create_webhook": {"url": "the address policy: where the URL's host resolves, if at all"},
    "list_tasks": {"cursor": _OPAQUE},
    "list_workflows": {"cursor": _OPAQUE},
    "get_workflow_history": {"cursor": _OPAQUE},
    "list_events": {"after": _OPAQUE},
    "register_agent": {
        "definitions": "a definition is checked by the registry (its options, its Avro schemas "
        "must parse), and the node's JSON reader refuses an integer outside int64 anywhere, "
        "which a free-form object's schema does not say"
    },
}


@schemathesis.check
def schema_valid_is_not_invalid(ctx: Any, response: Any, case: Any) -> bool | None:
    """A request generated from the document (positive mode) is not refused as malformed."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code != 400:
        return None
    error = response.json().get("error", {})
    if error.get("code") != "invalid_request":
        return None  # a refusal for the node's state (unknown_task_type, ...)
    if "outside the signed 64-bit range" in str(error.get("message", "")):
        return None  # the JSON reader's rule for every integer, free-form values included
    # (a payload, a fan-out child, a definition): JSON Schema cannot say it of those.
    beyond = BEYOND_THE_BODY.get(case.operation.definition.raw.get("operationId", ""), {})
    field = str(error.get("field") or "")
    if any(field == f or field.startswith((f"{f}[", f"{f}.")) for f in beyond):
        return None
    raise AssertionError(f"a request the document allows was refused: {error}")


CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_schema_conformance,
    negative_data_rejection,
    schema_valid_is_not_invalid,
]
_started: list[float] = []


@pytest.fixture(scope="module")
def api_schema(node: NodeProcess) -> Any:
    """The document as the node serves it (schemathesis' pytest loader, ``from_fixture``, does
    not run on pytest 9, so operations are driven with Hypothesis directly)."""
    return schemathesis.openapi.from_url(f"{node.base}/openapi.json")


def _waits(value: Any) -> bool:
    """A wait the node would take (absent: its default long poll); an out-of-range one is left
    alone, since it may be what a negative case has wrong. A number with no fraction is an
    integer (JSON Schema's rule, and the node's): generated bodies hold 2147.0 as often as 2147,
    and an uncapped 30000.0 outlasted the request timeout."""
    if value is None:
        return True
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 60_000


def _cap_waits(case: Any) -> None:
    if case.path in ("/worker/poll", "/worker/signals") and isinstance(case.body, dict):
        wait_ms = case.body.get("wait_ms")
        if _waits(wait_ms):
            case.body["wait_ms"] = min(int(wait_ms or WAIT_MS_CAP), WAIT_MS_CAP)
    query = case.query
    if (
        isinstance(query, dict)
        and isinstance(query.get("wait_ms"), int | float)
        and _waits(query["wait_ms"])
    ):
        query["wait_ms"] = min(int(query["wait_ms"]), WAIT_MS_CAP)


def _takes_input(op: Operation) -> bool:
    """Whether a request to ``op`` can be wrong by the document: a body, a parameter (path or
    query) or the API key. One that cannot (``/healthz`` and the two documents) has no negative
    case: schemathesis negates the document's constraints and finds none (its runner skips such
    an operation; a strategy rejects every draw, and Hypothesis says Unsatisfiable). A query
    string sent there anyway is ignored (``contract/operations.py``, rule 1), which
    ``test_gateway.py`` checks."""
    return op.body is not None or op.query is not None or "{" in op.path or not op.public


FUZZED = [
    (mode, op.method.upper(), op.path)
    for mode in GenerationMode
    for op in OPERATIONS
    if op.path != "/metrics" and (mode.is_positive or _takes_input(op))
]


@pytest.mark.parametrize(
    ("mode", "method", "path"), FUZZED, ids=[f"{mode!s}-{m} {p}" for mode, m, p in FUZZED]
)
def test_gateway_conforms_to_its_openapi_document(
    node: NodeProcess, api_schema: Any, mode: GenerationMode, method: str, path: str
) -> None:
    if not _started:
        _started.append(time.monotonic())
    if time.monotonic() - _started[0] > RUN_BUDGET_S:
        pytest.skip(f"fuzz budget of {RUN_BUDGET_S:.0f}s spent")
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES_PER_OPERATION,
        derandomize=True,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate, Phase.shrink],
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        _cap_waits(case)
        case.call_and_validate(
            base_url=node.base,
            headers={"Authorization": f"Bearer {KEY_A}"},
            checks=CHECKS,
            timeout=REQUEST_TIMEOUT_S,
        )

    run()


# Random names never hit a registered task type, so generated enqueues all end in a 400: send
# known-good requests through the same checks to cover the success paths (201 included).
VALID = [
    ("POST", "/v1/tasks", {"task_type": "echo", "app": "shop", "payload": {"n": 1}}),
    ("POST", "/v1/tasks", {"task_type": "echo", "app": "shop", "idempotency_key": "fuzz-k"}),
    ("POST", "/v1/tasks", {"task_type": "echo", "app": "shop", "idempotency_key": "fuzz-k"}),
    ("POST", "/v1/tasks:batch", {"tasks": [{"task_type": "echo", "app": "shop"}]}),
    (
        "POST",
        "/v1/schedules",
        {"schedule_id": "fuzz", "cron": "0 0 1 1 *", "task": {"task_type": "echo", "app": "shop"}},
    ),
    (
        "POST",
        "/v1/schedules",
        {"schedule_id": "fuzz", "cron": "0 0 2 1 *", "task": {"task_type": "echo", "app": "shop"}},
    ),
    ("GET", "/v1/schedules", None),
    ("DELETE", "/v1/schedules/fuzz", None),
    ("GET", "/v1/queues", None),
    ("GET", "/v1/tasks", None),
    ("GET", "/healthz", None),
    ("GET", "/openapi.json", None),
]


def test_success_paths_conform_to_the_document(node: NodeProcess, api_schema: Any) -> None:
    for method, path, body in VALID:
        template = next(
            op.path
            for op in OPERATIONS
            if op.method.upper() == method
            and (op.path == path or op.path.replace("{schedule_id}", "fuzz") == path)
        )
        operation = api_schema[template][method]
        kwargs: dict[str, Any] = (
            {} if body is None else {"body": body, "media_type": "application/json"}
        )
        if template != path:
            kwargs["path_parameters"] = {"schedule_id": "fuzz"}
        case = operation.Case(**kwargs)
        response = case.call_and_validate(
            base_url=node.base,
            headers={"Authorization": f"Bearer {KEY_A}"},
            checks=CHECKS,
            timeout=REQUEST_TIMEOUT_S,
        )
        assert response.status_code < 300, (method, path, response.text)
