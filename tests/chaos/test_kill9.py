"""P1 at CI size: kill -9 of the node, the agent and guests under load, then the checkers.

About 35 s of faults plus start-up and drain: well under the 90 s budget of the suite. The seed
is fixed so the fault schedule (which role, when) is the same every run.
"""

from __future__ import annotations

import asyncio

import pytest

from conveyor.streams.chaos.checker import Thresholds
from conveyor.streams.chaos.runner import Config, run_kill9

pytestmark = pytest.mark.timeout(150)


def test_kill9_under_load_keeps_the_promise() -> None:
    thresholds = Thresholds(min_acks=500, min_node_kills=2, min_agent_kills=2)
    result = asyncio.run(run_kill9(Config(seconds=35, seed=7, drain_s=45, thresholds=thresholds)))
    kills = result["faults"]["kill9"]
    assert kills.get("node", 0) >= 2 and kills.get("agent", 0) >= 2, result
    assert result["valid"] is True, result
    assert result["executions_per_task"]["mean"] >= 1.0, result
    assert result["observed_reads"] > 0, result  # I3 saw tasks during the faults
