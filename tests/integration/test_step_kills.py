"""kill -9 of the guest at random points of a 1,000-step task, again and again.

The node is real (log and RocksDB on disk, behind the real gateway), the agent is in process
(over the worker protocol), the handler runs in real guest processes, and the test kills
whichever guest is running the steps, many times. The handler leaves a trail: ``start i pid``
from inside step ``i``'s body, ``committed i`` after ``ctx.step.run`` returned (the commit is
durable before it returns).

The promise checked: no step body ever starts again once its step was committed, whatever
the kills; the task completes with every step's value; a step cut off by a kill before its
commit runs again (that is allowed: only committed steps are memoized).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
from pathlib import Path
from typing import Any

import agent_app
import pytest
from test_agent import TENANT, rig

from conveyor.agents.breaker import BreakerPolicy
from conveyor.streams.node import Node

pytestmark = pytest.mark.timeout(240)

STEPS = 1_000
KILLS = 12


def trail(path: Path) -> list[list[str]]:
    return [line.split() for line in path.read_text().splitlines()] if path.exists() else []


def test_kill9_of_the_guest_never_reruns_a_committed_step(
    tmp_path: Path, record_property: Any
) -> None:
    marker = tmp_path / "trail"
    rng = random.Random(int(os.environ.get("CONVEYOR_KILL_SEED", "7")))

    async def main() -> int:
        async with rig(
            tmp_path,
            durable=True,
            heartbeat_s=0.2,
            poll_wait_s=0.5,
            concurrency=1,
            breaker=BreakerPolicy(crashes_max=10_000),  # these crashes are the test's
        ) as r:
            task_id = await r.enqueue(agent_app.many_steps, {"steps": STEPS, "marker": str(marker)})
            kills = await kill_guests(marker, rng, lambda: finished(r.node, task_id))
            task = await r.node.wait_finished(TENANT, task_id, 120_000)
            assert task.status == "SUCCEEDED", (task.status, task.error_class, task.error_message)
            assert task.result == str(sum(range(STEPS))).encode()
            return kills

    kills = asyncio.run(main())
    committed: set[int] = set()
    starts: dict[int, int] = {}
    for fields in trail(marker):
        step = int(fields[1])
        if fields[0] == "committed":
            committed.add(step)
        else:
            assert step not in committed, f"step {step} ran again after its commit"
            starts[step] = starts.get(step, 0) + 1
    assert committed == set(range(STEPS))
    rerun = sum(n - 1 for n in starts.values())
    record_property("kills", kills)
    record_property("steps_rerun_after_a_kill", rerun)
    print(f"\n{STEPS} steps, {kills} kill -9s of the guest, {rerun} uncommitted step(s) rerun")
    assert kills >= KILLS // 2, f"only {kills} kills landed: the test proved little"
    assert rerun <= kills  # at most the one step each kill cut off


def finished(node: Node, task_id: str) -> bool:
    return node.get(TENANT, task_id).finished_ms is not None


async def kill_guests(marker: Path, rng: random.Random, done: Any) -> int:
    """Kill the guest running the steps at random moments, each time a new guest has taken
    over (its pid appears in the trail), until ``KILLS`` kills or the task is done."""
    kills = 0
    killed: set[int] = set()
    while kills < KILLS and not done():
        await asyncio.sleep(rng.uniform(0.02, 0.4))
        starts = [f for f in trail(marker)[-50:] if f[0] == "start"]
        if not starts or int(starts[-1][2]) in killed:
            continue  # the next guest has not reached a new step yet
        pid = int(starts[-1][2])
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            continue
        killed.add(pid)
        kills += 1
    return kills
