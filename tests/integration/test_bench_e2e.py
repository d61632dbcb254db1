"""``conveyor bench e2e`` at a tiny size: real node and agent processes, every task done.

The figures themselves are not asserted (the machine is shared); the shape of the result is,
and so is the run's own check that every throughput task ended SUCCEEDED.
"""

from __future__ import annotations

import asyncio

import pytest

from conveyor_devtools.bench.e2e import bench_e2e

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


@pytest.mark.timeout(180)  # a JVM, a node and an agent start on a shared box
def test_a_small_e2e_run_on_kafka_counts_the_broker_and_every_process_per_task() -> None:
    """``--kafka --nodes 1``: its own broker, a node on it and an agent; the same figures, and
    CPU per task of each process, the broker's included."""
    from conveyor.streams.log.kafka_broker import KafkaUnavailable, is_fetched, java

    try:
        java()
        if not is_fetched():
            raise KafkaUnavailable("the Kafka jars are missing: python3 tools/kafka.py fetch")
    except KafkaUnavailable as exc:
        pytest.skip(str(exc))
    result = asyncio.run(
        bench_e2e(
            tasks=200, single=10, concurrent=32, idle=5, concurrency=2, partitions=4, kafka_nodes=1
        )
    )

    assert result["log"] == "kafka, 1 node(s)"
    assert result["statuses"] == {"SUCCEEDED": 200} and result["drained"] is True
    assert result["tasks_per_s"] > 0
    assert result["broker_cpu_s"] > 0 and result["node_cpu_s"] > 0 and result["agent_cpu_s"] > 0
    per_process = result["cpu_ms_per_task_by_process"]
    assert set(per_process) == {"node-0", "agent-0-0", "broker-0"}, per_process
    assert all(ms > 0 for ms in per_process.values()), per_process
    assert result["node_cpu_ms_per_task"] == pytest.approx(
        1000 * result["node_cpu_s"] / 200, abs=0.01
    )
