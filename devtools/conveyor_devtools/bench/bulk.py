"""``conveyor bench bulk``: a bulk cancel by filter over a million tasks, and the API meanwhile.

A real ``conveyor node`` (subprocess, embedded PostgreSQL) gets ``tasks`` ENQUEUED tasks (no
agent runs them); once the snapshot holds them all, ``POST /v1/tasks:cancel`` with a filter
matching every one starts the operation. While it runs, one client measures the API with a
mix of requests in turn (a list page, a task read, a single enqueue), and the operation's
progress is polled; the figures are its duration and rate and the API latencies during it.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx

from conveyor_devtools.bench.e2e import Cluster

APP = "bulkbench"
ENQUEUE_BATCH = 1_000
ENQUEUERS = 4
TIMEOUT_S = 1_800.0  # a million tasks take ~15 min on the 2-core machine


class _BulkCluster(Cluster):
    APP_NAME = APP  # its agent key is bound to the app this bench registers


async def bench_bulk(*, tasks: int = 1_000_000, partitions: int = 8) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-bulk-") as tmp:
        cluster = _BulkCluster(Path(tmp), partitions, 0, 1, 0)
        try:
            await cluster.start()
            auth = {"Authorization": f"Bearer {cluster.key}"}
            worker = {"Authorization": f"Bearer {cluster.agent_key}"}
            async with httpx.AsyncClient(base_url=cluster.url, headers=auth, timeout=60) as http:
                await _register(http, worker)
                return await _run(http, tasks, partitions)
        finally:
            cluster.stop()


async def _register(http: httpx.AsyncClient, worker: dict[str, str]) -> None:
    """Registration is the worker protocol: it takes the cluster's agent key, not the client's."""
    body = {"agent_id": "bench", "app": APP, "version": "1", "task_types": ["noop"]}
    (await http.post("/worker/register", json=body, headers=worker)).raise_for_status()


async def _run(http: httpx.AsyncClient, tasks: int, partitions: int) -> dict[str, Any]:
    started = time.perf_counter()
    await asyncio.gather(*(_enqueue(http, k, tasks) for k in range(ENQUEUERS)))
    enqueue_s = time.perf_counter() - started
    await _wait_listed(http, tasks)
    projected_s = time.perf_counter() - started
    idle = await _baseline(http)
    begun = time.perf_counter()
    reply = await http.post("/v1/tasks:cancel", json={"filter": {"status": ["ENQUEUED"]}})
    accept_ms = (time.perf_counter() - begun) * 1000
    reply.raise_for_status()
    op_id = reply.json()["operation_id"]
    latencies, op = await _while_running(http, op_id)
    op_s = time.perf_counter() - begun
    out: dict[str, Any] = {
        "tasks": tasks,
        "partitions": partitions,
        "operation": {k: op[k] for k in ("state", "matched", "done", "changed")},
        "accept_ms": round(accept_ms, 1),
        "operation_s": round(op_s, 1),
        "operation_tasks_per_s": round(op["done"] / op_s),
        "enqueue_s": round(enqueue_s, 1),
        "projected_s": round(projected_s, 1),
    }
    for when, figures in (("during", latencies), ("idle", idle)):
        for name, values in figures.items():
            ordered = sorted(values)
            out[f"{name}_{when}_n"] = len(ordered)
            out[f"{name}_{when}_p50_ms"] = round(statistics.median(ordered), 1)
            out[f"{name}_{when}_p99_ms"] = round(ordered[int(len(ordered) * 0.99)], 1)
            out[f"{name}_{when}_max_ms"] = round(ordered[-1], 1)
    return out


async def _enqueue(http: httpx.AsyncClient, k: int, tasks: int) -> None:
    for lo in range(k * ENQUEUE_BATCH, tasks, ENQUEUERS * ENQUEUE_BATCH):
        n = min(ENQUEUE_BATCH, tasks - lo)
        batch = [{"task_type": "noop", "app": APP, "payload": {}}] * n
        (await http.post("/v1/tasks:batch", json={"tasks": batch})).raise_for_status()


async def _wait_listed(http: httpx.AsyncClient, tasks: int) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        usage = (await http.get("/v1/tenants/me/usage")).json()
        if usage["tasks"]["ENQUEUED"] >= tasks:
            return
        await asyncio.sleep(0.5)
    raise RuntimeError("the snapshot never held every task")


Request = Callable[[], Awaitable[httpx.Response]]


def _requests(http: httpx.AsyncClient, task_id: str) -> dict[str, Request]:
    one = {"task_type": "noop", "app": APP, "payload": {}}
    return {
        "list": lambda: http.get("/v1/tasks", params={"limit": 20}),
        "get": lambda: http.get(f"/v1/tasks/{task_id}"),
        "enqueue": lambda: http.post("/v1/tasks", json=one),
    }


async def _probe(requests: dict[str, Request], latencies: dict[str, list[float]]) -> None:
    """One of each request, in turn, timed."""
    for name, request in requests.items():
        started = time.perf_counter()
        (await request()).raise_for_status()
        latencies.setdefault(name, []).append((time.perf_counter() - started) * 1000)


async def _baseline(http: httpx.AsyncClient, rounds: int = 60) -> dict[str, list[float]]:
    """The same requests with no operation running, for comparison."""
    one = {"task_type": "noop", "app": APP, "payload": {}}
    task_id = (await http.post("/v1/tasks", json=one)).json()["task_id"]
    latencies: dict[str, list[float]] = {}
    for _ in range(rounds):
        await _probe(_requests(http, task_id), latencies)
        await asyncio.sleep(0.01)
    return latencies


async def _while_running(
    http: httpx.AsyncClient, op_id: str
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """API latencies (ms) while the operation runs, and the operation when it ended."""
    latencies: dict[str, list[float]] = {}
    one = {"task_type": "noop", "app": APP, "payload": {}}
    task_id = (await http.post("/v1/tasks", json=one)).json()["task_id"]
    requests = _requests(http, task_id)
    deadline = time.monotonic() + TIMEOUT_S
    last_poll = 0.0
    op: dict[str, Any] = {"state": "running"}
    while op["state"] == "running" and time.monotonic() < deadline:
        await _probe(requests, latencies)
        if time.monotonic() - last_poll > 0.5:
            op = (await http.get(f"/v1/operations/{op_id}")).json()
            last_poll = time.monotonic()
        await asyncio.sleep(0.01)
    return latencies, op
