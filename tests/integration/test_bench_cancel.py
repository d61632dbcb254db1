"""``conveyor bench cancel``: on ``conveyor dev`` (real node, agent, guests; the agent's
heartbeat every 10 s), canceled running handlers see ``ctx.cancelled`` within a second, and
each canceled task keeps what its handler returned (the bench fails otherwise)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(180)

COUNT = 8


def test_bench_cancel_reaches_running_handlers_within_a_second() -> None:
    cmd = [sys.executable, "-m", "conveyor.cli", "bench", "cancel", "--count", str(COUNT)]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["count"] + report["not_running"] == COUNT
    assert report["count"] >= COUNT // 2, report  # most were canceled while running
    # Against the agent's heartbeat interval (10 s): a cancel that waited for a heartbeat would
    # take seconds, not under one.
    assert report["heartbeat_s"] >= 5.0, report
    assert 0 < report["p50_ms"] <= report["p99_ms"] < 1_000, report
    print(report)
