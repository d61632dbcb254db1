"""``conveyor bench fairness``: the command runs both scenarios and reports B's figures; task
durations spread as asked, the same every run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conveyor_devtools.bench.fairness import _Work

pytestmark = pytest.mark.timeout(180)


def test_bench_fairness_starts_every_b_task_under_a_backlog() -> None:
    args = ["bench", "fairness", "--backlog", "3000", "--b-tasks", "40", "--slots", "4"]
    args += ["--partitions", "2", "--task-jitter", "0.5", "--json"]
    out = subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args],
        capture_output=True,
        text=True,
        timeout=150,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["backlog"] == 3000 and report["b_tasks"] == 40 and report["task_jitter"] == 0.5
    # Every B task started (a missing one counts as infinite) while A's backlog was drained.
    for key in ("b_p50_ms", "b_p99_ms", "b_idle_p50_ms", "b_idle_p99_ms"):
        assert 0 < report[key] < 1_000, report
    assert report["a_done_during_b"] > 0, report
    assert report["bar_ok"] == (report["b_p99_ms"] <= 2 * report["b_idle_p99_ms"] + 5)


def test_task_durations_spread_within_the_jitter_and_repeat_from_the_seed() -> None:
    work = _Work(10.0, 0.5)
    draws = [work.seconds() for _ in range(200)]
    assert all(0.005 <= d <= 0.015 for d in draws)
    assert max(draws) - min(draws) > 0.008  # spread, not constant
    work.rng.seed(0)
    assert [work.seconds() for _ in range(200)] == draws
    assert {_Work(10.0, 0.0).seconds() for _ in range(5)} == {0.01}


def test_a_jitter_of_one_or_more_is_refused() -> None:
    with pytest.raises(ValueError, match="task_jitter must be in"):
        _Work(10.0, 1.0)
