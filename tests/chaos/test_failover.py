"""F1 of tests/PLAN.md, short: ``conveyor chaos failover`` as a user runs it, three real
brokers, three real nodes of one cluster and their agents, under load. Each fault strikes once
(kill -9 of a node, kill -9 of a broker, SIGSTOP of a node past its session timeout); the run
itself reads back the history, the log and the stopped nodes' state, and this test holds it
to its promise: nothing acknowledged lost, one terminal state per task, no record of a stale
epoch in the log, the zombie stepping down, and the partitions of a killed node dispatched
again by the survivors within 10 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conveyor.streams.log.kafka_broker import KafkaUnavailable, is_fetched, java

WALL_S = 600  # three JVMs and ten Python processes: 260-510 s measured on the shared 2-core box
pytestmark = pytest.mark.timeout(WALL_S + 30)


def _need_kafka() -> None:
    try:
        java()
        if not is_fetched():
            raise KafkaUnavailable("the Kafka jars are missing: python3 tools/kafka.py fetch")
    except KafkaUnavailable as exc:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"the failover run needs Kafka under CI: {exc}")
        pytest.skip(str(exc))


def test_a_short_failover_run_loses_nothing_and_moves_partitions_within_10_s(
    tmp_path: Path,
) -> None:
    _need_kafka()
    cmd = [sys.executable, "-m", "conveyor.cli", "chaos", "failover", "--json"]
    cmd += ["--duration", "40s", "--seed", "7", "--keep", str(tmp_path / "run")]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=WALL_S)
    assert done.stdout.strip(), done.stderr[-4000:]
    result = json.loads(done.stdout)
    shown = {k: v for k, v in result.items() if k != "examples"}

    assert result["lost"] == 0 and result["double_terminal"] == 0, shown
    assert result["unexpected"] == 0 and result["duplicated"] == 0, shown
    assert result["stale_records"] == 0, result["stale_examples"]
    assert result["node_kills"] >= 1 and result["broker_kills"] >= 1, shown
    assert result["stops"] >= 1 and all(
        z["stepped_down_s"] is not None for z in result["zombies"]
    ), result["zombies"]
    assert result["acked"] >= 50, shown  # the load ran, across the faults
    assert result["failover_s"], shown  # the kill moved partitions, and they were measured
    assert result["failover_p99_s"] < 10, result["failover_s"]
    assert result["valid"] is True, shown
    assert done.returncode == 0, done.stderr[-4000:]
