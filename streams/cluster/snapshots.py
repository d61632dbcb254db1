"""Partition snapshots: a copy of a partition's state kept beside the log, so a node that takes
the partition replays only the tail, and the log can be trimmed below it.

    snapshot store (snapshot_store.py)                       the log topic of the partition
    <cluster>/p0003/<offset>-e<epoch>/state.tar.gz             trimmed | retained
                                     /manifest.json          0 ...... S+1 ........... end
                                                                   ^ the oldest snapshot kept
                                                                     applied through S

The rules, and why:

1. Consistent: a snapshot is a RocksDB checkpoint (``RocksKV.checkpoint``: a flush, then hard
   links of the table files; ~70 ms for 100k keys where copying them by iteration took
   ~840 ms). The processor writes state and its applied offset in one batch, and a checkpoint
   holds every batch before it and none after, so the offset recorded is the one read from
   the copy itself: no record is ever half in a snapshot.
2. Taken by the owner: a partition is snapshotted only while it is led here, every
   ``interval_ms`` (the injected clock's) and only once its applied offset moved, and the
   result is uploaded only if it is still led here when packed. A snapshot is a function of
   the log prefix it applied, so one uploaded by a stale owner is still right; it is at worst
   older than the others and pruned first.
3. Atomic to readers: the archive is uploaded first, the manifest (offset, epoch, state
   schemas, size, SHA-256 of the archive) last; a reader only sees snapshots with a manifest.
   Prunes delete the manifest first. An archive without a manifest below the oldest kept
   snapshot is a failed upload, and is deleted by the next prune.
4. The newest ``keep`` are kept. Once there are ``keep`` of them, the log is trimmed below
   the oldest kept (offsets up to S): every kept snapshot can still be restored and replayed
   from, so a damaged newest one falls back to an older one. A partition whose state holds a
   tenant's catalog (``keys.REGISTRY`` rows) is not trimmed: a node that does not own it
   follows its log from the start into a memory mirror of the catalog
   (``streams/registry/catalog.py``), which a trim would leave without its first rows. The
   events topic is trimmed on its own terms, below what every node's readers still need
   (``events_trim.py``), not below a snapshot.
5. Restore (``restore``, the ownership's seam) runs while the partition is closed here. It
   installs the newest snapshot whose state schemas are this build's when the local store
   applied less than it (or nothing). The archive is checked (size, SHA-256, the offset in the
   copy against the manifest) in a scratch directory beside the store, then swapped in with
   one ``renameat2(RENAME_EXCHANGE)``: a crash leaves the old store or the new one in place,
   never a mix. The store object stays the same (closed, swapped, reopened with no await in
   between): the node hands that one object to the partition's next processor. A snapshot
   that cannot be read falls back to the next older one, then to the local store, with a
   warning. The local store can replay only if the log still holds the offset
   after its own; when it does not and no snapshot can be restored, ``RestoreFailed``
   (retryable: the store may come back) and the partition is not led. So a build with other
   state schemas cannot take over a trimmed log (``store/state_schemas.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import hashlib
import json
import logging
import os
import re
import shutil
import tarfile
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol, TypeVar

from conveyor.errors import TransientError
from conveyor.frozen import frozen
from conveyor.store import keys
from conveyor.store.api import KV
from conveyor.store.rocksdb import RocksKV
from conveyor.store.state_schemas import fingerprint
from conveyor.store.tables import Tables
from conveyor.streams.clock import Clock
from conveyor.streams.cluster.snapshot_store import SnapshotMissing, SnapshotStore, fsync_dir

log = logging.getLogger("conveyor.snapshots")
T = TypeVar("T")

FORMAT = 1
MANIFEST, ARCHIVE = "manifest.json", "state.tar.gz"
DEFAULT_INTERVAL_MS = 30_000
DEFAULT_KEEP = 2
TICK_MS_MAX = 1_000  # how often the schedule looks at the partitions led here
GZIP_LEVEL = 1  # table files are block-compressed already: a harder level buys little
RESTORE_RETRY_MS = 5_000
_NAME = re.compile(r"^(\d{20})-e(\d+)$")


class RestoreFailed(TransientError):
    """The log was trimmed past the local store and no snapshot could be restored (rule 5)."""

    code = "restore_failed"


class SnapshotUnreadable(Exception):
    """A snapshot is missing a part, damaged, or does not match its manifest."""


class TrimmableLog(Protocol):
    """What snapshots need of the record log."""

    async def trim(self, partition: int, up_to: int) -> None: ...

    def start_offset(self, partition: int) -> int: ...


@frozen
class Manifest:
    partition: int
    offset: int  # applied through this offset: the processor replays from offset + 1
    epoch: int  # the epoch announced in the state
    state_schemas: str  # ``state_schemas.fingerprint()`` of the build that took it
    archive_bytes: int
    archive_sha256: str
    taken_ms: int
    node_id: str

    @property
    def name(self) -> str:
        return f"{self.offset:020d}-e{self.epoch}"

    def to_json(self) -> bytes:
        return json.dumps({"format": FORMAT, **asdict(self)}, sort_keys=True).encode()

    @classmethod
    def from_json(cls, data: bytes, name: str) -> Manifest:
        try:
            fields = json.loads(data)
            assert fields.pop("format") == FORMAT
            manifest = cls(**fields)
        except (ValueError, TypeError, KeyError, AssertionError) as exc:
            raise SnapshotUnreadable(f"manifest of {name} does not parse ({exc!r})") from None
        if manifest.name != name:
            raise SnapshotUnreadable(f"manifest of {name} names {manifest.name}")
        return manifest


def partition_prefix(cluster: str, partition: int) -> str:
    return f"{cluster}/p{partition:04d}/"


class Snapshots:
    """The snapshots of one node's partitions: the schedule (``run``), ``take``, ``restore``.

    ``stores`` is the node's list of partition stores (``restore`` swaps the directory under
    an entry and reopens it). ``leading(p)``: whether ``p`` is led here now."""

    def __init__(
        self,
        store: SnapshotStore,
        stores: list[KV],
        leading: Callable[[int], bool],
        log_: TrimmableLog,
        *,
        cluster: str,
        node_id: str,
        work_dir: Path,
        clock: Clock,
        interval_ms: int = DEFAULT_INTERVAL_MS,
        keep: int = DEFAULT_KEEP,
    ) -> None:
        if keep < 1 or interval_ms <= 0:
            raise ValueError(f"snapshots need keep >= 1 and interval_ms > 0: {keep}, {interval_ms}")
        self.store, self.stores, self._leading, self.log = store, stores, leading, log_
        self.cluster, self.node_id, self.clock = cluster, node_id, clock
        self.interval_ms, self.keep = interval_ms, keep
        self.work = work_dir
        shutil.rmtree(self.work, ignore_errors=True)  # scratch of a previous run
        self.work.mkdir(parents=True)
        self._locks = [asyncio.Lock() for _ in stores]  # a checkpoint, or a store being swapped
        self._last_offset: dict[int, int] = {}
        self._last_ms: dict[int, int] = {}
        self.newest: dict[int, Manifest] = {}  # taken or restored here (for the metrics)
        self.last_duration_ms: dict[int, float] = {}
        self._runner: asyncio.Task[None] | None = None
        self._taken = 0  # names the scratch directories
        self._schemas = fingerprint()

    def figures(self) -> dict[int, tuple[float, int, float | None]]:
        """For the metrics, per partition led here with a snapshot: the newest snapshot's age
        (seconds), its archive's bytes, and how long the last one taken here took (seconds;
        None when it was restored, not taken, here)."""
        now = self.clock.now_ms()
        return {
            p: (
                max(0.0, (now - m.taken_ms) / 1000),
                m.archive_bytes,
                None if (ms := self.last_duration_ms.get(p)) is None else ms / 1000,
            )
            for p, m in sorted(self.newest.items())
            if self._leading(p)
        }

    # -- the schedule (rule 2) ---------------------------------------------------------------

    def start(self) -> None:
        self._runner = asyncio.create_task(self.run(), name="snapshots")

    async def stop(self) -> None:
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner

    async def run(self) -> None:
        while True:
            await self.clock.sleep_ms(min(self.interval_ms, TICK_MS_MAX))
            for p in range(len(self.stores)):
                if self._due(p):
                    await self._take_logged(p)

    def _due(self, p: int) -> bool:
        if not self._leading(p):
            self._last_ms.pop(p, None)
            return False
        now = self.clock.now_ms()
        since = self._last_ms.setdefault(p, now)  # an interval after it started leading here
        applied = _applied(self.stores[p])
        return now - since >= self.interval_ms and applied > self._last_offset.get(p, -1)

    async def _take_logged(self, p: int) -> None:
        self._last_ms[p] = self.clock.now_ms()
        try:
            await self.take(p)
        except Exception as exc:  # the next interval tries again; the log keeps everything
            log.warning("partition %d: snapshot to %s failed: %r", p, self.store.describe(), exc)

    # -- taking (rules 1-4) ------------------------------------------------------------------

    async def take(self, p: int) -> Manifest | None:
        """Snapshot ``p`` now, upload it, prune and trim; None if ``p`` is not led here."""
        if not self._leading(p):
            return None
        started = self.clock.monotonic_ms()
        self._taken += 1
        scratch = self.work / f"p{p:04d}-{self._taken}"
        scratch.mkdir()
        try:
            async with self._locks[p]:  # the store stays open while the thread copies it
                await _thread(_rocks(self.stores[p], p).checkpoint, scratch / "db")
            archive = scratch / ARCHIVE
            offset, epoch = await _thread(_pack, scratch / "db", archive)
            digest, size = await _thread(_digest, archive)
            if not self._leading(p):  # rule 2
                return None
            manifest = Manifest(
                partition=p,
                offset=offset,
                epoch=epoch,
                state_schemas=self._schemas,
                archive_bytes=size,
                archive_sha256=digest,
                taken_ms=self.clock.now_ms(),
                node_id=self.node_id,
            )
            await self._upload(manifest, archive, scratch / MANIFEST)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        self._last_offset[p] = offset
        self.newest[p] = manifest
        self.last_duration_ms[p] = self.clock.monotonic_ms() - started
        log.info("partition %d: snapshot at offset %d (%d bytes)", p, offset, size)
        await self._prune_and_trim(p)
        return manifest

    async def _upload(self, manifest: Manifest, archive: Path, manifest_file: Path) -> None:
        """Rule 3: the archive, then the manifest."""
        base = partition_prefix(self.cluster, manifest.partition) + manifest.name + "/"
        manifest_file.write_bytes(manifest.to_json())
        await _thread(self.store.put_file, base + ARCHIVE, archive)
        await _thread(self.store.put_file, base + MANIFEST, manifest_file)

    async def _prune_and_trim(self, p: int) -> None:
        """Rule 4."""
        listed, names = await self.list(p)
        kept, dropped = listed[: self.keep], listed[self.keep :]
        prefix = partition_prefix(self.cluster, p)
        if dropped:
            await _thread(self.store.delete, [f"{prefix}{m.name}/{MANIFEST}" for m in dropped])
        floor = kept[-1].offset if kept else -1
        kept_names = {m.name for m in kept}
        stale = [
            key
            for name, key_list in names.items()
            if name not in kept_names and int(name[:20]) < floor
            for key in key_list
        ]
        if stale:
            await _thread(self.store.delete, stale)
        if len(kept) < self.keep or floor + 1 <= self.log.start_offset(p):
            return
        if _holds_catalog(self.stores[p]):
            log.debug("partition %d holds a catalog: its log is kept whole", p)
            return
        await self.log.trim(p, floor + 1)
        log.info("partition %d: log trimmed below offset %d", p, floor + 1)

    async def list(self, p: int) -> tuple[list[Manifest], dict[str, list[str]]]:
        """The readable manifests of ``p``, newest first; and every snapshot's object names,
        by snapshot (the unreadable ones and failed uploads too)."""
        prefix = partition_prefix(self.cluster, p)
        names: dict[str, list[str]] = {}
        for key in await _thread(self.store.keys, prefix):
            name = key[len(prefix) :].split("/", 1)[0]
            if _NAME.match(name):
                names.setdefault(name, []).append(key)
        manifests = []
        for name in sorted(names, reverse=True):
            if f"{prefix}{name}/{MANIFEST}" not in names[name]:
                continue  # rule 3: not there yet, or a failed upload
            try:
                manifests.append(await self._manifest(p, name))
            except (SnapshotUnreadable, SnapshotMissing) as exc:
                log.warning("partition %d: snapshot %s skipped: %s", p, name, exc)
        return manifests, names

    async def _manifest(self, p: int, name: str) -> Manifest:
        scratch = self.work / f"manifest-p{p:04d}-{name}"
        try:
            key = f"{partition_prefix(self.cluster, p)}{name}/{MANIFEST}"
            await _thread(self.store.get_file, key, scratch)
            manifest = Manifest.from_json(scratch.read_bytes(), name)
        finally:
            scratch.unlink(missing_ok=True)
        if manifest.partition != p:
            raise SnapshotUnreadable(f"manifest of {name} is partition {manifest.partition}'s")
        return manifest

    # -- restoring (rule 5) ------------------------------------------------------------------

    async def restore(self, p: int) -> None:
        """The ownership's seam: make ``p``'s local store fit to replay from the log."""
        local = _applied(self.stores[p])
        refresh = getattr(self.log, "refresh_start_offset", None)  # a log others trim too
        start = await refresh(p) if refresh is not None else self.log.start_offset(p)
        can_replay = local + 1 >= start
        try:
            listed, _ = await self.list(p)
        except Exception as exc:
            if can_replay:
                log.warning("partition %d: no snapshot listing (%r); replaying the log", p, exc)
                return
            raise self._failed(p, local, start, f"listing them failed ({exc!r})") from exc
        for manifest in listed:
            if manifest.offset <= local:
                return  # the local store is as new: it replays the tail
            if manifest.state_schemas != self._schemas:
                log.warning("partition %d: snapshot %s has other state schemas", p, manifest.name)
                continue
            try:
                await self._install(p, manifest)
            except (SnapshotUnreadable, SnapshotMissing, OSError, tarfile.TarError) as exc:
                why = "partition %d: snapshot %s unusable (%s); trying the next older one"
                log.warning(why, p, manifest.name, exc)
                continue
            return
        if not can_replay:
            raise self._failed(p, local, start, f"{len(listed)} snapshot(s) found, none usable")
        if listed:
            why = "partition %d: no snapshot usable; replaying the log from offset %d"
            log.warning(why, p, local + 1)

    def _failed(self, p: int, local: int, start: int, why: str) -> RestoreFailed:
        return RestoreFailed(
            f"partition {p}: the log starts at offset {start}, the local store applied "
            f"through {local}, and no snapshot in {self.store.describe()} restores it: {why}. "
            "Check that the snapshot store is reachable and holds this cluster's snapshots",
            retry_after_ms=RESTORE_RETRY_MS,
        )

    async def _install(self, p: int, manifest: Manifest) -> None:
        started = self.clock.monotonic_ms()
        path = _rocks(self.stores[p], p).path
        scratch = path.with_name(f".restore-{path.name}")  # beside the store: same filesystem
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir()
        try:
            key = f"{partition_prefix(self.cluster, p)}{manifest.name}/{ARCHIVE}"
            await _thread(self.store.get_file, key, scratch / ARCHIVE)
            await _thread(_unpack, scratch / ARCHIVE, manifest, scratch / "db")
            async with self._locks[p]:  # no checkpoint of it runs; the rest is on this thread
                kv = _rocks(self.stores[p], p)
                kv.close()
                try:
                    exchange(scratch / "db", path)
                finally:
                    kv.reopen()  # the same object: every holder of the store sees the new one
        finally:
            shutil.rmtree(scratch, ignore_errors=True)  # the old store, after the exchange
        self.newest[p] = manifest
        self._last_offset[p] = manifest.offset
        log.info(
            "partition %d: restored snapshot %s in %.0f ms; replaying from offset %d",
            p,
            manifest.name,
            self.clock.monotonic_ms() - started,
            manifest.offset + 1,
        )


def _rocks(kv: KV, p: int) -> RocksKV:
    if not isinstance(kv, RocksKV):
        raise TypeError(f"partition {p}'s store is not RocksDB but {type(kv).__name__}")
    return kv


def _holds_catalog(kv: KV) -> bool:
    """Rule 4: catalog rows are here, and mirrors elsewhere read them from the log's start."""
    return next(iter(kv.scan(keys.REGISTRY)), None) is not None


