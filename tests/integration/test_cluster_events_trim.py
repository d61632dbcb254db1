"""The events topic of a cluster is trimmed, never below what a node's readers still need.

Two real ``conveyor node --kafka`` processes with their private PostgreSQL on a real broker,
``--events-keep 0s`` (no time floor: only the readers' positions hold the trim back) and
housekeeping every second. Each node's card says what its projector and webhook deliverer
still need; the events partitions are trimmed as both read on. Node 2 is killed: its last card
stays and holds the trim at what it had read while node 1 goes on alone; restarted, node 2's
snapshot lists every task, those enqueued while it was down included, and then the trim moves
on past it.
"""

from __future__ import annotations

import asyncio
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import test_gateway
from aiokafka import AIOKafkaConsumer, TopicPartition
from test_cluster import PARTITIONS, register_shop, settled, wait_for
from test_cluster_forwarding import shared
from test_cluster_projection import projected
from test_gateway import NodeProcess, call, stop_orphaned_postgres
from test_kafka_node import CLIENT, CLUSTER_SECRET, kafka_node

from conveyor.streams.cluster.directory import read_cards
from conveyor.streams.cluster.events_trim import NEEDED
from conveyor.streams.cluster.signing import ClusterSecret
from conveyor.streams.log.kafka_broker import KafkaCluster

pytestmark = pytest.mark.timeout(300)

TASKS = 8  # per round
SNAPSHOT_S = 90.0


def starts(bootstrap: str, cluster: str) -> list[int]:
    """The first offset kept of each partition of ``<cluster>-events``."""

    async def read() -> list[int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            tps = [TopicPartition(f"{cluster}-events", p) for p in range(PARTITIONS)]
            found = await consumer.beginning_offsets(tps)
            return [int(found[tp]) for tp in tps]
        finally:
            await consumer.stop()

    return asyncio.run(read())


def needs(bootstrap: str, cluster: str) -> dict[str, list[int]]:
    """Each node's ``events_needed`` as its signed card says."""
    key = ClusterSecret(CLUSTER_SECRET).card_key(cluster)
    cards, _ = asyncio.run(read_cards(bootstrap, cluster, key))
    return {
        node: [int(card[NEEDED][str(p)]) for p in range(PARTITIONS)] for node, card in cards.items()
    }


def enqueue(base: str, n: int) -> list[str]:
    """``n`` tasks delayed an hour: each one's events are written, none is run."""
    ids = []
    for i in range(n):
        body = {"task_type": "pack_item", "app": "shop", "payload": {"sku": f"S{i}"}}
        body["delay_ms"] = 3_600_000
        status, reply = call(base, "POST", "/v1/tasks", body, key=CLIENT)
        assert status == 201, reply
        ids.append(reply["task_id"])
    return ids


def lists_all(node: NodeProcess, ids: list[str]) -> bool:
    return set(ids) <= set(projected(node))


def test_the_events_topic_is_trimmed_behind_every_nodes_readers_and_a_dead_node_holds_it(
    kafka_cluster: KafkaCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(test_gateway, "START_TIMEOUT_S", 90.0)  # a private Postgres each
    bootstrap = kafka_cluster.bootstrap
    cluster = f"e{uuid.uuid4().hex[:8]}"
    made = [kafka_node(tmp_path, bootstrap, f"n{i}", cluster) for i in (1, 2)]
    for node in made:  # the projection on (private Postgres), housekeeping every second
        node.command = tuple(c for c in node.command if c != "--no-projection")
        node.command = (*node.command, "--session-timeout-s", "6", "--events-keep", "0s")
        snaps = str(tmp_path / "snapshots")
        node.command = (*node.command, "--snapshots", snaps, "--snapshot-interval", "1s")
    n1, n2 = made
    try:
        for node in made:
            node.start()
        wait_for("two nodes to share the partitions", lambda: shared(made), timeout_s=90)
        register_shop(n1.base)
        first = enqueue(n1.base, TASKS) + enqueue(n2.base, TASKS)
        for node in made:
            wait_for(f"{node.home.name} to list", lambda n=node: lists_all(n, first), SNAPSHOT_S)

        def trimmed_to_readers() -> bool:
            starts_after = starts(bootstrap, cluster)
            wanted = needs(bootstrap, cluster)
            lowest = [min(w[p] for w in wanted.values()) for p in range(PARTITIONS)]
            return len(wanted) == 2 and starts_after == lowest and any(starts_after)

        wait_for("the events topic to be trimmed up to the readers", trimmed_to_readers, 60)

        # Node 2 dies; its card stays and says what it had read. Node 1 goes on alone.
        assert n2.stop(signal.SIGKILL) == -signal.SIGKILL
        held = needs(bootstrap, cluster)["n2"]
        wait_for("n1 to lead every partition", lambda: settled([n1]), timeout_s=60)
        second = enqueue(n1.base, TASKS)
        wait_for("n1 to list them", lambda: lists_all(n1, first + second), SNAPSHOT_S)
        wait_for("n1's readers to move on", lambda: needs(bootstrap, cluster)["n1"] != held)
        deadline = time.monotonic() + 5  # several trim rounds: none may pass n2's position
        while time.monotonic() < deadline:
            now: Any = starts(bootstrap, cluster)
            assert all(s <= h for s, h in zip(now, held, strict=True)), (now, held)
            time.sleep(0.5)  # rounds of the nodes' trimmers: nothing to wait on but time
        ends = now

        # Node 2 comes back on its own home: its snapshot resumes where it stopped.
        n2.start()
        wait_for("n2 to list every task", lambda: lists_all(n2, first + second), SNAPSHOT_S)
        assert "was trimmed below" not in n2.logs()  # it never had to skip a thing
        wait_for(
            "the trim to move past where n2 had stopped",
            lambda: any(s > e for s, e in zip(starts(bootstrap, cluster), ends, strict=True)),
            60,
        )
    finally:
        for node in made:
            if node.proc is not None and node.proc.poll() is None:
                node.stop()
        stop_orphaned_postgres(n2.home)  # killed, its Postgres outlived it and the restart
