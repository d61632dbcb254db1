"""``conveyor bench fanout``: the command runs, the fan-in fires exactly once, results in order;
a run that cannot finish fails by its deadline, with the state it is stuck in."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import pytest

from conveyor_devtools.bench.fanout import FanoutStuck, bench_fanout

pytestmark = pytest.mark.timeout(180)


def test_bench_fanout_reports_one_fan_in_with_every_child() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "bench", "fanout", "--children", "500", "--json"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["children"] == 500 and report["seconds"] > 0
    assert report["fan_in_fired_once"] and report["results_in_order"]
    assert report["workflow"] == "SUCCEEDED"
    assert report["children_statuses"] == {"SUCCEEDED": 500}
    assert report["children_per_s"] > 0 and report["rss_mb"] > 0


def test_bench_fanout_spills_past_1000_children_over_the_other_partitions() -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "conveyor.cli",
            "bench",
            "fanout",
            "--children",
            "1600",
            "--partitions",
            "4",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["children_by_partition"] == [1_000, 200, 200, 200]
    assert report["fan_in_fired_once"] and report["results_in_order"]
    assert report["children_statuses"] == {"SUCCEEDED": 1600}


def test_a_run_past_its_deadline_fails_with_the_state_it_is_stuck_in() -> None:
    """No agent polls: the workflow is never leased. The run must not wait forever; it fails
    at its deadline and says where it stands (the CI hang this deadline was added for showed
    nothing for 150 s)."""
    with pytest.raises(FanoutStuck) as stuck:
        asyncio.run(bench_fanout(children=10, partitions=2, agents=0, deadline_s=0.5))
    state = stuck.value.state
    assert "no result after 0.5 s" in str(stuck.value)
    assert state["workflow"] == {"status": "ENQUEUED", "attempt": 1, "leased_by_bench": 0}
    assert state["barrier"] is None and state["children"] == [{"MISSING": 10}, {}]
    home = state["partitions"][0]  # the workflow's partition
    assert home["ready_committed"] == 1 and home["halted"] is None and home["leader"]
    assert home["applied"] == home["log_end"] - 1, "every record applied"
    assert state["coroutines"]["Dispatcher.run"] == 2, "one dispatcher per partition"