def _applied(kv: KV) -> int:
    applied = Tables(kv).meta_int(keys.META_APPLIED)
    return -1 if applied is None else applied


async def _thread(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a thread, awaited to its end even when cancelled: a checkpoint or an
    unpack must not outlive the lock that keeps its store open."""
    future = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(Exception):
            await future
        raise


def _pack(db: Path, archive: Path) -> tuple[int, int]:
    """Rule 1: the offset and epoch the checkpoint at ``db`` holds, and ``db`` packed."""
    copy = RocksKV(db)
    try:
        tables = Tables(copy)
        offset = tables.meta_int(keys.META_APPLIED)
        epoch = tables.meta_int(keys.META_EPOCH) or 0
    finally:
        copy.close()
    if offset is None:
        raise SnapshotUnreadable("the store has applied nothing yet")
    with tarfile.open(archive, "w:gz", compresslevel=GZIP_LEVEL) as tar:
        tar.add(db, arcname="db")
    return offset, epoch


def _digest(path: Path) -> tuple[str, int]:
    sha = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest(), path.stat().st_size


def _unpack(archive: Path, manifest: Manifest, db: Path) -> None:
    """Check ``archive`` against ``manifest``, unpack it to ``db`` and make it durable."""
    digest, size = _digest(archive)
    if (digest, size) != (manifest.archive_sha256, manifest.archive_bytes):
        raise SnapshotUnreadable(f"archive of {manifest.name} does not match its manifest")
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if not (member.isfile() or member.isdir()) or not member.name.startswith("db"):
                raise SnapshotUnreadable(f"archive of {manifest.name} holds {member.name!r}")
        tar.extractall(db.parent, filter="data")
    copy = RocksKV(db)
    try:
        applied = _applied(copy)
    finally:
        copy.close()
    if applied != manifest.offset:
        raise SnapshotUnreadable(f"{manifest.name} holds offset {applied}")
    for path in [*db.rglob("*"), db]:
        if path.is_file():
            with path.open("rb") as fh:
                os.fsync(fh.fileno())
    fsync_dir(db)


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(new: Path, path: Path) -> None:
    """Swap the directories ``new`` and ``path`` in one step (rule 5)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.renameat2(_AT_FDCWD, os.fsencode(new), _AT_FDCWD, os.fsencode(path), _RENAME_EXCHANGE):
        errno = ctypes.get_errno()
        raise OSError(errno, f"cannot swap {new} and {path}: {os.strerror(errno)}")
    fsync_dir(path.parent)
