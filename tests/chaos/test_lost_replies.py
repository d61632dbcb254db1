"""The lost-replies run of tests/PLAN.md at CI size: replies lost after the node answered.

A proxy loses 20% of the enqueue replies, another 20% of the agent's completion replies; the
SDK and the agent resend. Fixed seed; a few seconds.
"""

from __future__ import annotations

import asyncio

import pytest

from conveyor_devtools.chaos.lost import LostConfig, run_lost_replies

pytestmark = pytest.mark.timeout(90)


def test_lost_replies_make_no_duplicates_and_no_second_terminal_state() -> None:
    result = asyncio.run(run_lost_replies(LostConfig(tasks=150, seed=5)))
    lost = result["lost_replies"]
    assert result["valid"] is True, result
    assert result["duplicated"] == 0 and result["double_terminal"] == 0, result
    assert result["acked"] == 151 and result["stuck"] == 0, result  # 150 + the warm-up
    assert lost["enqueue_dropped"] > 0 and lost["complete_dropped"] > 0, result
    assert lost["created_false"] > 0, result  # some retries found the committed task
    assert lost["double_success"] == 0 and lost["wrong_result"] == 0, result
