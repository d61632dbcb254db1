"""P3 of tests/PLAN.md on the local log: SIGSTOP the node that leads every partition, then
try to make a new leader take over, then SIGCONT.

With the embedded log a second leader can not exist while the first process lives: the log
directory is flock'd by the process that has it open, and a stopped process keeps its locks.
So a standby started during the pause must refuse to start (no second epoch is minted, nothing
is written: no split brain), the paused leader resumes unharmed on SIGCONT, and the takeover
happens only once the old process is dead: the new node mints the next epoch on every
partition and serves every acknowledged task. (The straggler that DOES survive a takeover,
possible where the log is shared, is ``tests/unit/test_fencing.py``: its appends are refused
by the seal and its records ignored by the machine.)
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from pathlib import Path

import httpx
import pytest

from conveyor.aclient import AsyncClient
from conveyor_devtools.bench.e2e import _free_port
from conveyor_devtools.chaos.nemesis import ChaosCluster

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 2
APP, TASK = ChaosCluster.APP_NAME, "work"  # the app its agent key is bound to
STANDBY_EXIT_S = 30.0


def fences(home: Path) -> list[int]:
    out = []
    for p in range(PARTITIONS):
        meta = home / "log" / f"p{p:04d}" / "meta.json"
        out.append(json.loads(meta.read_text())["fence"] if meta.exists() else 0)
    return out


async def enqueue(cluster: ChaosCluster, n: int) -> list[str]:
    async with AsyncClient(cluster.url, cluster.key, app=APP, timeout=10.0) as client:
        return [(await client.enqueue(TASK, {"n": i})).id for i in range(n)]


async def statuses(cluster: ChaosCluster, ids: list[str]) -> dict[str, str]:
    async with AsyncClient(cluster.url, cluster.key, app=APP, timeout=10.0) as client:
        return {i: str((await client.get(i)).status) for i in ids}


async def register(cluster: ChaosCluster) -> None:
    body = {"agent_id": "setup", "app": APP, "version": "1", "task_types": [TASK]}
    auth = {"authorization": f"Bearer {cluster.agent_key}"}  # the worker protocol's key
    async with httpx.AsyncClient(base_url=cluster.url, headers=auth, timeout=10.0) as http:
        reply = await http.post("/worker/register", json=body)
        assert reply.status_code == 200, reply.text


def test_a_paused_leader_blocks_a_second_leader_and_resumes_unharmed(tmp_path: Path) -> None:
    async def body() -> None:
        cluster = ChaosCluster(
            root=tmp_path, partitions=PARTITIONS, agents=0, concurrency=1, prefetch=1
        )
        await cluster.start()
        try:
            await register(cluster)
            acked = await enqueue(cluster, 20)
            home, leader = cluster.node_home, cluster.procs["node"]
            before = fences(home)
            assert all(f >= 1 for f in before), before

            os.kill(leader.pid, signal.SIGSTOP)
            try:
                home_arg, port = str(home), str(_free_port())
                args = ["node", "--home", home_arg, "--port", port, "--partitions", "2"]
                cluster._spawn("standby", [*args, "--no-projection"])
                standby = cluster.procs["standby"]
                deadline = time.monotonic() + STANDBY_EXIT_S
                while standby.poll() is None and time.monotonic() < deadline:
                    await asyncio.sleep(0.1)
                assert standby.returncode not in (None, 0), "a second leader started"
                out = (tmp_path / "standby.out").read_text(errors="replace")
                assert "already open elsewhere" in out, out[-2000:]
                assert fences(home) == before, "the standby minted an epoch"
            finally:
                os.kill(leader.pid, signal.SIGCONT)

            more = await enqueue(cluster, 5)  # the leader resumes as if nothing happened
            assert set((await statuses(cluster, acked + more)).values()) == {"ENQUEUED"}
            assert fences(home) == before

            os.kill(leader.pid, signal.SIGKILL)  # now the takeover: the old leader is gone
            leader.wait(10)
            cluster.respawn("node")
            await cluster.wait_healthy()
            after = fences(home)
            assert all(a == b + 1 for a, b in zip(after, before, strict=True)), (before, after)
            assert set((await statuses(cluster, acked + more)).values()) == {"ENQUEUED"}
        finally:
            cluster.stop()

    asyncio.run(body())
