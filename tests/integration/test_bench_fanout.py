"""``conveyor bench fanout``: the command runs, the fan-in fires exactly once, results in order."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

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
