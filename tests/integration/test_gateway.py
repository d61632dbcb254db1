"""The gateway over real sockets: ``conveyor node`` as a subprocess, driven with urllib.

One node serves the module (tenants alpha and beta, keys written to keys.json before it
starts); the kill -9 test runs its own node on its own home. Tests isolate their work by app
name, so one test's polls never take another's tasks.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conveyor.streams.gateway.contract.operations import OPERATIONS

pytestmark = pytest.mark.timeout(120)

KEY_A = "test-key-alpha-0123456789"
KEY_B = "test-key-beta-0123456789"
METRICS_KEY = "test-metrics-key-0123456789"  # every NodeProcess serves /metrics with it
START_TIMEOUT_S = 30.0
BODY_BYTES_MAX = 8 * 2**20
APPS = {
    "shop": ["echo"],
    "rt": ["echo"],
    "stale": ["echo"],
    "hb": ["echo"],
    "cancels": ["echo"],
    "blob": ["echo"],
    "retries": ["boom"],
    "retries2": ["boom2"],
    "retries3": ["boom3"],
    "listing": ["a", "b"],
    "sticky": ["echo"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def call(
    base: str,
    method: str,
    path: str,
    body: Any = None,
    *,
    key: str | None = KEY_A,
    raw: bytes | None = None,
    timeout: float = 30.0,
) -> tuple[int, Any]:
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


class NodeProcess:
    """``conveyor node`` (or ``dev``) on a home dir and a free port, output to a file."""

    def __init__(self, home: Path, command: tuple[str, ...] = ("node",)) -> None:
        self.home = home
        self.command = command
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, cwd: Path | None = None, env: dict[str, str] | None = None) -> None:
        cmd = [
            sys.executable,
            "-m",
            "conveyor.cli",
            *self.command,
            "--home",
            str(self.home),
            "--port",
            str(self.port),
            "--partitions",
            "4",
        ]
        out = open(self.home.parent / f"{self.home.name}.out", "ab")  # noqa: SIM115
        env = {"CONVEYOR_METRICS_KEY": METRICS_KEY, **(os.environ if env is None else env)}
        self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=cwd, env=env)
        out.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"node exited {self.proc.returncode}:\n{self.logs()}")
            try:
                if call(self.base, "GET", "/healthz", key=None, timeout=2)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"node not healthy after {START_TIMEOUT_S}s:\n{self.logs()}")

    def logs(self) -> str:
        path = self.home.parent / f"{self.home.name}.out"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
            raise AssertionError(f"node did not stop on signal {sig}:\n{self.logs()}") from None


def write_keys(home: Path) -> None:
    home.mkdir(parents=True, exist_ok=True)
    keys = {KEY_A: {"tenant": "alpha"}, KEY_B: {"tenant": "beta"}}
    (home / "keys.json").write_text(json.dumps({"keys": keys}))


def register(base: str, key: str = KEY_A) -> None:
    for app, types in APPS.items():
        body = {"agent_id": "setup", "app": app, "version": "1", "task_types": types}
        assert call(base, "POST", "/worker/register", body, key=key) == (200, {"warnings": []})


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("gateway") / "home"
    write_keys(home)
    proc = NodeProcess(home)
    proc.start()
    register(proc.base)
    register(proc.base, KEY_B)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def count_tasks(base: str, key: str = KEY_A) -> int:
    total, cursor = 0, None
    while True:
        path = "/v1/tasks?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        status, page = call(base, "GET", path, key=key)
        assert status == 200, page
        total += len(page["tasks"])
        cursor = page["next_cursor"]
        if cursor is None:
            return total


def stop_orphaned_postgres(home: Path) -> None:
    """The embedded PostgreSQL of a node killed with -9 outlives it (the next node joins it
    and, not having started it, leaves it running): stop it by its pid file."""
    pid_file = home / "postgres" / "postmaster.pid"
    if pid_file.exists():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid_file.read_text().split()[0]), signal.SIGTERM)


def gauge(base: str, name: str) -> float:
    """The sum of a metric's samples in the node's /metrics."""
    request = urllib.request.Request(base + "/metrics")
    request.add_header("Authorization", f"Bearer {METRICS_KEY}")
    with urllib.request.urlopen(request, timeout=10) as reply:
        text = reply.read().decode()
    samples = [line.split()[-1] for line in text.splitlines() if line.startswith(name)]
    assert samples, f"no {name}"
    return sum(float(v) for v in samples)


def settled_count(base: str, timeout_s: float = 15.0) -> int:
    """The listing's task count once the projection has caught up and it stops changing:
    listing reads the Postgres snapshot, which trails the processors by the projection lag
    (tens of milliseconds; about a second after a start, while the projector process starts)."""
    deadline = time.monotonic() + timeout_s
    last = count_tasks(base)
    while time.monotonic() < deadline:
        time.sleep(0.2)
        now = count_tasks(base)
        if now == last and gauge(base, "conveyor_projection_lag_records") == 0:
            return now
        last = now
    raise AssertionError("the task listing never settled")


def enqueue(base: str, app: str = "shop", **fields: Any) -> str:
    body = {"task_type": "echo", "app": app, "payload": {"n": 1}, **fields}
    status, reply = call(base, "POST", "/v1/tasks", body)
    assert status == 201, reply
    return str(reply["task_id"])


def poll(base: str, app: str, *, capacity: int = 1, **fields: Any) -> list[dict[str, Any]]:
    body = {"agent_id": f"agent-{app}", "app": app, "capacity": capacity, "wait_ms": 5000}
    status, reply = call(base, "POST", "/worker/poll", {**body, **fields})
    assert status == 200, reply
    return list(reply["leases"])


def complete(base: str, lease: dict[str, Any], lease_id: int | None = None, **fields: Any) -> Any:
    item = {
        "task_id": lease["task_id"],
        "lease_id": lease_id or lease["lease_id"],
        "outcome": "SUCCEEDED",
        **fields,
    }
    status, reply = call(base, "POST", "/worker/complete", {"completions": [item]})
    assert status == 200, reply
    return reply["results"][0]


def get(base: str, task_id: str, key: str = KEY_A) -> dict[str, Any]:
    status, task = call(base, "GET", f"/v1/tasks/{task_id}", key=key)
    assert status == 200, task
    return dict(task)


def wait_status(base: str, task_id: str, status: str, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        task = get(base, task_id)
        if task["status"] == status or time.monotonic() > deadline:
            assert task["status"] == status, task
            return task
        time.sleep(0.02)


# --- client API -------------------------------------------------------------------------


def test_enqueue_then_get(node: NodeProcess) -> None:
    payload = {"user": "ada", "sizes": [1, 2.5], "ok": True, "note": "é✓"}
    status, reply = call(
        node.base,
        "POST",
        "/v1/tasks",
        {"task_type": "echo", "app": "shop", "payload": payload, "queue": "q1", "priority": 7},
    )
    assert status == 201 and reply["created"] is True and reply["status"] == "ENQUEUED"
    task = get(node.base, reply["task_id"])
    assert task["payload"] == payload
    assert (task["queue"], task["priority"], task["app"]) == ("q1", 7, "shop")
    assert task["attempts"] == [] and task["error"] is None


def test_batch_enqueues_in_order(node: NodeProcess) -> None:
    tasks = [{"task_type": "echo", "app": "shop", "payload": {"i": i}} for i in range(5)]
    status, reply = call(node.base, "POST", "/v1/tasks:batch", {"tasks": tasks})
    assert status == 201
    assert [r["created"] for r in reply["results"]] == [True] * 5
    for i, result in enumerate(reply["results"]):
        assert get(node.base, result["task_id"])["payload"] == {"i": i}


def test_unkeyed_enqueues_stay_on_one_partition_for_a_stint(node: NodeProcess) -> None:
    """Rule 3 of streams/gateway/service.py: single enqueues in a row share a partition, and so
    its log's groups and apply batches; a 1,000-task batch still spreads over partitions."""
    single = {"task_type": "echo", "app": "sticky"}
    ids = [call(node.base, "POST", "/v1/tasks", single)[1]["task_id"] for _ in range(300)]
    changes = sum(a[:4] != b[:4] for a, b in itertools.pairwise(ids))
    assert changes <= 2  # 300 in a row cross at most two boundaries of 256-task stints
    status, reply = call(node.base, "POST", "/v1/tasks:batch", {"tasks": [single] * 1000})
    assert status == 201
    assert len({r["task_id"][:4] for r in reply["results"]}) >= 3


