"""Hostile HTTP from tests/PLAN.md (table H) that ``test_gateway.py`` does not already cover.

Every case must be a structured 4xx (``{"error": {"code", ...}}``), answered promptly, and must
change nothing: the tenant's task count (and schedule list) is the same before and after.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_gateway import (
    BODY_BYTES_MAX,
    KEY_A,
    NodeProcess,
    call,
    count_tasks,
    raw_http,
    settled_count,
    write_keys,
)

pytestmark = pytest.mark.timeout(120)

ANSWER_WITHIN_S = 5.0


def task(**fields: Any) -> dict[str, Any]:
    return {"task_type": "echo", "app": "shop", **fields}


def raw_task(field_json: str) -> bytes:
    return b'{"task_type": "echo", "app": "shop", ' + field_json.encode() + b"}"


def schedule(cron: str, **task_fields: Any) -> dict[str, Any]:
    return {"schedule_id": "hostile", "cron": cron, "task": task(**task_fields)}


# Names a client chooses are ASCII letters, digits and _ . : - (PROTOCOL.md, "Names"); these
# would render otherwise than they are (reversed, invisible, two words) in the dashboard.
_BAD_NAMES = [
    ("bidi_override", "echo\u202eohce"),
    ("control_char", "echo\x1b[2J"),
    ("space", "echo twice"),
    ("zero_width", "ec\u200bho"),
]

_DEEP_ARRAY = b"[" * 100_000 + b"]" * 100_000
_DEEP_OBJECT = b'{"a":' * 100_000 + b"1" + b"}" * 100_000

# (id, path, body: bytes or JSON value, status, code, field or None)
JSON_CASES: list[tuple[str, str, Any, int, str, str | None]] = [
    ("deep_array_1e5", "/v1/tasks", _DEEP_ARRAY, 400, "invalid_request", None),
    ("deep_object_1e5", "/v1/tasks", _DEEP_OBJECT, 400, "invalid_request", None),
    (
        "deep_payload_1e5",
        "/v1/tasks",
        raw_task('"payload": ' + "[" * 10**5 + "]" * 10**5),
        400,
        "invalid_request",
        None,
    ),
    (
        "int_10k_digits",
        "/v1/tasks",
        raw_task('"delay_ms": ' + "9" * 10_000),
        400,
        "invalid_request",
        "delay_ms",
    ),
    (
        "int_10k_digits_payload",
        "/v1/tasks",
        raw_task('"payload": -' + "1" * 10_000),
        400,
        "invalid_request",
        "payload",
    ),
    ("float_for_int", "/v1/tasks", task(priority=1.5), 400, "invalid_request", "priority"),
    ("nan_priority", "/v1/tasks", raw_task('"priority": NaN'), 400, "invalid_request", None),
    ("infinity_delay", "/v1/tasks", raw_task('"delay_ms": Infinity'), 400, "invalid_request", None),
    (
        "duplicate_key_nested",
        "/v1/tasks",
        raw_task('"payload": {"a": 1, "a": 2}'),
        400,
        "invalid_request",
        None,
    ),
    (
        "duplicate_key_batch_item",
        "/v1/tasks:batch",
        b'{"tasks": [{"task_type": "echo", "app": "shop", "app": "shop"}]}',
        400,
        "invalid_request",
        None,
    ),
    (
        "invalid_utf8_key",
        "/v1/tasks",
        raw_task('"\xff": 1').replace(b"\xc3\xbf", b"\xff"),
        400,
        "invalid_request",
        None,
    ),
    (
        "overlong_utf8",
        "/v1/tasks",
        raw_task('"payload": "\xc0\xaf"').replace(b"\xc3\x80\xc2\xaf", b"\xc0\xaf"),
        400,
        "invalid_request",
        None,
    ),
    ("utf16_body", "/v1/tasks", json.dumps(task()).encode("utf-16"), 400, "invalid_request", None),
    (
        "bom",
        "/v1/tasks",
        b"\xef\xbb\xbf" + json.dumps(task()).encode(),
        400,
        "invalid_request",
        None,
    ),
    (
        "lone_surrogate_key",
        "/v1/tasks",
        raw_task('"idempotency_key": "\\udc00"'),
        400,
        "invalid_request",
        "idempotency_key",
    ),
    (
        "lone_surrogate_name",
        "/v1/tasks",
        raw_task('"queue": "q\\ud800"'),
        400,
        "invalid_request",
        "queue",
    ),
    ("nul_in_name", "/v1/tasks", task(queue="q\x00"), 400, "invalid_request", "queue"),
    ("delay_int64_max", "/v1/tasks", task(delay_ms=2**63 - 1), 400, "invalid_request", "delay_ms"),
    ("delay_over_int64", "/v1/tasks", task(delay_ms=2**63), 400, "invalid_request", "delay_ms"),
    ("delay_int64_min", "/v1/tasks", task(delay_ms=-(2**63)), 400, "invalid_request", "delay_ms"),
    (
        "delay_negative",
        "/v1/tasks:batch",
        {"tasks": [task(delay_ms=-1)]},
        400,
        "invalid_request",
        "tasks[0].delay_ms",
    ),
    (
        "run_at_year_10000",
        "/v1/tasks",
        task(run_at="10000-01-01T00:00:00Z"),
        400,
        "invalid_request",
        "run_at",
    ),
    ("tenant_in_body", "/v1/tasks", task(tenant="beta"), 400, "invalid_request", "tenant"),
    (
        "tenant_in_batch_item",
        "/v1/tasks:batch",
        {"tasks": [task(), task(tenant="beta")]},
        400,
        "invalid_request",
        "tasks[1].tenant",
    ),
    (
        "tenant_in_schedule",
        "/v1/schedules",
        {**schedule("0 * * * *"), "tenant": "beta"},
        400,
        "invalid_request",
        "tenant",
    ),
    *[
        (f"{field}_{kind}", "/v1/tasks", task(**{field: bad}), 400, "invalid_request", field)
        for field in ("task_type", "app", "queue")
        for kind, bad in _BAD_NAMES
    ],
    *[
        (
            f"schedule_id_{kind}",
            "/v1/schedules",
            {**schedule("0 * * * *"), "schedule_id": bad},
            400,
            "invalid_request",
            "schedule_id",
        )
        for kind, bad in _BAD_NAMES
    ],
    *[
        (
            f"registered_type_{kind}",
            "/worker/register",
            {"agent_id": "a1", "app": "shop", "version": "1", "task_types": ["echo", bad]},
            400,
            "invalid_request",
            "task_types[1]",
        )
        for kind, bad in _BAD_NAMES
    ],
    ("cron_feb_30", "/v1/schedules", schedule("0 0 30 2 *"), 400, "invalid_request", "cron"),
    ("cron_apr_31", "/v1/schedules", schedule("0 0 31 4 *"), 400, "invalid_request", "cron"),
    ("cron_step_zero", "/v1/schedules", schedule("*/0 * * * *"), 400, "invalid_request", "cron"),
    ("cron_empty", "/v1/schedules", schedule(""), 400, "invalid_request", "cron"),
]


def _state(node: NodeProcess) -> tuple[int, Any]:
    return count_tasks(node.base), call(node.base, "GET", "/v1/schedules")[1]


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "field"),
    [c[1:] for c in JSON_CASES],
    ids=[c[0] for c in JSON_CASES],
)
def test_hostile_json_is_a_structured_4xx_and_changes_nothing(
    node: NodeProcess, path: str, body: Any, status: int, code: str, field: str | None
) -> None:
    before = (settled_count(node.base), call(node.base, "GET", "/v1/schedules")[1])
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    started = time.monotonic()
    got, reply = call(node.base, "POST", path, raw=raw, timeout=ANSWER_WITHIN_S)
    assert time.monotonic() - started < ANSWER_WITHIN_S
    assert (got, reply["error"]["code"]) == (status, code), reply
    assert isinstance(reply["error"]["message"], str) and reply["error"]["message"]
    if field is not None:
        assert reply["error"].get("field") == field, reply
    assert _state(node) == before


_HEAD = "POST /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nConnection: close\r\n"
_OK = json.dumps(task()).encode()
_BOMB = gzip.compress(b" " * (BODY_BYTES_MAX + 1))  # about 8 KB that inflate past the cap


def _chunked(total: int, size: int = 1 << 16) -> bytes:
    """A chunked body of ``total`` bytes (one JSON string), no Content-Length."""
    data = b'"' + b"x" * (total - 2) + b'"'
    parts = [
        b"%x\r\n%s\r\n" % (len(data[i : i + size]), data[i : i + size])
        for i in range(0, len(data), size)
    ]
    return b"".join(parts) + b"0\r\n\r\n"


# (id, extra headers, body, status, code)
FRAMING_CASES: list[tuple[str, str, bytes, int, str]] = [
    (
        "text_plain",
        f"Content-Type: text/plain\r\nContent-Length: {len(_OK)}",
        _OK,
        415,
        "unsupported_media_type",
    ),
    (
        "form_urlencoded",
        f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(_OK)}",
        _OK,
        415,
        "unsupported_media_type",
    ),
    (
        "multipart",
        f"Content-Type: multipart/form-data; boundary=b\r\nContent-Length: {len(_OK)}",
        _OK,
        415,
        "unsupported_media_type",
    ),
    ("no_content_type", f"Content-Length: {len(_OK)}", _OK, 415, "unsupported_media_type"),
    (
        "declared_over_cap_unsent",
        f"Content-Type: application/json\r\nContent-Length: {BODY_BYTES_MAX + 1}",
        b"",
        413,
        "payload_too_large",
    ),
    (
        "sent_over_cap",
        f"Content-Type: application/json\r\nContent-Length: {BODY_BYTES_MAX + 1}",
        b"x" * (BODY_BYTES_MAX + 1),
        413,
        "payload_too_large",
    ),
    (
        "chunked_over_cap",
        "Content-Type: application/json\r\nTransfer-Encoding: chunked",
        _chunked(BODY_BYTES_MAX + 2),
        413,
        "payload_too_large",
    ),
    (
        "gzip_bomb",
        f"Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: {len(_BOMB)}",
        _BOMB,
        413,
        "payload_too_large",
    ),
    (
        "gzip_garbage",
        "Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: 10",
        b"\x1f\x8b" + b"\0" * 8,
        400,
        "invalid_request",
    ),
    (
        "chunked_bad_framing",
        "Content-Type: application/json\r\nTransfer-Encoding: chunked",
        b"zz\r\n{}\r\n0\r\n\r\n",
        400,
        "invalid_request",
    ),
]


@pytest.mark.parametrize(
    ("headers", "body", "status", "code"),
    [c[1:] for c in FRAMING_CASES],
    ids=[c[0] for c in FRAMING_CASES],
)
def test_hostile_framing_is_a_prompt_4xx_and_changes_nothing(
    node: NodeProcess, headers: str, body: bytes, status: int, code: str
) -> None:
    before = settled_count(node.base)
    started = time.monotonic()
    got, reply = raw_http(node.port, _HEAD.format(key=KEY_A) + headers, body, ANSWER_WITHIN_S)
    assert time.monotonic() - started < ANSWER_WITHIN_S, "the connection hung"
    assert got == status, (got, reply)
    # A broken framing that aiohttp's parser answers before any handler is our JSON too.
    assert isinstance(reply, dict) and reply["error"]["code"] == code, reply
    assert count_tasks(node.base) == before
    assert call(node.base, "GET", "/healthz", key=None)[0] == 200


def test_chunked_body_within_the_cap_is_accepted(node: NodeProcess) -> None:
    """The control for the cases above: chunked framing itself is fine."""
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(_OK), _OK)
    head = _HEAD.format(key=KEY_A) + "Content-Type: application/json\r\nTransfer-Encoding: chunked"
    got, reply = raw_http(node.port, head, chunked, ANSWER_WITHIN_S)
    assert got == 201 and reply["created"], reply


# Keys that look like the two kinds a client holds: one the node minted, one an operator wrote.
_MINTED_KEY = "cvk_Q7rVx2NwLk9ZpT4mHs8YdC1f"
_PLAIN_KEY = "opsToken-4f9a1c77e2b84d0c"
_AUTH = "Authorization: Bearer {key}"

# (id, request written by hand: a head that aiohttp's parser refuses, with a key in it)
MALFORMED_CASES: list[tuple[str, bytes]] = [
    ("nul_in_authorization", b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\n%(auth)s\x00\r\n\r\n"),
    ("bare_cr_in_authorization", b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\n%(auth)s\rX: y\r\n\r\n"),
    (
        "duplicate_content_length",
        b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\n%(auth)s\r\nContent-Type: application/json\r\n"
        b"Content-Length: 2\r\nContent-Length: 3\r\n\r\n{}",
    ),
    (
        "huge_authorization",
        b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\n%(auth)s" + b"A" * 20_000 + b"\r\n\r\n",
    ),
    (
        "huge_request_line",
        b"GET /v1/tasks?k=%(key)s" + b"A" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    ),
    ("bad_request_line", b"GET /v1/tasks?k=%(key)s HTTP/1.1 x\r\nHost: x\r\n%(auth)s\r\n\r\n"),
    ("bad_method", b"G\x01T /v1/tasks HTTP/1.1\r\nHost: x\r\n%(auth)s\r\n\r\n"),
    (
        "space_before_colon",
        b"GET /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization : Bearer %(key)s\r\n\r\n",
    ),
]


def _parts(key: str, size: int = 8) -> list[str]:
    """Every run of ``size`` characters of the key's secret part (after any ``cvk_``)."""
    secret = key.removeprefix("cvk_")
    return [secret[i : i + size] for i in range(len(secret) - size + 1)]


