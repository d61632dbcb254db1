"""``conveyor bench ingest``: Avro records on a local broker routed by the ingest router to a
real node, every one enqueued (the bench fails otherwise), at a positive rate."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conveyor.streams.log.kafka_broker import KafkaCluster

pytestmark = pytest.mark.timeout(240)

RECORDS = 2_500  # three batches at least: the rate is measured after the first


def test_bench_ingest_enqueues_every_record(kafka_cluster: KafkaCluster) -> None:
    # kafka_cluster: the bench starts a broker of its own; without Java and the broker's jars
    # this skips (fails under CI=true) as every Kafka test does.
    cmd = [sys.executable, "-m", "conveyor.cli", "bench", "ingest", "--records", str(RECORDS)]
    out = subprocess.run([*cmd, "--json"], capture_output=True, text=True, timeout=200)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["records"] == report["enqueued"] == RECORDS, report
    assert report["quarantined"] == 0, report
    assert report["records_per_s"] > 0 and report["router_cpu_us_per_record"] > 0, report