def _task(**fields: Any) -> bytes:
    return json.dumps({"task_type": "echo", "app": "shop", **fields}).encode()


def _raw(payload_json: str) -> bytes:
    return b'{"task_type": "echo", "app": "shop", "payload": ' + payload_json.encode() + b"}"


def _batch(tasks: list[Any]) -> bytes:
    return json.dumps({"tasks": tasks}).encode()


_OK = {"task_type": "echo", "app": "shop"}
_DEEP = "[" * 70 + "]" * 70
# (id, path, body, status, code, field: exact, or a prefix ending in "*", or None)
BAD_INPUT = [
    ("malformed_json", "/v1/tasks", b'{"task_type": "echo",', 400, "invalid_request", None),
    ("empty_body", "/v1/tasks", b"", 400, "invalid_request", None),
    ("not_an_object", "/v1/tasks", b"[1, 2]", 400, "invalid_request", None),
    (
        "duplicate_key",
        "/v1/tasks",
        b'{"app": "shop", "app": "x", "task_type": "echo"}',
        400,
        "invalid_request",
        None,
    ),
    ("unknown_field", "/v1/tasks", _task(colour="red"), 400, "invalid_request", "colour"),
    ("missing_app", "/v1/tasks", b'{"task_type": "echo"}', 400, "invalid_request", "app"),
    ("priority_type", "/v1/tasks", _task(priority="high"), 400, "invalid_request", "priority"),
    ("priority_range", "/v1/tasks", _task(priority=10), 400, "invalid_request", "priority"),
    ("priority_bool", "/v1/tasks", _task(priority=True), 400, "invalid_request", "priority"),
    (
        "unknown_task_type",
        "/v1/tasks",
        _task(task_type="nope"),
        400,
        "unknown_task_type",
        "task_type",
    ),
    ("unknown_app", "/v1/tasks", _task(app="nope"), 400, "unknown_task_type", "task_type"),
    ("negative_delay", "/v1/tasks", _task(delay_ms=-1), 400, "invalid_request", "delay_ms"),
    (
        "delay_and_run_at",
        "/v1/tasks",
        _task(delay_ms=5, run_at="2030-01-01T00:00:00Z"),
        400,
        "invalid_request",
        "run_at",
    ),
    ("bad_run_at", "/v1/tasks", _task(run_at="tomorrow"), 400, "invalid_request", "run_at"),
    (
        "run_at_no_zone",
        "/v1/tasks",
        _task(run_at="2030-01-01T00:00:00"),
        400,
        "invalid_request",
        "run_at",
    ),
    (
        "attempts_zero",
        "/v1/tasks",
        _task(retry={"attempts_max": 0}),
        400,
        "invalid_request",
        "retry.attempts_max",
    ),
    (
        "negative_base",
        "/v1/tasks",
        _task(retry={"backoff_base_ms": -1}),
        400,
        "invalid_request",
        "retry.backoff_base_ms",
    ),
    (
        "factor_below_one",
        "/v1/tasks",
        _task(retry={"backoff_factor": 0.5}),
        400,
        "invalid_request",
        "retry.backoff_factor",
    ),
    (
        "factor_over_100",  # a cap below the base is taken: it bounds every delay
        "/v1/tasks",
        _task(retry={"backoff_factor": 100.5}),
        400,
        "invalid_request",
        "retry.backoff_factor",
    ),
    (
        "retry_unknown_field",
        "/v1/tasks",
        _task(retry={"attempts": 3}),
        400,
        "invalid_request",
        "retry.attempts",
    ),
    (
        "key_over_256_bytes",
        "/v1/tasks",
        _task(idempotency_key="é" * 129),
        400,
        "invalid_request",
        "idempotency_key",
    ),
    (
        "huge_int",
        "/v1/tasks",
        _raw('{"n": 18446744073709551616}'),
        400,
        "invalid_request",
        "payload.n",
    ),
    (
        "huge_int_priority",
        "/v1/tasks",
        b'{"task_type": "echo", "app": "shop", "priority": 99999999999999999999999}',
        400,
        "invalid_request",
        "priority",
    ),
    ("nan", "/v1/tasks", _raw("NaN"), 400, "invalid_request", "payload"),
    ("infinity", "/v1/tasks", _raw('{"x": -Infinity}'), 400, "invalid_request", "payload.x"),
    ("float_overflow", "/v1/tasks", _raw("1e400"), 400, "invalid_request", "payload"),
    ("invalid_utf8", "/v1/tasks", _raw('"') + b"\xff\xfe" + b'"}', 400, "invalid_request", None),
    ("lone_surrogate", "/v1/tasks", _raw('"\\ud800"'), 400, "invalid_request", "payload"),
    ("too_deep", "/v1/tasks", _raw(_DEEP), 400, "invalid_request", "payload*"),
    (
        "blob_marker",
        "/v1/tasks",
        _task(payload={"$blob": "sha256:" + "0" * 64}),
        400,
        "invalid_request",
        "payload",
    ),
    (
        "body_over_cap",
        "/v1/tasks",
        _raw('"' + "x" * BODY_BYTES_MAX + '"'),
        413,
        "payload_too_large",
        None,
    ),
    ("batch_empty", "/v1/tasks:batch", _batch([]), 400, "invalid_request", "tasks"),
    ("batch_over_1000", "/v1/tasks:batch", _batch([_OK] * 1001), 400, "invalid_request", "tasks"),
    (
        "batch_bad_item",
        "/v1/tasks:batch",
        _batch([_OK, _OK, _OK, {**_OK, "priority": "high"}]),
        400,
        "invalid_request",
        "tasks[3].priority",
    ),
    (
        "batch_unknown_type",
        "/v1/tasks:batch",
        _batch([_OK, {**_OK, "task_type": "nope"}]),
        400,
        "unknown_task_type",
        "tasks[1].task_type",
    ),
    (
        "batch_key_conflict",
        "/v1/tasks:batch",
        _batch(
            [
                {**_OK, "idempotency_key": "k", "payload": 1},
                {**_OK, "idempotency_key": "k", "payload": 2},
            ]
        ),
        409,
        "conflict",
        "tasks[1].idempotency_key",
    ),
]


