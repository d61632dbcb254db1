"""``conveyor bench e2e`` at a tiny size: real node and agent processes, every task done.

The figures themselves are not asserted (the machine is shared); the shape of the result is,
and so is the run's own check that every throughput task ended SUCCEEDED.
"""

from __future__ import annotations

import asyncio

import pytest

from conveyor.streams.bench.e2e import bench_e2e

pytestmark = pytest.mark.timeout(120)

FIGURES = (
    "tasks_per_s",
    "enqueue_p50_ms",
    "enqueue_p99_ms",
    "start_p50_ms",
    "start_p99_ms",
    "concurrent_per_s",
    "concurrent_p99_ms",
    "lease_p50_ms",
    "submit_to_start_p50_ms",
    "seconds",
    "projection_lag_s",
    "processor_lag_s",
)


def test_a_small_e2e_run_succeeds_every_task_and_reports_its_figures() -> None:
    # Few guests: spawning 32 Python processes would be most of this test's time.
    result = asyncio.run(bench_e2e(tasks=300, single=20, concurrent=64, idle=10, concurrency=4))

    assert result["tasks"] == 300 and result["partitions"] == 8
    assert result["all_succeeded"] is True, result["statuses"]
    assert result["statuses"] == {"SUCCEEDED": 300}
    assert result["drained"] is True
    for name in FIGURES:
        assert isinstance(result[name], int | float), (name, result[name])
    assert result["tasks_per_s"] > 0 and result["seconds"] > 0
    assert 0 < result["enqueue_p50_ms"] <= result["enqueue_p99_ms"]
    assert 0 <= result["start_p50_ms"] <= result["start_p99_ms"]
    assert result["node_rss_mb"] > 0 and result["agent_rss_mb"] > 0
