"""The task events relay's position holds the events topic's trim, on a real broker.

A ``conveyor node --kafka --task-events`` with ``--events-keep 0s`` (no time floor) and
housekeeping every second relays a first round of tasks; it is then restarted without
``--task-events``, so the relay stops where it committed while the node's own readers go on
through a second round. The trim follows the readers up to the relay group's committed
offsets and never past them; restarted with ``--task-events``, the relay resumes there and
every task of the second round reaches ``<cluster>-task-events.default``.

``conveyor dev --kafka --task-events`` relays too: a task run by its agent reaches the topic
of the dev's cluster on the local broker it started.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import test_gateway
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.structs import TopicPartition
from test_cluster import PARTITIONS, register_shop, settled, wait_for
from test_cluster_events_trim import enqueue, needs, starts
from test_gateway import NodeProcess, call
from test_kafka_node import CLIENT, REPO, kafka_node
from test_task_events_topic import read_events

from conveyor.streams.log.kafka_broker import KafkaCluster
from conveyor.streams.sinks.task_events import group_of, topic_of

pytestmark = pytest.mark.timeout(300)

TASKS = 6  # per round


def relay_needs(bootstrap: str, cluster: str) -> list[int]:
    """Where the relay reads each partition of ``<cluster>-events`` from: its group's
    committed offset, or 0 where it committed none."""

    async def read() -> list[int]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
        await admin.start()
        try:
            tps = [TopicPartition(f"{cluster}-events", p) for p in range(PARTITIONS)]
            found = await admin.list_consumer_group_offsets(group_of(cluster), partitions=tps)
            return [max(0, int(found[tp].offset)) if tp in found else 0 for tp in tps]
        finally:
            await admin.close()

    return asyncio.run(read())


def relayed(bootstrap: str, cluster: str, base: str, ids: list[str]) -> list[dict[str, Any]]:
    """The events on the default tenant's topic, read until each of ``ids`` was enqueued."""
    return read_events(
        bootstrap,
        topic_of(cluster, "default"),
        base,
        CLIENT,
        lambda seen: set(ids) <= {e["task_id"] for e in seen if e["kind"] == "TaskEnqueued"},
    )


def test_a_stopped_relay_holds_the_trim_at_its_offsets_and_resumes_with_nothing_lost(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    bootstrap = kafka_cluster.bootstrap
    cluster = f"r{uuid.uuid4().hex[:8]}"
    node = kafka_node(tmp_path, bootstrap, "n1", cluster)
    plain = (*node.command, "--events-keep", "0s", "--session-timeout-s", "6")
    plain = (*plain, "--snapshots", str(tmp_path / "snapshots"), "--snapshot-interval", "1s")
    relaying = (*plain, "--task-events")
    node.command = relaying
    try:
        node.start()
        wait_for("the node to lead every partition", lambda: settled([node]))
        register_shop(node.base)
        first = enqueue(node.base, TASKS)
        relayed(bootstrap, cluster, node.base, first)

        def trimmed_to_readers_and_relay() -> bool:
            wanted = needs(bootstrap, cluster)["n1"]
            held = relay_needs(bootstrap, cluster)
            lowest = [min(w, c) for w, c in zip(wanted, held, strict=True)]
            return starts(bootstrap, cluster) == lowest and any(lowest)

        wait_for("the trim to reach the readers and the relay", trimmed_to_readers_and_relay)

        # The relay stops (the node restarts without it); its offsets stay in the broker.
        assert node.stop() == 0, node.logs()
        held = relay_needs(bootstrap, cluster)
        node.command = plain
        node.start()
        wait_for("the node to lead every partition", lambda: settled([node]))
        second = enqueue(node.base, TASKS)

        def held_by_the_relay() -> bool:
            wanted = needs(bootstrap, cluster)["n1"]
            lowest = [min(w, h) for w, h in zip(wanted, held, strict=True)]
            passed = any(w > h for w, h in zip(wanted, held, strict=True))
            return passed and starts(bootstrap, cluster) == lowest

        wait_for("the trim to reach the readers and stop at the relay", held_by_the_relay)
        deadline = time.monotonic() + 5  # several trim rounds: none may pass the relay
        while time.monotonic() < deadline:
            now = starts(bootstrap, cluster)
            assert all(s <= h for s, h in zip(now, held, strict=True)), (now, held)
            time.sleep(0.5)  # rounds of the node's trimmer: nothing to wait on but time
        assert relay_needs(bootstrap, cluster) == held

        # The relay is back: it resumes at its offsets, and the second round is relayed.
        assert node.stop() == 0, node.logs()
        node.command = relaying
        node.start()
        # Read until both rounds are seen: the topic's partitions are read interleaved, so a
        # stop at the second round alone may come before a partition's first-round events.
        events = relayed(bootstrap, cluster, node.base, first + second)
        assert {e["task_id"] for e in events} >= set(first + second)
        wait_for(
            "the trim to move past where the relay had stopped",
            lambda: any(s > h for s, h in zip(starts(bootstrap, cluster), held, strict=True)),
        )
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.stop()


def test_dev_on_kafka_relays_task_events(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_gateway, "START_TIMEOUT_S", 120.0)  # it starts its own broker
    home = tmp_path / "home"
    home.mkdir()
    command = ("dev", "--app", "examples.shop:app", "--no-projection", "--sandbox", "none")
    dev = NodeProcess(home, (*command, "--kafka", "--task-events"))
    dev.start(cwd=REPO)
    try:
        found = re.search(r"kafka\s+(\S+:\d+)", dev.logs())
        assert found, dev.logs()
        bootstrap = found.group(1)
        key = dev_client_key(home)
        body = {"task_type": "pack_item", "app": "shop", "payload": {"sku": "K1"}}
        replies: list[dict[str, Any]] = []

        def accepted() -> bool:
            status, reply = call(dev.base, "POST", "/v1/tasks", body, key=key)
            # 400 unknown_task_type: the dev agent has not registered yet; 503: the node is
            # still taking its partitions.
            assert status in (201, 400, 503), reply
            replies.append(reply)
            return status == 201

        wait_for("the dev agent's task types", accepted)
        task_id = replies[-1]["task_id"]
        events = read_events(
            bootstrap,
            topic_of("conveyor", "default"),
            dev.base,
            key,
            lambda seen: any(
                e["task_id"] == task_id and e["kind"] == "TaskSucceeded" for e in seen
            ),
        )
        kinds = [e["kind"] for e in events if e["task_id"] == task_id]
        assert kinds[0] == "TaskEnqueued" and kinds[-1] == "TaskSucceeded", kinds
    finally:
        if dev.proc is not None and dev.proc.poll() is None:
            assert dev.stop(signal.SIGINT) == 0, dev.logs()


def dev_client_key(home: Path) -> str:
    """The client key ``conveyor dev`` made in its home (tenant ``default``)."""
    keys: dict[str, dict[str, str]] = json.loads((home / "keys.json").read_text())["keys"]
    return next(k for k, e in keys.items() if e.get("role") != "agent")
