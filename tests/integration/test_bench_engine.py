"""``conveyor bench engine``: the run ends with every task SUCCEEDED and reports its figures,
the one-at-a-time cost on a fresh and a drained node among them; ``--backlog`` dispatches
nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(180)


def bench(*args: str) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", "bench", "engine", *args, "--json"],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return report


def test_bench_engine_runs_every_task_to_succeeded() -> None:
    report = bench("--tasks", "5000", "--partitions", "2", "--single", "20")
    assert report["tasks"] == 5000 and report["partitions"] == 2
    assert report["all_succeeded"] is True
    assert report["statuses"] == {"SUCCEEDED": 5000}  # the one-at-a-time tasks are apart
    assert report["tasks_per_s"] > 0 and report["seconds"] > 0 and report["rss_mb"] > 0
    assert report["single_cpu_us_fresh"] > 0 and report["single_cpu_us_drained"] > 0


def test_bench_engine_backlog_enqueues_and_dispatches_nothing() -> None:
    report = bench("--backlog", "3000", "--partitions", "2")
    assert report["all_enqueued"] is True
    assert report["statuses"] == {"ENQUEUED": 3000}
    assert "single_cpu_us_fresh" not in report
