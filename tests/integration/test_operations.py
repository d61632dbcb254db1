"""Bulk retry and bulk cancel by filter through a real ``conveyor node``: the request answers
202 at once, the node works through the matches in batches in the background while the API
stays responsive, progress is reported by ``GET /v1/operations/{id}``, and an operation that
a kill -9 interrupted resumes from its cursor when the node starts again."""

from __future__ import annotations

import signal
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from test_gateway import (
    KEY_A,
    KEY_B,
    NodeProcess,
    call,
    get,
    stop_orphaned_postgres,
    write_keys,
)

from conveyor import Client

pytestmark = pytest.mark.timeout(300)

APP = {"agent_id": "setup", "app": "bulk", "version": "1", "task_types": ["echo", "boom"]}
CANCELED_N = 40_000
FAILED_N = 2_500


def register(base: str) -> None:
    for key in (KEY_A, KEY_B):
        assert call(base, "POST", "/worker/register", APP, key=key) == (200, {"warnings": []})


def enqueue_many(base: str, n: int, task_type: str, key: str = KEY_A, **fields: Any) -> list[str]:
    ids: list[str] = []
    while len(ids) < n:
        size = min(1000, n - len(ids))
        tasks = [{"task_type": task_type, "app": "bulk", "payload": {}, **fields}] * size
        status, reply = call(base, "POST", "/v1/tasks:batch", {"tasks": tasks}, key=key)
        assert status == 201, reply
        ids += [r["task_id"] for r in reply["results"]]
    return ids


def listed(base: str, status: str, want: int, key: str = KEY_A, timeout_s: float = 60.0) -> None:
    """Until the snapshot holds ``want`` tasks of the tenant in ``status`` (it trails the log;
    the usage endpoint counts exactly, where a listing's count may be an estimate)."""
    deadline = time.monotonic() + timeout_s
    count = None
    while time.monotonic() < deadline:
        status_code, usage = call(base, "GET", "/v1/tenants/me/usage", key=key)
        assert status_code == 200, usage
        count = usage["tasks"][status]
        if count == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"{status}: {count} tasks, expected {want}")


def operation(base: str, op_id: str) -> dict[str, Any]:
    status, op = call(base, "GET", f"/v1/operations/{op_id}")
    assert status == 200, op
    return dict(op)


