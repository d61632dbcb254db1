"""A real Kafka for the tests that need one (the Log contract, the cluster's integration
tests): one broker started once per session, or three for a test that kills one, with
``conveyor.streams.log.kafka_broker`` (what ``tools/kafka.py start`` runs).

Without Java 17 or the broker's jars the Kafka cases skip with the reason, except under
``CI=true``, where that is a failure: CI must not go green untested (``.ci/run`` fetches them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.streams.log.kafka_broker import KafkaCluster, KafkaUnavailable


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the Kafka tests need a broker under CI: {reason}")
    pytest.skip(reason)


def start_cluster(nodes: int, root: Path) -> KafkaCluster:
    try:
        return KafkaCluster.start(nodes, root)
    except KafkaUnavailable as exc:
        _unavailable(str(exc))
        raise  # not reached: _unavailable skips or fails


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    cluster = start_cluster(1, tmp_path_factory.mktemp("kafka"))
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kafka_three(tmp_path: Path) -> Iterator[KafkaCluster]:
    """Three nodes in one quorum (RF 3, min.insync.replicas 2), for a test that kills one."""
    cluster = start_cluster(3, tmp_path / "kafka")
    try:
        yield cluster
    finally:
        cluster.stop()
