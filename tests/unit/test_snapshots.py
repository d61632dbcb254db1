"""Partition snapshots over real RocksDB stores and a real snapshot store (a directory, and
moto's S3 server on 127.0.0.1): a restore gives back every key and the offset, a damaged
snapshot falls back to an older one, then to the local store, and the log is trimmed only
below the oldest snapshot kept."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto.server import ThreadedMotoServer

from conveyor.store import keys
from conveyor.store.api import KV
from conveyor.store.state_schemas import open_state
from conveyor.streams.clock import FakeClock
from conveyor.streams.cluster import snapshots
from conveyor.streams.cluster.snapshot_store import (
    LocalSnapshotStore,
    S3SnapshotStore,
    SnapshotStore,
)
from conveyor.streams.cluster.snapshots import (
    ARCHIVE,
    MANIFEST,
    Manifest,
    RestoreFailed,
    Snapshots,
    partition_prefix,
)
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.sinks.metrics import Metrics

CLUSTER = "c1"


def state(kv: KV) -> dict[bytes, bytes]:
    return dict(kv.scan(b""))


def fill(kv: KV, first: int, count: int, applied: int) -> None:
    """``count`` rows from ``first``, then the applied offset, in one batch as the processor
    writes them."""
    rows: dict[bytes, bytes | None] = {
        f"t/{i:06d}".encode(): os.urandom(64) for i in range(first, first + count)
    }
    rows[keys.META_APPLIED] = keys.u64(applied)
    rows[keys.META_EPOCH] = keys.u64(7)
    kv.write(rows)


class Home:
    """One node's partition stores (``home/state/pNNNN``) and its snapshots."""

    def __init__(self, root: Path, store: SnapshotStore, log: MemoryLog, keep: int = 2) -> None:
        (root / "state").mkdir(parents=True)
        self.stores: list[KV] = [open_state(root / "state" / "p0000")]
        self.led = True
        self.clock = FakeClock()
        self.snapshots = Snapshots(
            store,
            self.stores,
            lambda p: self.led,
            log,
            cluster=CLUSTER,
            node_id=root.name,
            work_dir=root / "snapshots",
            clock=self.clock,
            interval_ms=1_000,
            keep=keep,
        )

    def close(self) -> None:
        for kv in self.stores:
            kv.close()


@pytest.fixture
def log() -> MemoryLog:
    log = MemoryLog(1)
    asyncio.run(log.append(0, [b"r"] * 100))  # offsets 0..99
    return log


@pytest.fixture
def local_store(tmp_path: Path) -> LocalSnapshotStore:
    return LocalSnapshotStore(tmp_path / "snapshots")


@pytest.fixture
def s3_store(monkeypatch: pytest.MonkeyPatch) -> Iterator[S3SnapshotStore]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    for name, value in (
        ("AWS_ACCESS_KEY_ID", "test"),
        ("AWS_SECRET_ACCESS_KEY", "test"),
        ("AWS_DEFAULT_REGION", "us-east-1"),
    ):
        monkeypatch.setenv(name, value)
    endpoint = f"http://127.0.0.1:{port}"
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="snaps")
    try:
        yield S3SnapshotStore("s3://snaps/prod", endpoint_url=endpoint)
    finally:
        server.stop()


@pytest.mark.parametrize("which", ["local_store", "s3_store"])
def test_a_restore_into_an_empty_home_gives_every_key_and_the_offset(
    which: str, request: pytest.FixtureRequest, tmp_path: Path, log: MemoryLog
) -> None:
    store: SnapshotStore = request.getfixturevalue(which)
    owner = Home(tmp_path / "n1", store, log)
    fill(owner.stores[0], 0, 5_000, applied=41)
    taken = asyncio.run(owner.snapshots.take(0))
    assert taken is not None and taken.offset == 41 and taken.epoch == 7
    expected = state(owner.stores[0])
    fill(owner.stores[0], 5_000, 10, applied=50)  # after the snapshot: not in it

    fresh = Home(tmp_path / "n2", store, log)
    before = fresh.stores[0]
    asyncio.run(fresh.snapshots.restore(0))
    assert fresh.stores[0] is before  # swapped under the same object: its holders see it
    assert state(fresh.stores[0]) == expected
    assert fresh.snapshots.newest[0] == taken
    owner.close()
    fresh.close()


