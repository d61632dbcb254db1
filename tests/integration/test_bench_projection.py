"""``conveyor bench projection``, ``conveyor bench query`` and ``conveyor bench bulk`` at a
tiny size against the embedded PostgreSQL: the shape of their results (the figures themselves
are not asserted: the machine is shared)."""

from __future__ import annotations

import asyncio

import pytest

from conveyor_devtools.bench.bulk import bench_bulk
from conveyor_devtools.bench.projection import bench_projection
from conveyor_devtools.bench.query import bench_query

pytestmark = pytest.mark.timeout(180)


def test_projection_bench_reports_throughput_and_the_lag_at_the_end() -> None:
    result = asyncio.run(bench_projection(tasks=800, partitions=4, lag_tasks=400, rate=4_000))
    assert result["events"] == result["projected"] == 4_000
    assert result["task_rows"] == 800
    assert result["events_per_s"] > 0
    assert 0 <= result["lag_s"] < 60 and result["lag_gauge_s"] >= 0
    assert result["paced_events_per_s"] > 0


def test_query_bench_reports_p99_per_filter() -> None:
    result = asyncio.run(bench_query(rows=5_000, repeats=3))
    assert result["rows"] == 5_000
    assert {"none", "status", "error_text", "finished_range", "count"} <= set(result["p99_ms"])
    assert result["p99_ms_max"] == max(result["p99_ms"].values())
    assert all(v > 0 for v in result["p50_ms"].values())


def test_bulk_bench_cancels_every_task_and_reports_api_latency() -> None:
    result = asyncio.run(bench_bulk(tasks=2_000, partitions=4))
    op = result["operation"]
    assert op["state"] == "done" and op["matched"] == op["done"] == op["changed"] >= 2_000
    for name in ("list", "get", "enqueue"):
        for when in ("during", "idle"):
            assert result[f"{name}_{when}_p50_ms"] > 0
