"""A real one-broker Kafka for the Log contract, started once per session with
``conveyor.streams.log.kafka_broker`` (what ``tools/kafka.py start`` runs).

Without Java 17 or the broker's jars the Kafka cases skip with the reason, except under
``CI=true``, where that is a failure: CI must not go green untested (``.ci/run`` fetches them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from conveyor.streams.log.kafka_broker import KafkaCluster, KafkaUnavailable


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the Kafka contract tests need a broker under CI: {reason}")
    pytest.skip(reason)


@pytest.fixture(scope="session")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    try:
        cluster = KafkaCluster.start(1, tmp_path_factory.mktemp("kafka"))
    except KafkaUnavailable as exc:
        _unavailable(str(exc))
        raise  # not reached: _unavailable skips or fails
    try:
        yield cluster
    finally:
        cluster.stop()
