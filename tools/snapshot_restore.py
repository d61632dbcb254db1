"""How long a node takes to lead a partition: restoring a snapshot vs replaying the history.

    .venv/bin/python tools/snapshot_restore.py [--tasks 10000] [--batch 10] [--partitions 4]

On a local broker started for the run (stopped on exit, by PID): node A enqueues ``--tasks``
tasks in batches of ``--batch`` (one log record per partition a batch touches), snapshots
every partition to a local directory and stops. Then two fresh nodes (empty homes) lead every
partition: B replays the whole log, C restores the snapshots and replays the tail. Printed:
the records, the snapshot figures, and the time to lead every partition for B and C, with the
tasks each has in state (they must match).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from conveyor.schemas.types import TaskSpec
from conveyor.store import keys
from conveyor.streams.cluster.snapshot_store import LocalSnapshotStore
from conveyor.streams.cluster.snapshots import Snapshots
from conveyor.streams.log.kafka_broker import KafkaCluster
from conveyor.streams.node import Node
from conveyor.streams.routing import mint_task_id

CLUSTER = "restore"


def snapshots(node: Node, root: Path, home: Path) -> Snapshots:
    return Snapshots(
        LocalSnapshotStore(root),
        node.stores,
        lambda p: True,
        node.log,  # type: ignore[arg-type]  # a KafkaLog: it trims
        cluster=CLUSTER,
        node_id=node.node_id,
        work_dir=home / "snapshots",
        clock=node.clock,
    )


def tasks_in_state(node: Node) -> int:
    return sum(1 for p in range(node.partitions) for _ in node.stores[p].scan(keys.TASKS))


async def fill(bootstrap: str, tmp: Path, tasks: int, batch: int, partitions: int) -> None:
    node = await Node.open_kafka(
        tmp / "a", bootstrap, node_id="a", cluster=CLUSTER, partitions=partitions
    )
    try:
        for p in range(partitions):
            await node.start_partition(p)
        started = time.monotonic()
        for lo in range(0, tasks, batch):
            specs = [
                TaskSpec(
                    task_id=mint_task_id(i % partitions),
                    tenant="t",
                    app="bench",
                    task_type="noop",
                    payload=b'{"n": %d}' % i,
                )
                for i in range(lo, min(tasks, lo + batch))
            ]
            await node.enqueue(specs)
        records = sum(p.records_applied for p in node.processors)
        print(f"A: {tasks} tasks enqueued in {time.monotonic() - started:.1f} s, {records} records")
        snaps = snapshots(node, tmp / "snaps", tmp / "a")
        started = time.monotonic()
        made = [await snaps.take(p) for p in range(partitions)]
        size = sum(m.archive_bytes for m in made if m is not None)
        print(f"A: {partitions} snapshots, {size / 1e6:.1f} MB, {time.monotonic() - started:.2f} s")
    finally:
        await node.stop()


async def lead_all(bootstrap: str, home: Path, partitions: int, restore_from: Path | None) -> None:
    node = await Node.open_kafka(
        home, bootstrap, node_id=home.name, cluster=CLUSTER, partitions=partitions
    )
    try:
        snaps = None if restore_from is None else snapshots(node, restore_from, home)
        restoring = leading = 0.0
        for p in range(partitions):
            started = time.monotonic()
            if snaps is not None:
                await snaps.restore(p)
            restoring += time.monotonic() - started
            await node.start_partition(p)  # replay from the store's offset, then lead
            leading += time.monotonic() - started
        replayed = sum(p.records_applied for p in node.processors)
        how = "restored + replayed the tail" if snaps else "replayed the whole log"
        print(
            f"{home.name.upper()}: {how}: every partition led in {leading:.2f} s "
            f"(restores {restoring:.2f} s), {replayed} records applied, "
            f"{tasks_in_state(node)} tasks in state"
        )
    finally:
        await node.stop()


async def main(tasks: int, batch: int, partitions: int) -> None:
    with tempfile.TemporaryDirectory(prefix="conveyor-restore-") as name:
        tmp = Path(name)
        kafka = KafkaCluster.start(1, tmp / "kafka")
        try:
            await fill(kafka.bootstrap, tmp, tasks, batch, partitions)
            await lead_all(kafka.bootstrap, tmp / "b", partitions, None)
            await lead_all(kafka.bootstrap, tmp / "c", partitions, tmp / "snaps")
        finally:
            kafka.stop()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=4)
    args = parser.parse_args()
    asyncio.run(main(args.tasks, args.batch, args.partitions))
