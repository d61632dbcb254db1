"""P2 and N1 at CI size: SIGSTOP an agent and its guests, then SIGCONT.

P2, for 3x its lease: the other agent re-leases and finishes the zombie's tasks; every late
heartbeat and completion of the zombie must be refused, and the state must keep the second
lease's outcome. N1, for half its lease: nothing may be re-leased, the stalled agent finishes
what it held. Fixed seeds; about 15 s each.
"""

from __future__ import annotations

import asyncio

import pytest

from conveyor_devtools.chaos.zombie import ZombieConfig, run_zombie

pytestmark = pytest.mark.timeout(90)


def test_a_paused_lease_holder_cannot_change_anything_after_sigcont() -> None:
    result = asyncio.run(run_zombie(ZombieConfig(tasks=60, seed=3)))
    stale = result["stale_ops"]
    assert result["valid"] is True, result
    assert stale["held"] > 0 and stale["attempted"] == stale["rejected"] > 0, result
    assert stale["accepted"] == 0 and stale["unreported"] == 0, result
    assert result["acked"] == 61 and result["stuck"] == 0, result  # 60 + the warm-up
    assert result["executions_per_task"]["max"] >= 2, result  # some task really ran twice


def test_a_stall_shorter_than_the_lease_hands_nothing_to_another_agent() -> None:
    result = asyncio.run(run_zombie(ZombieConfig(tasks=60, seed=3, pause_leases=0.5)))
    assert result["test"] == "N1-stall-shorter-than-the-lease", result
    assert result["valid"] is True and result["held"] > 0, result
    assert result["spurious_releases"] == 0, result
    assert result["executions_per_task"]["max"] == 1, result  # nothing ran twice
