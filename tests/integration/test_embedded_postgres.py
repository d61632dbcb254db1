"""The embedded PostgreSQL (pgserver, in ``home/postgres``) across a kill -9 of the node.

pgserver starts the server as a daemon, so a node killed with -9 leaves it running; the next
node joins it, the projection resumes from its watermark (it projects only what is new), and
a clean stop of that node stops the server (the dead node's handle does not keep it alive).
If the server dies with the node, the next start recovers it from its WAL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from pathlib import Path

import asyncpg
import psutil
import pytest
from test_gateway import KEY_A, NodeProcess, call, gauge, stop_orphaned_postgres, write_keys

from conveyor.schemas.codec import EVENT_BATCH
from conveyor.streams.log.local import LocalLog

pytestmark = pytest.mark.timeout(240)

APP = {"agent_id": "setup", "app": "pg", "version": "1", "task_types": ["echo"]}


def postmaster_pid(home: Path) -> int | None:
    pid_file = home / "postgres" / "postmaster.pid"
    if not pid_file.exists():
        return None
    return int(pid_file.read_text().split()[0])


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (reaped by nobody yet) counts as gone.
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return True


def wait_gone(pid: int, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def enqueue(base: str, n: int) -> list[str]:
    tasks = [{"task_type": "echo", "app": "pg", "payload": {"i": i}} for i in range(n)]
    status, reply = call(base, "POST", "/v1/tasks:batch", {"tasks": tasks})
    assert status == 201, reply
    return [r["task_id"] for r in reply["results"]]


def listed(base: str, want: int, timeout_s: float = 30.0) -> None:
    """Until the snapshot holds ``want`` tasks (the usage endpoint counts exactly)."""
    deadline = time.monotonic() + timeout_s
    total = None
    while time.monotonic() < deadline:
        status, usage = call(base, "GET", "/v1/tenants/me/usage")
        assert status == 200, usage
        total = usage["total"]
        if total == want:
            return
        time.sleep(0.1)
    raise AssertionError(f"listed {total}, expected {want}")


def projected_events(base: str) -> float:
    return gauge(base, "conveyor_projection_events_total")


def dsn(home: Path) -> str:
    return f"postgresql://postgres:@/postgres?host={home / 'postgres'}"


def caught_up(base: str, home: Path, timeout_s: float = 30.0) -> dict[int, int]:
    """The projection's watermarks once they reach the end of the events log (the node's
    projection lag gauge is 0 and the watermarks stop moving)."""

    async def marks() -> dict[int, int]:
        conn = await asyncpg.connect(dsn(home))
        try:
            rows = await conn.fetch("SELECT partition, next_offset FROM watermarks")
        finally:
            await conn.close()
        return {int(r["partition"]): int(r["next_offset"]) for r in rows}

    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        now = asyncio.run(marks())
        if now == last and gauge(base, "conveyor_projection_lag_records") == 0:
            return now
        last = now
        time.sleep(0.3)
    raise AssertionError("the projection never caught up")


async def events_after(home: Path, marks: dict[int, int]) -> int:
    """Events in the (stopped) node's events log at or after ``marks``."""
    partitions = int(json.loads((home / "node.json").read_text())["partitions"])
    events = await LocalLog.open(home / "events", partitions)
    total = 0
    try:
        for p in range(partitions):
            async for records in events.read(p, marks.get(p, 0), follow=False):
                total += sum(len(EVENT_BATCH.decode(r.data).events) for r in records)
    finally:
        await events.close()
    return total


def start(home: Path) -> NodeProcess:
    node = NodeProcess(home)
    node.start()
    assert call(node.base, "POST", "/worker/register", APP, key=KEY_A)[0] == 200
    return node


def test_kill_9_of_the_node_leaves_a_postgres_the_next_node_joins_and_stops(
    tmp_path: Path,
) -> None:
    home = tmp_path / "home"
    write_keys(home)
    try:
        first = start(home)
        enqueue(first.base, 300)
        listed(first.base, 300)
        marks = caught_up(first.base, home)
        server = postmaster_pid(home)
        assert server is not None and alive(server)
        assert first.proc is not None
        (projector,) = psutil.Process(first.proc.pid).children()
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        assert alive(server), "pgserver runs PostgreSQL as a daemon: it outlives the node"
        assert wait_gone(projector.pid), "the projector process must end with its node"

        second = start(home)
        assert postmaster_pid(home) == server  # joined, not restarted
        listed(second.base, 300)
        enqueue(second.base, 40)
        listed(second.base, 340)
        caught_up(second.base, home)
        projected = projected_events(second.base)
        assert second.stop() == 0, second.logs()
        # Resumed from the watermark: this process projected exactly the events after it
        # (the 40 new tasks' and whatever the outboxes shipped again after the kill), none
        # of those before it.
        assert projected == asyncio.run(events_after(home, marks)) >= 40
        assert wait_gone(server), "the clean stop of the last node must stop PostgreSQL"
        assert postmaster_pid(home) is None
    finally:
        leftover = postmaster_pid(home)
        stop_orphaned_postgres(home)
        if leftover is not None:
            wait_gone(leftover)


def test_a_postgres_killed_with_the_node_recovers_on_the_next_start(tmp_path: Path) -> None:
    home = tmp_path / "home"
    write_keys(home)
    try:
        first = start(home)
        enqueue(first.base, 200)
        listed(first.base, 200)
        server = postmaster_pid(home)
        assert server is not None
        assert first.stop(signal.SIGKILL) == -signal.SIGKILL
        os.kill(server, signal.SIGKILL)  # the whole machine went down, say
        assert wait_gone(server)
        assert (home / "postgres" / "postmaster.pid").exists()  # stale

        second = start(home)
        assert postmaster_pid(home) not in (None, server)
        listed(second.base, 200)  # committed rows and watermarks survived (WAL)
        enqueue(second.base, 10)
        listed(second.base, 210)
        assert projected_events(second.base) >= 10
        restarted = postmaster_pid(home)
        assert second.stop() == 0, second.logs()
        assert restarted is not None and wait_gone(restarted)
    finally:
        leftover = postmaster_pid(home)
        stop_orphaned_postgres(home)
        if leftover is not None:
            wait_gone(leftover)