def corrupt(store: LocalSnapshotStore, manifest: Manifest) -> None:
    path = store.root / partition_prefix(CLUSTER, 0) / manifest.name / ARCHIVE
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_damaged_newest_snapshot_falls_back_to_the_older_one(
    tmp_path: Path,
    log: MemoryLog,
    local_store: LocalSnapshotStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = Home(tmp_path / "n1", local_store, log)
    fill(owner.stores[0], 0, 200, applied=10)
    older = asyncio.run(owner.snapshots.take(0))
    at_older = state(owner.stores[0])
    fill(owner.stores[0], 200, 200, applied=20)
    newer = asyncio.run(owner.snapshots.take(0))
    assert older is not None and newer is not None
    corrupt(local_store, newer)

    fresh = Home(tmp_path / "n2", local_store, log)
    with caplog.at_level(logging.WARNING, "conveyor.snapshots"):
        asyncio.run(fresh.snapshots.restore(0))
    assert state(fresh.stores[0]) == at_older
    assert f"snapshot {newer.name} unusable" in caplog.text
    owner.close()
    fresh.close()


def test_with_every_snapshot_damaged_the_local_store_replays_or_restore_fails(
    tmp_path: Path,
    log: MemoryLog,
    local_store: LocalSnapshotStore,
    caplog: pytest.LogCaptureFixture,
) -> None:
    owner = Home(tmp_path / "n1", local_store, log)
    fill(owner.stores[0], 0, 100, applied=30)
    only = asyncio.run(owner.snapshots.take(0))
    assert only is not None and log.start_offset(0) == 0  # one of two kept: no trim yet
    corrupt(local_store, only)

    behind = Home(tmp_path / "n2", local_store, log)
    fill(behind.stores[0], 0, 3, applied=5)  # older than the snapshot; the log holds 6 on
    mine = state(behind.stores[0])
    with caplog.at_level(logging.WARNING, "conveyor.snapshots"):
        asyncio.run(behind.snapshots.restore(0))
    assert state(behind.stores[0]) == mine
    assert "no snapshot usable; replaying the log from offset 6" in caplog.text

    asyncio.run(log.trim(0, 31))  # as a later snapshot's owner would have
    with pytest.raises(RestoreFailed, match="the log starts at offset 31"):
        asyncio.run(behind.snapshots.restore(0))
    assert state(behind.stores[0]) == mine
    for home in (owner, behind):
        home.close()


def test_a_local_store_as_new_as_the_snapshot_is_kept(
    tmp_path: Path, log: MemoryLog, local_store: LocalSnapshotStore
) -> None:
    owner = Home(tmp_path / "n1", local_store, log)
    fill(owner.stores[0], 0, 10, applied=12)
    asyncio.run(owner.snapshots.take(0))
    fill(owner.stores[0], 10, 10, applied=15)
    mine = owner.stores[0]
    owner.stores[0].close()
    owner.stores[0] = open_state(tmp_path / "n1" / "state" / "p0000")  # as after a restart
    mine = owner.stores[0]
    asyncio.run(owner.snapshots.restore(0))
    assert owner.stores[0] is mine and owner.stores[0].get(b"t/000015") is not None
    owner.close()


def test_the_newest_are_kept_and_the_log_trimmed_below_the_oldest_kept(
    tmp_path: Path, log: MemoryLog, local_store: LocalSnapshotStore
) -> None:
    owner = Home(tmp_path / "n1", local_store, log, keep=2)
    fill(owner.stores[0], 0, 10, applied=10)
    asyncio.run(owner.snapshots.take(0))
    assert log.start_offset(0) == 0  # one snapshot of two: no fallback yet, no trim
    for applied in (20, 30):
        fill(owner.stores[0], applied, 10, applied=applied)
        asyncio.run(owner.snapshots.take(0))
    listed, _ = asyncio.run(owner.snapshots.list(0))
    assert [m.offset for m in listed] == [30, 20]
    assert log.start_offset(0) == 21  # every kept snapshot replays from the log
    names = {p.name for p in (local_store.root / partition_prefix(CLUSTER, 0)).iterdir()}
    assert names == {m.name for m in listed}
    owner.close()


def test_only_a_led_partition_is_snapshotted_on_its_schedule(
    tmp_path: Path, log: MemoryLog, local_store: LocalSnapshotStore
) -> None:
    owner = Home(tmp_path / "n1", local_store, log)
    fill(owner.stores[0], 0, 10, applied=5)

    async def ticks(n: int) -> None:
        """``n`` intervals of the fake clock, each once the schedule sleeps again."""
        for _ in range(n):
            owner.clock.advance(1_000)
            for _ in range(1_000):  # until the schedule waits on the clock (a take included)
                await asyncio.sleep(0.005)
                if owner.clock._sleepers:
                    break

    async def main() -> None:
        owner.snapshots.start()
        await ticks(1)
        assert 0 not in owner.snapshots.newest  # it just started leading: an interval first
        await ticks(2)
        assert owner.snapshots.newest[0].offset == 5
        await ticks(2)  # nothing applied since: no second snapshot of offset 5
        owner.led = False
        fill(owner.stores[0], 10, 10, applied=9)
        await ticks(3)
        await owner.snapshots.stop()

    asyncio.run(main())
    listed, _ = asyncio.run(owner.snapshots.list(0))
    assert [m.offset for m in listed] == [5]  # not led: offset 9 never snapshotted
    owner.close()


def test_an_archive_without_its_manifest_is_not_a_snapshot(
    tmp_path: Path, log: MemoryLog, local_store: LocalSnapshotStore
) -> None:
    owner = Home(tmp_path / "n1", local_store, log)
    fill(owner.stores[0], 0, 10, applied=10)
    taken = asyncio.run(owner.snapshots.take(0))
    assert taken is not None
    base = local_store.root / partition_prefix(CLUSTER, 0) / taken.name
    (base / MANIFEST).unlink()  # as if the upload died between the two objects
    fresh = Home(tmp_path / "n2", local_store, log)
    asyncio.run(fresh.snapshots.restore(0))
    assert state(fresh.stores[0]) == {}
    manifest = json.loads(taken.to_json())
    assert manifest["offset"] == 10 and manifest["format"] == 1
    owner.close()
    fresh.close()


def test_the_metrics_show_the_newest_snapshot_of_each_partition_led_here(
    tmp_path: Path, log: MemoryLog, local_store: LocalSnapshotStore
) -> None:
    owner = Home(tmp_path / "n1", local_store, log)
    fill(owner.stores[0], 0, 10, applied=10)
    taken = asyncio.run(owner.snapshots.take(0))
    assert taken is not None
    owner.clock.advance(4_000)
    metrics = Metrics()
    metrics.watch_snapshots(owner.snapshots)
    text = metrics.exposition().decode()
    assert 'conveyor_snapshot_age_seconds{partition="0"} 4.0' in text
    assert f'conveyor_snapshot_bytes{{partition="0"}} {float(taken.archive_bytes)}' in text
    assert 'conveyor_snapshot_duration_seconds{partition="0"}' in text
    owner.led = False  # led elsewhere now: its age here means nothing
    assert "conveyor_snapshot_age_seconds{" not in metrics.exposition().decode()
    owner.close()


def test_a_partition_holding_a_catalog_keeps_its_log_whole(
    tmp_path: Path, log: MemoryLog, local_store: LocalSnapshotStore
) -> None:
    owner = Home(tmp_path / "n1", local_store, log, keep=1)
    fill(owner.stores[0], 0, 10, applied=10)
    owner.stores[0].write({keys.REGISTRY + b"catalog-row": b"{}"})
    taken = asyncio.run(owner.snapshots.take(0))
    assert taken is not None and log.start_offset(0) == 0  # mirrors read it from the start
    owner.close()


def test_a_swap_that_fails_leaves_the_old_store_open_and_whole(
    tmp_path: Path,
    log: MemoryLog,
    local_store: LocalSnapshotStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    owner = Home(tmp_path / "n1", local_store, log)
    fill(owner.stores[0], 0, 50, applied=30)
    asyncio.run(owner.snapshots.take(0))
    behind = Home(tmp_path / "n2", local_store, log)
    fill(behind.stores[0], 0, 3, applied=5)
    mine = state(behind.stores[0])

    def refused(new: Path, path: Path) -> None:
        raise OSError(22, f"cannot swap {new} and {path}")

    monkeypatch.setattr(snapshots, "exchange", refused)
    asyncio.run(behind.snapshots.restore(0))
    assert state(behind.stores[0]) == mine  # reopened, as it was
    assert not list((tmp_path / "n2" / "state").glob(".restore-*"))  # the scratch is gone
    for home in (owner, behind):
        home.close()
