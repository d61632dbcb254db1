"""A small bench of the events stream and webhook deliveries against a real node process.

    python -m conveyor_devtools.bench.webhooks [--events 5000] [--deliveries 2000] [--json]

It starts ``conveyor node --no-projection --webhooks-allow-private`` on a fresh home and a free
port of 127.0.0.1, then:

- SSE: enqueues ``--events`` tasks, and reads them back as ``task.enqueued`` events over one
  ``GET /v1/events`` stream from the cursor taken before: events/s of the read alone.
- webhooks: registers a webhook for ``task.enqueued`` to a receiver on 127.0.0.1 (in this
  process) that verifies every signature, enqueues ``--deliveries`` tasks, and times until
  every one was delivered: deliveries/s from the first enqueue to the last delivery.

The node is stopped (by its PID) at the end. Figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from standardwebhooks import Webhook

KEY = "bench-events-key-0123456789"
BATCH = 500  # tasks per enqueue request
START_TIMEOUT_S = 60.0
RUN_TIMEOUT_S = 300.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_node(home: Path, port: int) -> subprocess.Popen[bytes]:
    home.mkdir(parents=True)
    (home / "keys.json").write_text(json.dumps({"keys": {KEY: {"tenant": "bench"}}}))
    cmd = [sys.executable, "-m", "conveyor.cli", "node", "--home", str(home), "--port", str(port)]
    cmd += ["--no-projection", "--webhooks-allow-private", "--partitions", "4"]
    out = open(home.parent / "node.out", "wb")  # noqa: SIM115
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)


async def _call(session: aiohttp.ClientSession, method: str, url: str, body: Any = None) -> Any:
    async with session.request(method, url, json=body) as reply:
        data = await reply.json()
        if reply.status >= 300:
            raise RuntimeError(f"{method} {url}: {reply.status} {data}")
        return data


async def _wait_healthy(session: aiohttp.ClientSession, base: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with contextlib.suppress(aiohttp.ClientError):
            async with session.get(base + "/healthz") as reply:
                if reply.status == 200:
                    return
        await asyncio.sleep(0.1)
    raise RuntimeError("the node did not become healthy")


async def _enqueue(session: aiohttp.ClientSession, base: str, n: int) -> None:
    for first in range(0, n, BATCH):
        tasks = [
            {"task_type": "echo", "app": "bench", "payload": {"i": i}}
            for i in range(first, min(n, first + BATCH))
        ]
        await _call(session, "POST", base + "/v1/tasks:batch", {"tasks": tasks})


async def _sse(session: aiohttp.ClientSession, base: str, n: int) -> dict[str, Any]:
    cursor = (await _call(session, "GET", base + "/v1/events?wait_ms=0"))["cursor"]
    await _enqueue(session, base, n)
    headers = {"Accept": "text/event-stream"}
    url = f"{base}/v1/events?after={cursor}&type=task.enqueued"
    started = time.perf_counter()
    seen = 0
    async with session.get(url, headers=headers) as reply:
        async for line in reply.content:
            if line.startswith(b"data: "):
                seen += 1
                if seen == n:
                    break
    took = time.perf_counter() - started
    return {"events": n, "seconds": round(took, 3), "events_per_s": round(n / took)}


async def _webhooks(session: aiohttp.ClientSession, base: str, n: int) -> dict[str, Any]:
    done = asyncio.Event()
    delivered: set[str] = set()
    secret: list[str] = []

    async def receive(request: web.Request) -> web.Response:
        raw = await request.read()
        Webhook(secret[0]).verify(raw, dict(request.headers))
        delivered.add(request.headers["webhook-id"])
        if len(delivered) >= n:
            done.set()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", receive)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = _free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        hook = await _call(
            session,
            "POST",
            base + "/v1/webhooks",
            {"url": f"http://127.0.0.1:{port}/hook", "events": ["task.enqueued"]},
        )
        secret.append(hook["secret"])
        started = time.perf_counter()
        await _enqueue(session, base, n)
        enqueued = time.perf_counter() - started
        await asyncio.wait_for(done.wait(), RUN_TIMEOUT_S)
        took = time.perf_counter() - started
    finally:
        await runner.cleanup()
    return {
        "deliveries": n,
        "seconds": round(took, 3),
        "deliveries_per_s": round(n / took),
        "enqueue_seconds": round(enqueued, 3),
    }


async def _run(events: int, deliveries: int, home: Path) -> dict[str, Any]:
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = _start_node(home, port)
    headers = {"Authorization": f"Bearer {KEY}"}
    try:
        async with aiohttp.ClientSession(headers=headers) as session:
            await _wait_healthy(session, base)
            register = {"agent_id": "bench", "app": "bench", "version": "1", "task_types": ["echo"]}
            await _call(session, "POST", base + "/worker/register", register)
            sse = await _sse(session, base, events)
            hooks = await _webhooks(session, base, deliveries)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)
    return {"sse": sse, "webhooks": hooks, "cpus": os.cpu_count()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5_000)
    parser.add_argument("--deliveries", type=int, default=2_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-events-") as tmp:
        result = asyncio.run(_run(args.events, args.deliveries, Path(tmp) / "home"))
    if args.json:
        print(json.dumps(result))
        return
    sse, hooks = result["sse"], result["webhooks"]
    print(f"SSE: {sse['events']} events in {sse['seconds']} s, {sse['events_per_s']} events/s")
    print(
        f"webhooks: {hooks['deliveries']} deliveries in {hooks['seconds']} s, "
        f"{hooks['deliveries_per_s']} deliveries/s (enqueued in {hooks['enqueue_seconds']} s)"
    )


if __name__ == "__main__":
    main()
