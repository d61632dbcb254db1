"""Dramatiq on Redis 7 with ``appendonly yes`` and ``appendfsync always``.

Redis answers a write only after its AOF is fsynced (one fsync per event-loop turn, shared by
every client served in it). Dramatiq has no batch enqueue (``group()`` sends one message at a
time), so each caller sends its batch message by message from its own thread. Workers are the
``dramatiq`` CLI: ``--processes`` x ``--threads``, prefetching 2 x threads messages per
consumer. An idle Dramatiq consumer polls Redis with exponential backoff capped at the worker
timeout (``$dramatiq_worker_timeout``, 1000 ms by default): that cap bounds the idle
schedule-to-start, so the comparison sets it low (``worker_timeout_ms``).
"""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import ModuleType

import redis
from peerlib import Stamps, drained, free_port, run_phases, spawn, stop, wait_for

QUEUE = "default"


class DramatiqPeer:
    def __init__(self, tasks: ModuleType) -> None:
        self.tasks = tasks

    async def enqueue_noop(self) -> None:
        self.tasks.noop.send()

    async def enqueue_stamp(self, key: str) -> None:
        self.tasks.stamp.send(key)

    async def enqueue_batch(self, n: int) -> None:
        send = self.tasks.noop.send

        def batch() -> None:
            for _ in range(n):
                send()

        await asyncio.to_thread(batch)

    async def enqueue_noops_at_once(self, n: int, callers: int) -> list[float]:
        latencies: list[float] = []
        send = self.tasks.noop.send

        def caller(k: int) -> None:  # redis-py is blocking: one thread per caller
            for _ in range(k, n, callers):
                sent = time.perf_counter()
                send()
                latencies.append((time.perf_counter() - sent) * 1000)

        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(callers) as pool:
            await asyncio.gather(*(loop.run_in_executor(pool, caller, k) for k in range(callers)))
        return latencies

    async def remaining(self) -> int:
        # Queued plus unacknowledged (in progress) messages, as RedisBroker.join counts them.
        return int(self.tasks.broker.do_qsize(QUEUE))


async def bench_dramatiq(
    tmp: Path,
    *,
    tasks: int,
    single: int,
    concurrent: int,
    idle: int,
    processes: int = 2,
    threads: int = 8,
    worker_timeout_ms: int = 10,
) -> dict:
    if shutil.which("redis-server") is None:
        raise RuntimeError("redis-server is not installed (Debian: apt-get install redis-server)")
    port = free_port()
    (tmp / "redis").mkdir()
    server = spawn(_redis_args(port, tmp / "redis"), tmp / "redis.out")
    workers = None
    stamps = Stamps()
    try:
        client = redis.Redis(port=port)
        await wait_for("redis-server", lambda: _ping(client), 30.0)
        config = {k: client.config_get(k)[k] for k in ("appendonly", "appendfsync", "save")}
        env = {
            "PEERS_REDIS_URL": f"redis://127.0.0.1:{port}/0",
            "PEERS_STAMP_PORT": str(stamps.port),
            "dramatiq_worker_timeout": str(worker_timeout_ms),
        }
        os.environ.update(env)  # the bench imports the same actors, on the same broker
        sys.path.insert(0, str(Path(__file__).parent))
        peer = DramatiqPeer(importlib.import_module("dramatiq_tasks"))
        workers = spawn(_worker_args(processes, threads), tmp / "dramatiq.out", env)
        await _warm_up(peer)
        result = await run_phases(
            peer,
            stamps,
            tasks=tasks,
            single=single,
            concurrent=concurrent,
            idle=idle,
            server=[server.pid],
            workers=[workers.pid],
        )
        options = {
            "processes": processes,
            "threads": threads,
            "worker_timeout_ms": worker_timeout_ms,
        }
        return {**result, **options, "redis": config}
    finally:
        if workers is not None:
            stop(workers)
        stop(server)
        stamps.close()


def _redis_args(port: int, data: Path) -> list[str]:
    return [
        "redis-server",
        "--bind", "127.0.0.1",
        "--port", str(port),
        "--dir", str(data),
        "--appendonly", "yes",
        "--appendfsync", "always",
        "--save", "",
        "--daemonize", "no",
    ]  # fmt: skip


def _worker_args(processes: int, threads: int) -> list[str]:
    return [
        sys.executable, "-m", "dramatiq", "dramatiq_tasks",
        "--processes", str(processes),
        "--threads", str(threads),
        "--worker-shutdown-timeout", "5000",
    ]  # fmt: skip


async def _ping(client: redis.Redis) -> bool:
    return bool(client.ping())


async def _warm_up(peer: DramatiqPeer) -> None:
    """The workers are up once they have run a few messages."""

    async def ran() -> bool:
        return await peer.remaining() == 0

    await peer.enqueue_batch(10)
    await wait_for("dramatiq workers", ran, 60.0)
    await drained(peer, 60.0)
