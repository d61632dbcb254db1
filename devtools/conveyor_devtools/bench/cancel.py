"""``conveyor bench cancel``: how long a cancel takes to reach a running handler.

On a fresh home the bench starts ``conveyor dev`` (the embedded node, its gateway and an agent
with its default 10 s heartbeat, guests running ``cancel_app``) as a subprocess, and talks to
it as a user would, through the SDK's ``AsyncClient``. On the idle node it runs ``count``
cooperative ``spin`` tasks one at a time; each, once its handler runs, is canceled, and the
figure is the cancel request (client wall clock just before ``POST /v1/tasks/{id}/cancel``) ->
the handler saw ``ctx.cancelled`` (the wall clock it returns). The agent's heartbeat interval
bounds that from above when the cancel waits for a heartbeat; the node's signals call
(``streams/processor/signals.py``) makes it a round trip.

A task whose handler had not started when the cancel went out (its guest was slow to take it)
is counted in ``not_running`` and left out of the figure: it measures a cancel of a queued
task. Each task must end CANCELED with the handler's result, else the run fails.

The node is stopped by pid at the end, whatever happened (SIGINT, then KILL).
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from conveyor.aclient import AsyncClient
from conveyor.errors import ContractError

APP_REF = "conveyor_devtools.bench.cancel_app:app"
APP = "bench-cancel"
START_TIMEOUT_S = 60.0
RUNNING_SETTLE_S = 0.2  # after LEASED: the warm guest starts the handler well within it
TASK_TIMEOUT_S = 30.0
P99_MS_MAX = 1_000.0  # the bar: a cancel reaches a running handler within a second


async def bench_cancel(*, count: int = 50, home: str | None = None) -> dict[str, Any]:
    """Cancel ``count`` running tasks one by one; the latencies' p50 / p99 / max (ms)."""
    with tempfile.TemporaryDirectory(prefix="conveyor-cancel-") as tmp:
        root = Path(home or tmp)
        root.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        proc = _start_dev(root, port)
        try:
            url = f"http://127.0.0.1:{port}"
            key = await _wait_for_key(root / "home", proc, root / "dev.out")
            async with AsyncClient(url, key, app=APP) as client:
                await _warm_up(client)
                return await _measure(client, count)
        finally:
            _stop(proc)


def _start_dev(root: Path, port: int) -> subprocess.Popen[bytes]:
    cmd = [sys.executable, "-m", "conveyor.cli", "dev", "--app", APP_REF, "--no-projection"]
    cmd += ["--home", str(root / "home"), "--port", str(port), "--partitions", "2"]
    with open(root / "dev.out", "wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


async def _wait_for_key(home: Path, proc: subprocess.Popen[bytes], out: Path) -> str:
    """The dev key, once the node wrote it (it does so before it listens)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"conveyor dev exited {proc.returncode}:\n{out.read_text()}")
        try:
            keys = json.loads((home / "keys.json").read_text())["keys"]
            return str(next(k for k, e in keys.items() if e.get("role") != "agent"))
        except (OSError, ValueError, KeyError, StopIteration):
            await asyncio.sleep(0.05)
    raise RuntimeError(f"conveyor dev wrote no key in {START_TIMEOUT_S}s:\n{out.read_text()}")


async def _warm_up(client: AsyncClient) -> None:
    """Until the agent registered the app and ran a task: neither lands in a measurement."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            handle = await client.enqueue("noop", None)
            break
        except (ContractError, OSError) as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the node never took a task: {exc}") from exc
            await asyncio.sleep(0.05)
    await handle.result(timeout=START_TIMEOUT_S)


async def _measure(client: AsyncClient, count: int) -> dict[str, Any]:
    latencies: list[float] = []
    not_running = 0
    for _ in range(count):
        latency = await _one(client)
        if latency is None:
            not_running += 1
        else:
            latencies.append(latency)
    return {
        "count": len(latencies),
        "not_running": not_running,
        **_percentiles(latencies),
        "heartbeat_s": _dev_heartbeat_s(),
    }


def _dev_heartbeat_s() -> float:
    """The heartbeat interval of the agent ``conveyor dev`` runs: ``run_agent``'s default."""
    import inspect

    from conveyor.agents.host import run_agent

    default = inspect.signature(run_agent).parameters["heartbeat_s"].default
    return float(default)


async def _one(client: AsyncClient) -> float | None:
    """Enqueue one spin, cancel it once it runs; ms from the cancel to the handler seeing it
    (None: the handler had not started when the cancel went out)."""
    handle = await client.enqueue("spin", None)
    deadline = time.monotonic() + TASK_TIMEOUT_S
    while (await handle.status()) != "LEASED":
        if time.monotonic() > deadline:
            raise RuntimeError(f"task {handle.id} was never leased")
        await asyncio.sleep(0.01)
    await asyncio.sleep(RUNNING_SETTLE_S)
    asked_ms = time.time() * 1000
    await handle.cancel()
    info = await client.wait(handle.id, TASK_TIMEOUT_S)
    if info.status != "CANCELED" or not isinstance(info.result, dict):
        raise RuntimeError(f"task {handle.id} ended {info.status} with {info.result!r}")
    if info.result["started_ms"] > asked_ms:
        return None
    return float(info.result["saw_ms"]) - asked_ms


def _percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50_ms": None, "p99_ms": None, "max_ms": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"p50_ms": at(0.50), "p99_ms": at(0.99), "max_ms": round(ordered[-1], 2)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
