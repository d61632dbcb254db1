"""S1 at the node (``devtools/conveyor_devtools/chaos/powercut.py``): power cuts under
concurrent keyed enqueues, then a restart on what the disk kept, with the partition state kept
or rebuilt from the log. Every acknowledged enqueue must be there under its task id, nothing
nobody enqueued, and every retried key must meet its twin. Fixed seed; a few seconds."""

from __future__ import annotations

import asyncio
import json

import pytest

from conveyor_devtools.chaos.powercut import PowerCutConfig, run_power_cut

pytestmark = pytest.mark.timeout(120)


def test_power_cuts_under_load_lose_no_acknowledged_enqueue() -> None:
    result = asyncio.run(run_power_cut(PowerCutConfig(runs=12, seed=1)))
    print("\n" + json.dumps(result))
    assert result["lost"] == result["unexpected"] == result["twin_mismatch"] == 0, result
    assert result["valid"] is True, result
    assert result["acked"] > 500 and result["faults"]["under_load"] >= 6, result