def wait_done(base: str, op_id: str, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        op = operation(base, op_id)
        if op["state"] != "running" or time.monotonic() > deadline:
            assert op["state"] == "done", op
            return op
        time.sleep(0.05)


def timed_ms(base: str, path: str) -> float:
    started = time.perf_counter()
    status, _ = call(base, "GET", path)
    assert status == 200
    return (time.perf_counter() - started) * 1000


def test_bulk_cancel_runs_in_the_background_and_resumes_after_kill_9(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_keys(home)
    first = NodeProcess(home)
    first.start()
    second = NodeProcess(home)
    try:
        register(first.base)
        targets = enqueue_many(first.base, CANCELED_N, "echo", queue="bulkq")
        bystanders = enqueue_many(first.base, 200, "echo", queue="other")
        foreign = enqueue_many(first.base, 200, "echo", key=KEY_B, queue="bulkq")
        listed(first.base, "ENQUEUED", CANCELED_N + 200)

        started = time.perf_counter()
        body = {"filter": {"queue": "bulkq", "status": ["ENQUEUED"]}, "reason": "bulk test"}
        status, op = call(first.base, "POST", "/v1/tasks:cancel", body)
        accept_ms = (time.perf_counter() - started) * 1000
        assert status == 202 and op["state"] == "running", op
        assert accept_ms < 1_000, f"the 202 took {accept_ms:.0f} ms"

        # The API answers while the operation works; measure until it is well under way.
        latencies: list[float] = []
        while (progress := operation(first.base, op["operation_id"]))["done"] < CANCELED_N // 3:
            assert progress["state"] == "running", progress
            latencies.append(timed_ms(first.base, "/v1/tasks?limit=20"))
            latencies.append(timed_ms(first.base, f"/v1/tasks/{bystanders[0]}"))
        assert progress["matched"] == CANCELED_N
        latencies.sort()
        p99 = latencies[int(len(latencies) * 0.99)]
        print(
            f"API during bulk cancel: n={len(latencies)} p50={statistics.median(latencies):.1f}"
            f" ms p99={p99:.1f} ms max={latencies[-1]:.1f} ms"
        )
        assert p99 < 250, latencies[-20:]

        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        restarted_ms = time.time() * 1000
        second.start()
        op = wait_done(second.base, op["operation_id"])
        assert op["updated_ms"] >= restarted_ms, "the second node did not resume it"
        assert (op["matched"], op["done"], op["changed"]) == (CANCELED_N,) * 3, op
        for task_id in targets[:: CANCELED_N // 50]:
            task = get(second.base, task_id)
            assert (task["status"], task["error"]["message"]) == ("CANCELED", "bulk test")
        # Other queues and other tenants were never touched.
        assert {get(second.base, t)["status"] for t in bystanders} == {"ENQUEUED"}
        assert {get(second.base, t, KEY_B)["status"] for t in foreign} == {"ENQUEUED"}
        assert call(second.base, "GET", f"/v1/operations/{op['operation_id']}", key=KEY_B)[0] == 404
    finally:
        if first.proc is not None and first.proc.poll() is None:
            first.stop()
        if second.proc is not None:
            assert second.stop() == 0, second.logs()
        stop_orphaned_postgres(home)


def fail_all(base: str, n: int) -> None:
    """Lease every ``boom`` task and report it FAILED (one attempt: straight to FAILED)."""
    failed = 0
    while failed < n:
        body = {"agent_id": "a", "app": "bulk", "capacity": 1000, "wait_ms": 2000}
        status, reply = call(base, "POST", "/worker/poll", body)
        assert status == 200 and reply["leases"], reply
        error = {"class": "KeyError", "message": "missing sku", "stack": "Traceback..."}
        items = [
            {"task_id": lease["task_id"], "lease_id": lease["lease_id"], "outcome": "FAILED"}
            | {"error": error}
            for lease in reply["leases"]
        ]
        status, reply = call(base, "POST", "/worker/complete", {"completions": items})
        assert status == 200 and all(r["ok"] for r in reply["results"]), reply
        failed += len(items)


def test_bulk_retry_by_filter(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_keys(home)
    node = NodeProcess(home)
    node.start()
    try:
        register(node.base)
        failed = enqueue_many(node.base, FAILED_N, "boom", retry={"attempts_max": 1})
        fail_all(node.base, FAILED_N)
        listed(node.base, "FAILED", FAILED_N)
        bad = call(node.base, "POST", "/v1/tasks:retry", {"filter": {"status": "ENQUEUED"}})
        assert bad[0] == 400 and bad[1]["error"]["field"] == "filter.status", bad

        body = {"filter": {"task_type": "boom", "error_class": "KeyError"}}
        status, op = call(node.base, "POST", "/v1/tasks:retry", body)
        assert status == 202, op
        op = wait_done(node.base, op["operation_id"])
        assert (op["matched"], op["done"], op["changed"]) == (FAILED_N,) * 3, op
        # Each dead letter got one new ENQUEUED task; the originals stay FAILED.
        listed(node.base, "ENQUEUED", FAILED_N)
        assert get(node.base, failed[0])["status"] == "FAILED"
        # Again, through the SDK: the dead letters were consumed, so nothing more is retried.
        with Client(node.base, KEY_A) as client:
            started = client.retry_where(task_type="boom", error_class="KeyError")
            assert started.kind == "retry" and not started.finished
            again = wait_done(node.base, started.operation_id)
            assert client.operation(started.operation_id).finished
        assert (again["done"], again["changed"]) == (FAILED_N, 0), again
    finally:
        assert node.stop() == 0, node.logs()
