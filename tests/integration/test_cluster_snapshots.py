"""Partition snapshots with real ``conveyor node --kafka --snapshots`` processes on a real
broker: the owner snapshots every second and trims the log topic below the oldest kept (but
for the partition that holds the tenant's catalog), so a fresh node (empty home) that takes
the partitions cannot replay their whole history. It restores the snapshots, replays only the
tail, serves every task's finished state, and runs new ones."""

from __future__ import annotations

import asyncio
import re
import shutil
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition
from moto.server import ThreadedMotoServer
from test_cluster import register_shop
from test_gateway import METRICS_KEY, NodeProcess, call, free_port
from test_kafka_node import CLIENT, kafka_node, start_agent, stop, wait_registered

from conveyor.store import keys
from conveyor.store.rocksdb import RocksKV
from conveyor.store.tables import Tables
from conveyor.streams.log.kafka_broker import KafkaCluster
from conveyor.streams.registry.catalog import registry_partition

pytestmark = pytest.mark.timeout(240)

PARTITIONS = 4  # NodeProcess's
TASKS = 160
BATCH = 20
SETTLE_S = 60.0
LED = re.compile(r"led here at epoch \d+, (\d+) records applied")


def wait_for(what: str, check: Callable[[], bool], timeout_s: float = SETTLE_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.2)  # other processes decide: nothing to wait on but their answers


def log_starts(bootstrap: str, topic: str) -> list[int]:
    async def read() -> list[int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=None)
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(PARTITIONS)]
            starts = await consumer.beginning_offsets(tps)
            return [int(starts[tp]) for tp in tps]
        finally:
            await consumer.stop()

    return asyncio.run(read())


def metric(base: str, name: str) -> list[float]:
    """The values of ``name``, one per partition, from the node's /metrics."""
    request = urllib.request.Request(base + "/metrics")
    request.add_header("Authorization", f"Bearer {METRICS_KEY}")
    with urllib.request.urlopen(request, timeout=10) as response:
        text = response.read().decode()
    found = re.findall(rf"^{name}\{{[^}}]*\}} (\S+)$", text, re.M)
    assert len(found) == PARTITIONS, text
    return [float(v) for v in found]


def newest_snapshots(root: Path) -> list[int]:
    """Per partition, the offset of the newest snapshot with a manifest (-1: none)."""
    newest = []
    for p in range(PARTITIONS):
        found = [int(m.parent.name[:20]) for m in root.glob(f"p{p:04d}/*/manifest.json")]
        newest.append(max(found, default=-1))
    return newest


def newer(root: Path, seen: list[int]) -> Callable[[], bool]:
    def check() -> bool:
        return all(a > b for a, b in zip(newest_snapshots(root), seen, strict=True))

    return check


def leads_all(node: NodeProcess) -> bool:
    status, body = call(node.base, "GET", "/healthz", key=None)
    return status == 200 and sorted(int(p) for p in body["leading"]) == list(range(PARTITIONS))


def enqueue(base: str, first: int, count: int) -> list[str]:
    ids = []
    for start in range(first, first + count, BATCH):
        items = [
            {  # keyed: spread over every partition (an unkeyed batch stays on one)
                "task_type": "pack_item",
                "app": "shop",
                "idempotency_key": f"k{i}",
                "payload": {"sku": f"S{i}"},
            }
            for i in range(start, start + BATCH)
        ]
        deadline = time.monotonic() + SETTLE_S
        status, reply = call(base, "POST", "/v1/tasks:batch", {"tasks": items}, key=CLIENT)
        while status == 503 and time.monotonic() < deadline:  # a restarted node catching up
            time.sleep(reply["error"].get("retry_after_ms", 100) / 1000)
            status, reply = call(base, "POST", "/v1/tasks:batch", {"tasks": items}, key=CLIENT)
        assert status == 201, reply
        ids += [r["task_id"] for r in reply["results"]]
    return ids


def finished(base: str, task_id: str) -> dict[str, object]:
    status, task = call(base, "GET", f"/v1/tasks/{task_id}?wait_ms=30000", key=CLIENT)
    assert status == 200 and task["status"] == "SUCCEEDED", task
    return dict(task)


def phase(what: str, since: list[float]) -> None:
    now = time.monotonic()
    print(f"{what}: {now - since[0]:.1f} s")
    since[0] = now