@pytest.mark.parametrize(
    ("path", "body", "status", "code", "field"),
    [c[1:] for c in BAD_INPUT],
    ids=[c[0] for c in BAD_INPUT],
)
def test_bad_input_is_rejected_and_changes_nothing(
    node: NodeProcess, path: str, body: bytes, status: int, code: str, field: str | None
) -> None:
    before = settled_count(node.base)
    got_status, reply = call(node.base, "POST", path, raw=body)
    assert (got_status, reply["error"]["code"]) == (status, code), reply
    error = reply["error"]
    if field is None:
        assert "field" not in error, error
    elif field.endswith("*"):
        assert error["field"].startswith(field[:-1]), error
        assert error["message"].startswith(field[:-1]), error
    else:
        assert error["field"] == field, error
        assert error["message"].startswith(f"{field}: "), error
    assert count_tasks(node.base) == before


def test_unknown_or_missing_key_is_401(node: NodeProcess) -> None:
    for key in (None, "not-a-key"):
        for method, path in (("GET", "/v1/tasks"), ("POST", "/worker/poll")):
            status, reply = call(node.base, method, path, {}, key=key)
            assert (status, reply["error"]["code"]) == (401, "unauthorized"), (key, path)
    assert call(node.base, "GET", "/healthz", key=None)[0] == 200


def test_other_tenants_tasks_are_not_found(node: NodeProcess) -> None:
    task_id = enqueue(node.base, "shop")
    for method, path in (("GET", f"/v1/tasks/{task_id}"), ("POST", f"/v1/tasks/{task_id}/cancel")):
        status, reply = call(node.base, method, path, key=KEY_B)
        assert (status, reply["error"]["code"]) == (404, "not_found")
        # Exactly what a missing id answers: the id leaks nothing.
        missing = call(node.base, method, path.replace(task_id, "0" * 32), key=KEY_B)
        assert missing[0] == 404
    assert get(node.base, task_id)["status"] == "ENQUEUED"
    assert all(
        t["task_id"] != task_id for t in call(node.base, "GET", "/v1/tasks", key=KEY_B)[1]["tasks"]
    )


def test_retried_enqueue_returns_the_same_task(node: NodeProcess) -> None:
    body = {"task_type": "echo", "app": "shop", "payload": {"a": 1}, "idempotency_key": "once"}
    first = call(node.base, "POST", "/v1/tasks", body)
    again = call(node.base, "POST", "/v1/tasks", body)
    assert first[0] == 201 and first[1]["created"] is True
    assert again[0] == 200 and again[1]["created"] is False
    assert again[1]["task_id"] == first[1]["task_id"]
    # The same key in another tenant is another task.
    other = call(node.base, "POST", "/v1/tasks", body, key=KEY_B)
    assert other[0] == 201 and other[1]["task_id"] != first[1]["task_id"]