def _send(port: int, raw: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WITHIN_S) as s:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            s.sendall(raw)
        reply = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := s.recv(65536):
                reply += chunk
    return reply


@pytest.fixture(scope="module")
def chatty_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    """A node that logs everything (debug), so that a secret anywhere in its logging shows."""
    home = tmp_path_factory.mktemp("chatty") / "home"
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection", "--log-level", "debug"))
    proc.start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


@pytest.mark.parametrize("key", [_MINTED_KEY, _PLAIN_KEY], ids=["minted_key", "plain_key"])
@pytest.mark.parametrize(
    "raw", [c[1] for c in MALFORMED_CASES], ids=[c[0] for c in MALFORMED_CASES]
)
def test_a_malformed_request_is_our_json_400_and_echoes_no_secret(
    chatty_node: NodeProcess, raw: bytes, key: str
) -> None:
    """Regression: aiohttp's parser answered these itself, in plain text quoting the bad line
    (the bearer key included), and logged the line with a traceback."""
    request = raw % {b"auth": _AUTH.format(key=key).encode(), b"key": key.encode()}
    reply = _send(chatty_node.port, request)
    head, _, body = reply.partition(b"\r\n\r\n")
    assert head.split()[1] == b"400", reply[:300]
    error = json.loads(body)["error"]
    assert error["code"] == "invalid_request" and "nothing was done" in error["message"], error
    leaked = [part for part in _parts(key) if part.encode() in reply]
    assert not leaked, reply[:300]
    assert call(chatty_node.base, "GET", "/healthz", key=None)[0] == 200
    logs = chatty_node.logs()
    assert "malformed request from" in logs  # the node did log the fault, and only that
    assert not [part for part in _parts(key) if part in logs], logs[-2000:]


@pytest.mark.parametrize("bad", [b for _, b in _BAD_NAMES], ids=[k for k, _ in _BAD_NAMES])
def test_an_event_name_outside_the_name_set_is_a_400_naming_it(node: NodeProcess, bad: str) -> None:
    status, created = call(node.base, "POST", "/v1/tasks", task(delay_ms=3_600_000))
    assert status == 201, created
    path = f"/v1/workflows/{created['task_id']}/events"
    status, reply = call(node.base, "POST", path, {"name": bad, "payload": 1})
    assert (status, reply["error"]["field"]) == (400, "name"), reply
    assert "A-Z a-z 0-9 _ . : -" in reply["error"]["message"]