def test_a_fresh_node_restores_the_snapshots_past_the_trim_and_replays_only_the_tail(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    cluster = f"s{uuid.uuid4().hex[:8]}"
    snaps = tmp_path / "snapshots"
    options = ("--snapshots", str(snaps), "--snapshot-interval", "1s", "--log-level", "info")
    n1 = kafka_node(tmp_path, kafka_cluster.bootstrap, "n1", cluster)
    n2 = kafka_node(tmp_path, kafka_cluster.bootstrap, "n2", cluster)
    for node in (n1, n2):
        node.command = (*node.command, *options)
    agent = None
    t = [time.monotonic()]
    try:
        n1.start()
        wait_for("n1 to lead every partition", lambda: leads_all(n1))
        agent = start_agent(n1.base, tmp_path / "agent1.out")
        wait_registered(n1.base)
        phase("n1 and its agent up", t)
        ids: list[str] = []
        for round_ in range(4):  # work over several snapshots
            seen = newest_snapshots(snaps / cluster)
            ids += enqueue(n1.base, round_ * TASKS // 4, TASKS // 4)
            for task_id in ids[-TASKS // 4 :]:
                finished(n1.base, task_id)
            wait_for("a snapshot of every partition after this round", newer(snaps / cluster, seen))
        phase("tasks run, snapshots taken", t)
        before = {task_id: finished(n1.base, task_id) for task_id in ids}
        topic = f"{cluster}-log"
        catalog = registry_partition("default", PARTITIONS)  # the shop's types: kept whole

        def trimmed() -> bool:
            starts = log_starts(kafka_cluster.bootstrap, topic)
            return all((s == 0) if p == catalog else (s > 0) for p, s in enumerate(starts))

        wait_for("the log to be trimmed below the snapshots kept", trimmed)
        phase("trimmed", t)  # n1 started empty: it applied the whole history
        total = int(sum(metric(n1.base, "conveyor_processor_applied_records_total")))
        assert all(size > 0 for size in metric(n1.base, "conveyor_snapshot_bytes"))
        assert all(0 <= age < 30 for age in metric(n1.base, "conveyor_snapshot_age_seconds"))
        stop(agent)
        agent = None
        assert n1.stop() == 0, n1.logs()
        n1.proc = None
        starts = log_starts(kafka_cluster.bootstrap, topic)
        phase("n1 stopped", t)

        n2.start()  # an empty home: the log no longer holds the start of any partition
        wait_for("n2 to lead every partition", lambda: leads_all(n2))
        wait_for("n2 to say so", lambda: len(re.findall(LED, n2.logs())) == PARTITIONS)
        logs = n2.logs()
        phase("n2 restored and leads", t)
        restored = re.findall(r"partition (\d+): restored snapshot (\d{20})-e\d+", logs)
        assert sorted(int(p) for p, _ in restored) == list(range(PARTITIONS)), logs
        for p, offset in restored:  # each replays from above the trim point
            assert int(offset) + 1 >= starts[int(p)], (p, offset, starts)
        replayed = [int(n) for n in re.findall(LED, logs)]
        print(
            f"history {total} records; n2 applied {sum(replayed)} after restoring "
            f"{PARTITIONS} snapshots (log starts {starts})"
        )
        assert sum(replayed) * 5 < total, (replayed, total)

        for task_id, was in before.items():  # every task as n1 left it
            status, task = call(n2.base, "GET", f"/v1/tasks/{task_id}", key=CLIENT)
            assert status == 200, task
            assert (task["status"], task["result"]) == (was["status"], was["result"])
            assert len(task["attempts"]) == len(was["attempts"])

        agent = start_agent(n2.base, tmp_path / "agent2.out")
        wait_registered(n2.base)
        for task_id in enqueue(n2.base, TASKS, BATCH):
            assert finished(n2.base, task_id)["result"] is not None
        phase("new tasks run on n2", t)
    finally:
        if agent is not None:
            stop(agent)
        for node in (n1, n2):
            if node.proc is not None and node.proc.poll() is None:
                node.stop()


KAFKA = ("--kafka", "127.0.0.1:1", "--node-id", "n1", "--cluster-secret", "s" * 16)  # never reached


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (("--snapshots", "SNAPS"), "--snapshots are of a node on Kafka"),
        (
            (*KAFKA, "--snapshots", "ftp://x/y"),
            "neither a directory nor s3://bucket/prefix",
        ),
        (
            (*KAFKA, "--snapshots", "SNAPS", "--snapshot-interval", "soon"),
            "--snapshot-interval",
        ),
    ],
)
def test_bad_snapshot_options_stop_the_node_before_it_starts(
    tmp_path: Path, options: tuple[str, ...], says: str
) -> None:
    options = tuple(str(tmp_path / "snaps") if o == "SNAPS" else o for o in options)
    cmd = [sys.executable, "-m", "conveyor.cli", "node", "--home", str(tmp_path / "home")]
    done = subprocess.run([*cmd, *options], capture_output=True, text=True, timeout=60)
    assert done.returncode != 0
    assert says in done.stderr + done.stdout, done.stderr
    assert not (tmp_path / "home" / "state").exists()  # nothing was opened


@pytest.fixture
def s3_snapshots(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[str, Any]]:
    """moto's S3 server on 127.0.0.1, reached over HTTP through the AWS environment variables
    (the node processes inherit them); the snapshot URL and a client of the bucket."""
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    for name, value in (
        ("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}"),
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test-secret-never-logged"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    client = boto3.client("s3")
    client.create_bucket(Bucket="snaps")
    try:
        yield "s3://snaps/conveyor", client
    finally:
        server.stop()


def newest_in_s3(client: Any, cluster: str) -> list[int]:
    listed = client.list_objects_v2(Bucket="snaps", Prefix=f"conveyor/{cluster}/")
    newest = [-1] * PARTITIONS
    for item in listed.get("Contents", []):
        _, _, part, name, leaf = item["Key"].split("/")
        if leaf == "manifest.json":
            p = int(part[1:])
            newest[p] = max(newest[p], int(name[:20]))
    return newest


def newer_in_s3(client: Any, cluster: str, seen: list[int]) -> Callable[[], bool]:
    def check() -> bool:
        return all(a > b for a, b in zip(newest_in_s3(client, cluster), seen, strict=True))

    return check


def applied_offset(path: Path) -> int:
    kv = RocksKV(path)
    try:
        return Tables(kv).meta_int(keys.META_APPLIED) or -1
    finally:
        kv.close()


def test_a_node_restarting_behind_the_trim_point_restores_from_s3(
    kafka_cluster: KafkaCluster, tmp_path: Path, s3_snapshots: tuple[str, Any]
) -> None:
    url, client = s3_snapshots
    cluster = f"r{uuid.uuid4().hex[:8]}"
    node = kafka_node(tmp_path, kafka_cluster.bootstrap, "n1", cluster)
    options = ("--snapshots", url, "--snapshot-interval", "1s", "--log-level", "info")
    node.command = (*node.command, *options)
    state = node.home / "state"
    try:
        node.start()
        wait_for("n1 to lead every partition", lambda: leads_all(node))
        register_shop(node.base)  # no agent: the tasks stay queued, their state is the point
        ids = enqueue(node.base, 0, BATCH)
        assert node.stop() == 0, node.logs()
        shutil.copytree(state, tmp_path / "old-state")  # the stores as they were here
        applied = [applied_offset(tmp_path / "old-state" / f"p{p:04d}") for p in range(PARTITIONS)]

        node.start()
        for round_ in (1, 2, 3):  # work and snapshots until the log is trimmed past the copy
            seen = newest_in_s3(client, cluster)
            ids += enqueue(node.base, round_ * BATCH, BATCH)
            wait_for("a snapshot of every partition", newer_in_s3(client, cluster, seen))
        catalog = registry_partition("default", PARTITIONS)
        starts = log_starts(kafka_cluster.bootstrap, f"{cluster}-log")
        behind = [p for p in range(PARTITIONS) if p != catalog and starts[p] > applied[p] + 1]
        assert behind, (starts, applied)  # these stores of the copy cannot replay any more
        assert node.stop() == 0, node.logs()

        shutil.rmtree(state)
        shutil.copytree(tmp_path / "old-state", state)
        node.start()
        wait_for("n1 to lead every partition again", lambda: leads_all(node))
        logs = node.logs()
        restored = {int(p) for p in re.findall(r"partition (\d+): restored snapshot", logs)}
        assert set(behind) <= restored, logs
        for task_id in ids:
            status, task = call(node.base, "GET", f"/v1/tasks/{task_id}", key=CLIENT)
            assert status == 200 and task["status"] == "ENQUEUED", task
        assert "test-secret-never-logged" not in logs
    finally:
        if node.proc is not None and node.proc.poll() is None:
            node.stop()
