"""What the peer benches share: the measurement protocol, the stamp channel, process helpers.

Every system is measured with the same three phases as ``conveyor bench e2e``
(devtools/conveyor_devtools/bench/e2e.py), in the same order:

1. single enqueue: ``single`` sequential enqueues of a no-op task, send -> acknowledged; then
   ``concurrent`` more from ``SINGLE_CALLERS`` callers at once, one task per enqueue.
2. idle schedule-to-start: ``idle`` ``stamp`` tasks one at a time with a pause; the handler
   sends the wall clock at its start to this process over UDP (same machine, same clock);
   start = that - the ack time, 0 when the handler won the race against the ack.
3. throughput: ``tasks`` no-op tasks in batches of 1,000 from ``CALLERS`` concurrent callers;
   from the first enqueue until the system reports nothing left to run (polled every
   ``POLL_S``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import psutil

BATCH = 1_000
CALLERS = 4
SINGLE_CALLERS = 16
IDLE_PAUSE_S = 0.02
POLL_S = 0.02
STAMP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class Peer(Protocol):
    """One system under test, as the phases see it."""

    async def enqueue_noop(self) -> None: ...

    async def enqueue_stamp(self, key: str) -> None: ...

    async def enqueue_batch(self, n: int) -> None: ...

    async def enqueue_noops_at_once(self, n: int, callers: int) -> list[float]:
        """``n`` single no-op enqueues from ``callers`` callers at once; their latencies (ms)."""
        ...

    async def remaining(self) -> int:
        """Tasks enqueued and not yet finished (queued or running)."""
        ...


# -- the stamp channel ------------------------------------------------------------------------


def send_stamp(port: int, key: str) -> None:
    """Called by a worker's ``stamp`` handler first thing: "<key> <wall clock>" over UDP."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.sendto(f"{key} {time.time()!r}".encode(), ("127.0.0.1", port))


class Stamps:
    """The bench's end of the stamp channel."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.sock.bind(("127.0.0.1", 0))
        self.port = int(self.sock.getsockname()[1])
        self.seen: dict[str, float] = {}

    def wait(self, key: str, timeout_s: float = STAMP_TIMEOUT_S) -> float:
        deadline = time.monotonic() + timeout_s
        while key not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no start stamp for {key} within {timeout_s}s")
            self.sock.settimeout(left)
            with contextlib.suppress(TimeoutError):
                got, stamp = self.sock.recv(256).decode().split()
                self.seen[got] = float(stamp)
        return self.seen.pop(key)

    def close(self) -> None:
        self.sock.close()


# -- the phases -------------------------------------------------------------------------------


async def run_phases(
    peer: Peer,
    stamps: Stamps,
    *,
    tasks: int,
    single: int,
    concurrent: int,
    idle: int,
    server: Sequence[int],
    workers: Sequence[int],
) -> dict:
    """The three phases; ``server`` and ``workers`` are pids whose CPU the run reports."""
    out: dict[str, Any] = {"tasks": tasks}
    out.update(await single_enqueues(peer, single))
    out.update(await concurrent_enqueues(peer, concurrent))
    out.update(await idle_starts(peer, stamps, idle))
    usage = Usage(server, workers)
    out.update(await throughput(peer, tasks))
    out.update(usage.since(tasks))
    return out


async def single_enqueues(peer: Peer, n: int) -> dict:
    latencies = []
    for _ in range(n):
        sent = time.perf_counter()
        await peer.enqueue_noop()
        latencies.append((time.perf_counter() - sent) * 1000)
    await drained(peer, 60.0)
    return {"single": n, **percentiles("enqueue", latencies)}


async def concurrent_enqueues(peer: Peer, n: int) -> dict:
    start = time.perf_counter()
    latencies = await peer.enqueue_noops_at_once(n, SINGLE_CALLERS)
    seconds = time.perf_counter() - start
    await drained(peer, 60.0)
    return {
        "concurrent": n,
        "concurrent_per_s": round(n / seconds),
        **percentiles("concurrent", latencies),
    }


async def idle_starts(peer: Peer, stamps: Stamps, n: int) -> dict:
    starts, submits = [], []
    for _ in range(n):
        key = uuid.uuid4().hex
        sent = time.time()
        await peer.enqueue_stamp(key)
        acked = time.time()
        started = await asyncio.to_thread(stamps.wait, key)
        starts.append(max(0.0, (started - acked) * 1000))
        submits.append((started - sent) * 1000)
        await asyncio.sleep(IDLE_PAUSE_S)
    await drained(peer, 60.0)
    return {
        "idle": n,
        **percentiles("start", starts),
        **percentiles("submit_to_start", submits),
    }


async def throughput(peer: Peer, tasks: int, timeout_s: float = 300.0) -> dict:
    async def caller(k: int) -> None:
        for lo in range(k * BATCH, tasks, CALLERS * BATCH):
            await peer.enqueue_batch(min(BATCH, tasks - lo))

    start = time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(CALLERS)))
    enqueue_s = time.perf_counter() - start
    done = await drained(peer, timeout_s)
    seconds = time.perf_counter() - start
    return {
        "seconds": round(seconds, 3),
        "tasks_per_s": round(tasks / seconds),
        "enqueue_s": round(enqueue_s, 3),
        "enqueue_per_s": round(tasks / enqueue_s),
        "all_done": done,
    }


async def drained(peer: Peer, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while await peer.remaining() > 0:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(POLL_S)
    return True


def percentiles(name: str, values: Sequence[float]) -> dict[str, float | None]:
    ordered = sorted(values)

    def pct(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {f"{name}_p50_ms": pct(0.50), f"{name}_p99_ms": pct(0.99)}


# -- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            args,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env={**os.environ, **(env or {})},
            cwd=Path(__file__).parent,
        )


def stop(proc: subprocess.Popen) -> None:
    """TERM, then KILL after a grace: by pid, never by name."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
    try:
        proc.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait()


async def wait_for(what: str, ready: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        with contextlib.suppress(Exception):
            if await ready():
                return
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} not ready after {timeout_s}s")
        await asyncio.sleep(0.05)


def cpu_s(pids: Sequence[int]) -> float:
    """CPU seconds of these processes and all their children (a server's backends)."""
    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    t = p.cpu_times()
                    total += t.user + t.system
    return total


def rss_mb(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):
                    total += p.memory_info().rss
    return round(total / 2**20, 1)


class Usage:
    """CPU seconds of the server, the workers and this client over the throughput phase."""

    def __init__(self, server: Sequence[int], workers: Sequence[int]) -> None:
        self.server, self.workers = list(server), list(workers)
        self.before = self._now()

    def _now(self) -> dict[str, float]:
        return {
            "server_cpu_s": cpu_s(self.server),
            "workers_cpu_s": cpu_s(self.workers),
            "client_cpu_s": cpu_s([os.getpid()]),
        }

    def since(self, tasks: int) -> dict[str, float]:
        now = self._now()
        out = {k: round(now[k] - self.before[k], 2) for k in now}
        out["cpu_ms_per_task"] = round(sum(out.values()) * 1000 / tasks, 3)
        out["server_rss_mb"] = rss_mb(self.server)
        out["workers_rss_mb"] = rss_mb(self.workers)
        return out