def test_same_key_different_payload_is_a_conflict(node: NodeProcess) -> None:
    body = {"task_type": "echo", "app": "shop", "payload": {"a": 1}, "idempotency_key": "twin"}
    task_id = call(node.base, "POST", "/v1/tasks", body)[1]["task_id"]
    before = settled_count(node.base)
    status, reply = call(node.base, "POST", "/v1/tasks", {**body, "payload": {"a": 2}})
    assert (status, reply["error"]["code"]) == (409, "conflict")
    assert reply["error"]["field"] == "idempotency_key" and task_id in reply["error"]["message"]
    assert settled_count(node.base) == before
    assert get(node.base, task_id)["payload"] == {"a": 1}


def test_cancel_enqueued_task(node: NodeProcess) -> None:
    task_id = enqueue(node.base, "cancels")
    status, reply = call(node.base, "POST", f"/v1/tasks/{task_id}/cancel")
    assert (status, reply) == (200, {"task_id": task_id, "status": "CANCELED"})
    task = get(node.base, task_id)
    assert task["status"] == "CANCELED" and task["finished_ms"] is not None
    assert poll(node.base, "cancels", wait_ms=200) == []


def _list_all(base: str, query: str) -> list[str]:
    seen, cursor = [], None
    while True:
        status, page = call(
            base, "GET", f"/v1/tasks?{query}" + (f"&cursor={cursor}" if cursor else "")
        )
        assert status == 200, page
        seen += [t["task_id"] for t in page["tasks"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return seen


def test_list_filters_and_pages(node: NodeProcess) -> None:
    ids = {enqueue(node.base, "listing", task_type=t) for t in ("a", "a", "b")}
    wanted = sorted(i for i in ids if get(node.base, i)["task_type"] == "a")
    # Listing reads the Postgres snapshot, which trails the processors by the projection lag.
    deadline = time.monotonic() + 15.0
    while sorted(seen := _list_all(node.base, "task_type=a&status=enqueued&limit=1")) != wanted:
        assert time.monotonic() < deadline, seen
        time.sleep(0.05)
    assert len(seen) == len(set(seen)) == 2
    status, reply = call(node.base, "GET", "/v1/tasks?cursor=bogus")
    assert (status, reply["error"]["field"]) == (400, "cursor")
    status, reply = call(node.base, "GET", "/v1/tasks?status=DONE")
    assert (status, reply["error"]["field"]) == (400, "status")


def test_openapi_describes_every_route(node: NodeProcess) -> None:
    status, doc = call(node.base, "GET", "/openapi.json", key=None)
    assert status == 200 and doc["openapi"].startswith("3.1")
    expected = {
        "/v1/tasks",
        "/v1/tasks:batch",
        "/v1/tasks/{task_id}",
        "/v1/tasks:retry",
        "/v1/tasks/{task_id}/cancel",
        "/worker/register",
        "/worker/poll",
        "/worker/heartbeat",
        "/worker/complete",
        "/worker/checkpoint",
        "/healthz",
        "/openapi.json",
    }
    assert expected <= set(doc["paths"])


def test_a_query_string_is_refused_only_where_parameters_are_declared(node: NodeProcess) -> None:
    """contract/operations.py, rule 1: a route with query parameters names the one it does not
    know; a route with none ignores the query string (probes and document viewers add one)."""
    for op in OPERATIONS:
        if op.method != "get" or "{" in op.path or op.path == "/metrics":
            continue
        status, reply = call(node.base, "GET", f"{op.path}?no_such_parameter=1", timeout=10)
        if op.query is not None:
            assert status == 400, (op.path, status, reply)
            assert reply["error"]["field"] == "no_such_parameter", (op.path, reply)
        else:
            assert status == 200, (op.path, status, reply)


def test_a_post_that_declares_no_body_takes_none(node: NodeProcess) -> None:
    """contract/operations.py, rule 2: nothing, null or {} is no body; fields or another value
    are a 400 before the route acts (a paused queue stays as it was)."""
    posts = [op for op in OPERATIONS if op.method == "post" and op.body is None]
    assert {op.operation_id for op in posts} >= {"pause_queue", "resume_queue", "redeliver"}
    for op in posts:  # pause_queue before resume_queue: the queue ends as it began
        path = re.sub(r"\{\w+\}", "no-body", op.path)
        status, reply = call(node.base, "POST", path, {"reason": "maintenance"})
        assert status == 400, (path, status, reply)
        assert reply["error"]["field"] == "reason", reply
        assert "takes no body; send none" in reply["error"]["message"], reply
        for raw in (b"[1]", b'"x"', b"0"):
            status, reply = call(node.base, "POST", path, raw=raw)
            assert status == 400, (path, raw, status, reply)
            assert reply["error"]["message"].startswith(f"body: POST {op.path} takes no"), reply
        for empty in (None, b"null", b"{}", b" "):
            status, reply = call(node.base, "POST", path, raw=empty)
            assert status in (200, 404), (path, empty, status, reply)  # no such schedule, ...
    status, reply = call(node.base, "GET", "/v1/queues")
    assert not [q for q in reply["queues"] if q["queue"] == "no-body" and q.get("paused")]


# --- worker API ---------------------------------------------------------------------------


def test_worker_round_trip(node: NodeProcess) -> None:
    task_id = enqueue(node.base, "rt", payload={"x": 41})
    waited: dict[str, Any] = {}

    def long_poll() -> None:  # what handle.result() does: GET ?wait_ms=
        waited["reply"] = call(node.base, "GET", f"/v1/tasks/{task_id}?wait_ms=20000")

    waiter = threading.Thread(target=long_poll)
    waiter.start()
    (lease,) = poll(node.base, "rt")
    assert (lease["task_id"], lease["attempt"], lease["payload"]) == (task_id, 1, {"x": 41})
    assert get(node.base, task_id)["status"] == "LEASED"
    hb = call(
        node.base,
        "POST",
        "/worker/heartbeat",
        {"leases": [{"task_id": task_id, "lease_id": lease["lease_id"]}]},
    )
    assert hb == (200, {"actions": [{"task_id": task_id, "action": "CONTINUE"}]})
    checkpoint = {"task_id": task_id, "lease_id": lease["lease_id"], "value": {"step": 1}}
    status, saved = call(node.base, "POST", "/worker/checkpoint", {"checkpoints": [checkpoint]})
    assert status == 200 and saved["results"][0]["ok"] is True
    assert complete(node.base, lease, result={"y": 42})["ok"] is True
    waiter.join(timeout=30)
    status, task = waited["reply"]
    assert status == 200 and task["status"] == "SUCCEEDED"
    assert task["result"] == {"y": 42} and task["checkpoint"] == {"step": 1}
    assert [a["outcome"] for a in task["attempts"]] == ["SUCCEEDED"]


def test_stale_lease_is_rejected_and_changes_nothing(node: NodeProcess) -> None:
    task_id = enqueue(node.base, "stale", retry={"backoff_base_ms": 0, "backoff_cap_ms": 0})
    (first,) = poll(node.base, "stale", lease_ms=300)
    # No heartbeat: the lease lapses (a failed attempt) and the task goes back to the queue.
    wait_status(node.base, task_id, "ENQUEUED")
    (second,) = poll(node.base, "stale")
    assert second["lease_id"] > first["lease_id"]
    assert second["attempt"] == first["attempt"] + 1
    before = get(node.base, task_id)
    stale = complete(node.base, first, result="zombie", log="zombie output")
    assert stale["ok"] is False and "stale lease" in stale["reason"]
    after = get(node.base, task_id)
    assert after == before and after["status"] == "LEASED"
    assert [a["log_url"] for a in after["attempts"]] == [None, None]  # the zombie left none
    hb = call(
        node.base,
        "POST",
        "/worker/heartbeat",
        {"leases": [{"task_id": task_id, "lease_id": first["lease_id"]}]},
    )
    assert hb[1]["actions"][0]["action"] == "LOST"
    ref = {"task_id": task_id, "lease_id": second["lease_id"]}
    too_long = {"completions": [{**ref, "outcome": "SUCCEEDED", "log": "x" * 65_537}]}
    status, error = call(node.base, "POST", "/worker/complete", too_long)
    assert status == 400 and error["error"]["field"] == "completions[0].log", error
    assert complete(node.base, second, result="live", log="live output\n")["ok"] is True
    # A duplicate completion of a finished task changes nothing either.
    assert complete(node.base, second, result="again", log="again")["ok"] is False
    done = get(node.base, task_id)
    assert done["result"] == "live"
    url = done["attempts"][-1]["log_url"]
    assert url == f"/v1/tasks/{task_id}/logs/{second['lease_id']}"
    status, log = call(node.base, "GET", url)
    assert status == 200 and log["log"] == "live output\n"
    assert call(node.base, "GET", url, key=KEY_B)[0] == 404  # another tenant's task
    assert call(node.base, "GET", f"/v1/tasks/{task_id}/logs/{first['lease_id']}")[0] == 404


def test_a_deploy_that_removes_a_handler_counts_its_tasks_at_once_and_leaves_them_queued(
    node: NodeProcess,
) -> None:
    base = node.base
    v1 = {
        "agent_id": "d1",
        "app": "deploys",
        "version": "1",
        "deploy": 1,
        "task_types": ["keep", "drop"],
    }
    assert call(base, "POST", "/worker/register", v1) == (200, {"warnings": []})
    other = {**v1, "agent_id": "o1", "app": "deploys-other"}
    assert call(base, "POST", "/worker/register", other) == (200, {"warnings": []})
    dropped = [enqueue(base, "deploys", task_type="drop") for _ in range(2)]
    enqueue(base, "deploys-other", task_type="drop")  # the same type in another app
    enqueue(base, "deploys", task_type="keep")
    # At once, before the snapshot can have them: the count comes from the partitions' state,
    # and only the app's own tasks count.
    v2 = {**v1, "agent_id": "d2", "version": "2", "deploy": 2, "task_types": ["keep"]}
    status, reply = call(base, "POST", "/worker/register", v2)
    assert status == 200, reply
    assert reply["warnings"] == [
        "deploy 2 (version '2') of app 'deploys' removes the handler of task type 'drop', "
        "referenced by 2 unfinished task(s): they stay queued, dealt to no agent of this "
        "deploy (an agent of an older one still running takes them); deploy a version with "
        "the handler, or cancel them"
    ]
    # An agent of the old deploy still rolling out removes nothing and brings nothing back.
    assert call(base, "POST", "/worker/register", v1) == (200, {"warnings": []})
    status, error = call(
        base, "POST", "/v1/tasks", {"task_type": "drop", "app": "deploys", "payload": 1}
    )
    assert status == 400 and "removed from app 'deploys' by its version '2'" in str(error)
    # An agent of the new deploy is dealt only what it has a handler for; the removed type's
    # tasks stay queued (nothing invents a failure for them) and say what they wait for.
    (lease,) = poll(base, "deploys", capacity=3, task_types=["keep"], wait_ms=300)
    assert lease["task_type"] == "keep"
    for task_id in dropped:
        task = get(base, task_id)
        assert task["status"] == "ENQUEUED" and task["attempts"] == []
        assert "an agent serving task type 'drop'" in task["waiting_for"]
    # An agent of the old deploy, still running, has the handler: it takes them.
    leases = poll(base, "deploys", capacity=3, task_types=["keep", "drop"], wait_ms=300)
    assert sorted(x["task_id"] for x in leases) == sorted(dropped)
    # A deploy that serves the type again brings it back.
    v3 = {**v1, "agent_id": "d3", "version": "3", "deploy": 3}
    assert call(base, "POST", "/worker/register", v3) == (200, {"warnings": []})
    enqueue(base, "deploys", task_type="drop")


def test_cancel_of_a_leased_task_reaches_the_worker(node: NodeProcess) -> None:
    task_id = enqueue(node.base, "hb")
    (lease,) = poll(node.base, "hb")
    assert call(node.base, "POST", f"/v1/tasks/{task_id}/cancel")[1]["status"] == "LEASED"
    ref = {"task_id": task_id, "lease_id": lease["lease_id"]}
    other = {"task_id": "0" * 32, "lease_id": 1}
    status, hb = call(node.base, "POST", "/worker/heartbeat", {"leases": [ref, other]})
    assert [a["action"] for a in hb["actions"]] == ["CANCEL", "LOST"]
    # Another tenant's agent learns nothing and can do nothing.
    status, hb = call(node.base, "POST", "/worker/heartbeat", {"leases": [ref]}, key=KEY_B)
    assert status == 200 and hb["actions"][0]["action"] == "LOST"
    status, done = call(
        node.base,
        "POST",
        "/worker/complete",
        {"completions": [{**ref, "outcome": "CANCELED"}]},
        key=KEY_B,
    )
    assert status == 200 and done["results"][0] == {
        "task_id": task_id,
        "ok": False,
        "reason": "unknown task",
    }
    assert complete(node.base, lease, outcome="CANCELED")["ok"] is True
    assert get(node.base, task_id)["status"] == "CANCELED"


def test_large_payload_goes_through_the_blob_store(node: NodeProcess) -> None:
    payload = {"data": "z" * 400_000, "n": 7}
    task_id = enqueue(node.base, "blob", payload=payload, idempotency_key="big")
    again = call(
        node.base,
        "POST",
        "/v1/tasks",
        {"task_type": "echo", "app": "blob", "payload": payload, "idempotency_key": "big"},
    )
    assert again[1] == {"task_id": task_id, "created": False, "status": "ENQUEUED"}
    assert get(node.base, task_id)["payload"] == payload
    (lease,) = poll(node.base, "blob")
    assert lease["payload"] == payload
    assert complete(node.base, lease, result={"big": "r" * 300_000})["ok"] is True
    assert get(node.base, task_id)["result"] == {"big": "r" * 300_000}
    assert any((node.home / "blobs").rglob("*"))


def _fail(base: str, app: str, task_type: str) -> str:
    task_id = enqueue(base, app, task_type=task_type, retry={"attempts_max": 1})
    (lease,) = poll(base, app)
    error = {"class": "KeyError", "message": "missing", "stack": "Traceback..."}
    assert complete(base, lease, outcome="FAILED", error=error)["ok"] is True
    task = wait_status(base, task_id, "FAILED")
    assert task["error"]["class"] == "KeyError"
    return task_id


def wait_listed(base: str, task_id: str, status: str, timeout_s: float = 10.0) -> None:
    """Until the listing (the Postgres snapshot, which trails by the projection lag) shows
    ``task_id`` in ``status``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        page = call(base, "GET", f"/v1/tasks?status={status}&limit=1000")[1]
        if any(t["task_id"] == task_id for t in page["tasks"]):
            return
        time.sleep(0.02)
    raise AssertionError(f"{task_id} never listed as {status}")


def test_retry_failed_tasks(node: NodeProcess) -> None:
    by_id = _fail(node.base, "retries", "boom")
    status, reply = call(node.base, "POST", "/v1/tasks:retry", {"task_ids": [by_id]})
    assert status == 200 and [r["task_id"] for r in reply["retried"]] == [by_id]
    assert get(node.base, reply["retried"][0]["new_task_id"])["status"] == "ENQUEUED"
    assert get(node.base, by_id)["status"] == "FAILED"  # terminal states are final
    # Retrying again finds nothing: the dead letter was consumed.
    assert call(node.base, "POST", "/v1/tasks:retry", {"task_ids": [by_id]})[1]["retried"] == []
    by_filter = _fail(node.base, "retries2", "boom2")
    # A filter starts a bulk operation (tests/integration/test_operations.py covers it at scale).
    wait_listed(node.base, by_filter, "FAILED")
    status, op = call(node.base, "POST", "/v1/tasks:retry", {"filter": {"task_type": "boom2"}})
    assert status == 202 and op["kind"] == "retry", op
    deadline = time.monotonic() + 15
    while op["state"] == "running" and time.monotonic() < deadline:
        time.sleep(0.05)
        op = call(node.base, "GET", f"/v1/operations/{op['operation_id']}")[1]
    assert (op["state"], op["matched"], op["done"], op["changed"]) == ("done", 1, 1, 1), op
    assert call(node.base, "GET", f"/v1/operations/{op['operation_id']}", key=KEY_B)[0] == 404
    status, reply = call(node.base, "POST", "/v1/tasks:retry", {"task_ids": [by_id], "filter": {}})
    assert status == 400 and reply["error"]["field"] == "task_ids"
    # From the shell, a bulk retry is followed to its end (a progress bar on a terminal).
    by_cli = _fail(node.base, "retries3", "boom3")
    wait_listed(node.base, by_cli, "FAILED")
    followed = cli("retry", "--task-type", "boom3", "--url", node.base)
    assert followed.returncode == 0, followed.stderr
    assert followed.stdout.rstrip().endswith("done: 1 of 1 re-enqueued"), followed.stdout
    left = cli("retry", "--task-type", "boom3", "--no-wait", "--url", node.base)
    assert left.returncode == 0 and "started" in left.stdout, left.stdout
    mixed = cli("retry", by_cli, "--task-type", "boom3", "--url", node.base)
    assert mixed.returncode == 2 and "not both" in mixed.stderr, mixed.stderr


# --- the command line and durability ----------------------------------------------------


def cli(*args: str, key: str = KEY_A, app: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CONVEYOR_API_KEY": key, "COLUMNS": "80"}  # a plain terminal's width
    if app is not None:
        env["CONVEYOR_APP"] = app
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_cli_client_commands(node: NodeProcess) -> None:
    made = cli(
        "enqueue",
        "echo",
        "--app",
        "shop",
        "--payload",
        '{"from": "cli"}',
        "--delay",
        "1h",
        "--json",
        "--url",
        node.base,
    )
    assert made.returncode == 0, made.stderr
    task_id = json.loads(made.stdout)["task_id"]
    shown = cli("get", task_id, "--json", "--url", node.base)
    task = json.loads(shown.stdout)
    assert task["payload"] == {"from": "cli"} and task["run_at_ms"] > task["created_ms"]
    listed = cli("list", "--url", node.base)
    header, *rows = listed.stdout.splitlines()
    row = next(line for line in rows if task_id in line)  # one line, uncut
    cells = dict(zip(header.split(), row.split(), strict=True))
    assert cells["task"] in ("echo", "shop:echo"), listed.stdout  # the app once others show
    assert (cells["status"], cells["att"]) == ("ENQUEUED", "1"), listed.stdout
    canceled = cli("cancel", task_id, "--url", node.base)
    assert canceled.returncode == 0 and "CANCELED" in canceled.stdout
    # A bulk cancel by filter, followed to its end; no filter at all needs --all.
    queued = [enqueue(node.base, queue="bulk-cli", delay_ms=3_600_000) for _ in range(2)]
    for queued_id in queued:
        wait_listed(node.base, queued_id, "ENQUEUED")
    bulk = cli("cancel", "--queue", "bulk-cli", "--url", node.base)
    assert bulk.returncode == 0, bulk.stderr
    assert bulk.stdout.rstrip().endswith("done: 2 of 2 canceled or asked to stop"), bulk.stdout
    assert all(get(node.base, queued_id)["status"] == "CANCELED" for queued_id in queued)
    unfiltered = cli("cancel", "--url", node.base)
    assert unfiltered.returncode == 4 and "--all" in unfiltered.stderr, unfiltered.stderr
    bad = cli("enqueue", "echoo", "--url", node.base, app="shop")  # --app from $CONVEYOR_APP
    assert bad.returncode == 2 and "unknown_task_type" in bad.stderr
    assert "did you mean 'echo'?" in bad.stderr, bad.stderr


def test_kill_9_keeps_every_acknowledged_task(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_keys(home)
    first = NodeProcess(home)
    first.start()
    register(first.base)
    acknowledged = [enqueue(first.base, payload={"i": i}) for i in range(20)]
    batch = [{"task_type": "echo", "app": "shop", "payload": {"b": i}} for i in range(50)]
    status, reply = call(first.base, "POST", "/v1/tasks:batch", {"tasks": batch})
    assert status == 201
    acknowledged += [r["task_id"] for r in reply["results"]]
    assert first.stop(signal.SIGKILL) == -signal.SIGKILL
    second = NodeProcess(home)
    second.start()
    try:
        for task_id in acknowledged:
            assert get(second.base, task_id)["status"] == "ENQUEUED"
        assert settled_count(second.base) == len(acknowledged)
        # The registry survived too: enqueueing still works without a new registration.
        enqueue(second.base)
    finally:
        assert second.stop() == 0, second.logs()
        stop_orphaned_postgres(home)
    verified = cli("log", "verify", str(home))
    assert verified.returncode == 0, verified.stdout + verified.stderr


DEV_APP = """
from conveyor.app import App

app = App("devshop")


@app.task
def double(payload):
    return {"twice": payload["n"] * 2}
"""


def test_dev_runs_node_gateway_and_agent(tmp_path: Path) -> None:
    (tmp_path / "devshop.py").write_text(DEV_APP)
    dev = NodeProcess(tmp_path / "home", ("dev", "--app", "devshop:app"))
    # The app module is found in the working directory. No XDG_RUNTIME_DIR, as in a container.
    env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
    dev.start(cwd=tmp_path, env=env)
    try:
        keys = json.loads((tmp_path / "home" / "keys.json").read_text())["keys"]
        by_role = {entry["role"]: (key, entry) for key, entry in keys.items()}
        # A client key (printed) and, for the embedded agent, an agent key bound to the app.
        assert len(keys) == 2 and by_role["agent"][1]["app"] == "devshop", keys
        dev_key = by_role["client"][0]
        body = {"task_type": "double", "app": "devshop", "payload": {"n": 21}}
        deadline = time.monotonic() + 30
        while True:  # the agent registers its task types shortly after the node is up
            status, reply = call(dev.base, "POST", "/v1/tasks", body, key=dev_key)
            if status != 400 or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert status == 201, reply
        status, task = call(
            dev.base, "GET", f"/v1/tasks/{reply['task_id']}?wait_ms=20000", key=dev_key
        )
        assert (task["status"], task["result"]) == ("SUCCEEDED", {"twice": 42}), task
    finally:
        assert dev.stop(signal.SIGINT) == 0, dev.logs()
    assert "Warning" not in dev.logs(), dev.logs()  # a first screen without library noise


# -- cron schedules ---------------------------------------------------------------------------


def test_schedules_crud_is_tenant_scoped_and_validated(node: NodeProcess) -> None:
    base = node.base
    body = {
        "schedule_id": "nightly",
        "cron": "30 2 * * *",
        "timezone": "Europe/Paris",
        "overlap": "skip",
        "task": {"task_type": "echo", "app": "shop", "payload": {"n": 1}},
    }
    status, created = call(base, "POST", "/v1/schedules", body)
    assert status == 201, created
    assert created["schedule_id"] == "nightly" and created["overlap"] == "skip"
    assert created["catch_up"] == "once" and created["task"]["payload"] == {"n": 1}
    assert created["next_fire_ms"] > int(time.time() * 1000)
    status, replaced = call(base, "POST", "/v1/schedules", {**body, "cron": "0 * * * *"})
    assert status == 200 and replaced["cron"] == "0 * * * *"
    assert call(base, "GET", "/v1/schedules/nightly")[1]["cron"] == "0 * * * *"
    assert [s["schedule_id"] for s in call(base, "GET", "/v1/schedules")[1]["schedules"]] == [
        "nightly"
    ]
    # Another tenant sees nothing and can delete nothing.
    assert call(base, "GET", "/v1/schedules", key=KEY_B) == (200, {"schedules": []})
    assert call(base, "GET", "/v1/schedules/nightly", key=KEY_B)[0] == 404
    assert call(base, "DELETE", "/v1/schedules/nightly", key=KEY_B)[0] == 404
    assert call(base, "DELETE", "/v1/schedules/nightly") == (
        200,
        {"schedule_id": "nightly", "deleted": True},
    )
    assert call(base, "GET", "/v1/schedules/nightly")[0] == 404
    assert call(base, "DELETE", "/v1/schedules/nightly")[0] == 404


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"cron": "61 * * * *"}, "cron", "invalid cron expression '61 * * * *': "),
        ({"cron": "* * * * * *"}, "cron", "expected 5 fields"),
        ({"cron": "0 0 30 2 *"}, "cron", "never fires"),
        ({"timezone": "Mars/Olympus"}, "timezone", "unknown timezone 'Mars/Olympus'"),
        (
            {"overlap": "sometimes"},
            "overlap",
            "must be allow (the default), skip or cancel_previous",
        ),
        ({"task": {"task_type": "echo", "app": "shop", "delay_ms": 5}}, "task.delay_ms", "firing"),
    ],
)
def test_bad_schedules_are_a_400_naming_the_problem(
    node: NodeProcess, change: dict[str, Any], field: str, message: str
) -> None:
    body = {
        "schedule_id": "bad",
        "cron": "* * * * *",
        "task": {"task_type": "echo", "app": "shop"},
        **change,
    }
    status, reply = call(node.base, "POST", "/v1/schedules", body)
    assert status == 400, reply
    assert reply["error"]["field"] == field and message in reply["error"]["message"]
    assert call(node.base, "GET", "/v1/schedules/bad")[0] == 404


# -- HTTP framing (found by the schemathesis / hostile-HTTP fuzz runs) -------------------------


def raw_http(port: int, head: str, body: bytes = b"", timeout: float = 10.0) -> tuple[int, Any]:
    """One request written by hand on a fresh socket (``head``: request line and headers, no
    blank line): the status and JSON body of the reply. A server that does not answer within
    ``timeout`` fails the test (a hang), it does not block it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            s.sendall(head.encode() + b"\r\n\r\n" + body)
        reply = b""
        while b"\r\n\r\n" not in reply or len(reply.split(b"\r\n\r\n", 1)[1]) < _length(reply):
            chunk = s.recv(65536)
            if not chunk:
                break
            reply += chunk
    headers, _, content = reply.partition(b"\r\n\r\n")
    try:
        return int(headers.split()[1]), json.loads(content or b"null")
    except ValueError:  # aiohttp's parser rejects broken framing itself, in plain text
        return int(headers.split()[1]), content.decode(errors="replace")


def _length(reply: bytes) -> int:
    for line in reply.split(b"\r\n\r\n", 1)[0].split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 1 << 62


def test_body_framing_errors_are_structured_4xx(node: NodeProcess) -> None:
    """Regressions: a non-JSON Content-Type was accepted (now 415); a declared length over the
    cap waited for the whole body (now 413 at once); a body that fails to gunzip was a 500."""
    before = settled_count(node.base)
    body = _task()
    auth = f"Authorization: Bearer {KEY_A}"
    post = f"POST /v1/tasks HTTP/1.1\r\nHost: x\r\n{auth}\r\nConnection: close\r\n"
    cases = [
        (f"{post}Content-Type: text/plain\r\nContent-Length: {len(body)}", body, 415),
        (f"{post}Content-Length: {len(body)}", body, 415),
        (f"{post}Content-Type: application/json\r\nContent-Length: {BODY_BYTES_MAX + 1}", b"", 413),
        (
            f"{post}Content-Type: application/json\r\nContent-Encoding: gzip\r\nContent-Length: 10",
            b"\x1f\x8b" + b"\0" * 8,
            400,
        ),
    ]
    for head, payload, status in cases:
        started = time.monotonic()
        got, reply = raw_http(node.port, head, payload, timeout=5.0)
        assert got == status and reply["error"]["code"], (head, got, reply)
        assert time.monotonic() - started < 2.0, head
    assert count_tasks(node.base) == before


def test_the_breakers_agents_report_open_show_on_metrics_and_in_the_queues_view(
    node: NodeProcess,
) -> None:
    base = node.base
    name = 'conveyor_agent_breakers_open{app="breakers",task_type="resize",tenant="alpha"}'
    # An agent whose breaker holds "resize" back polls for its other types and says so.
    held = {"agent_id": "breaking", "task_types": ["echo"], "open_breakers": ["resize"]}
    assert poll(base, "breakers", wait_ms=0, **held) == []
    assert gauge(base, name) == 1
    status, reply = call(base, "GET", "/v1/queues")
    assert status == 200 and reply["breakers"] == [
        {"app": "breakers", "task_type": "resize", "agents": 1}
    ]
    assert call(base, "GET", "/v1/queues", key=KEY_B)[1]["breakers"] == []  # alpha's only
    # Its next poll, once the breaker closed, clears it.
    poll(base, "breakers", wait_ms=0, agent_id="breaking", task_types=["echo", "resize"])
    assert call(base, "GET", "/v1/queues")[1]["breakers"] == []
