"""Where every node reads and writes a tenant's task types and schemas.

Rule 1 (one partition per tenant): a tenant's catalog (its apps' task types with their
definitions, its subjects, schema ids and compatibility levels: ``store/catalog.py``) lives
on one partition, ``registry_partition(tenant)``, a hash like any keyed enqueue's. One
partition, not one per app: schema ids are a sequence per tenant (``routes.py`` says why per
tenant), and a sequence has one writer, the record order of one log. The rows are written by
records (``RegisterTypes``, ``RegisterSchema``, ``DeleteSchemas``, ``SetCompatibility``),
so they replicate, survive a restart and fail over like every task.
Rule 2 (every node reads it): a node that has the partition open reads its processor's
state. A node of a cluster that does not keeps a ``Mirror``: it follows that partition's log
from its start and applies the catalog records only, through the same ``machine.apply``, into
memory. Catalog records read catalog rows only (``machine/handlers/types.py``), so the
mirror's rows equal the owner's at every offset. A mirror that has not yet read up to the
log's end it saw at its start refuses reads for now (503, ``retry_after_ms``), never answers
from half a catalog.
Rule 3 (writes from anywhere): a node with the partition open submits through its processor;
another appends the record to that partition's log itself (a client record, epoch 0, as any
ingest) and answers once its mirror has applied it, with the reply the mirror's apply gave:
the owner's apply of the same offset gives the same.
A node reads its own writes; another node sees them once its mirror reads them (milliseconds:
the mirror follows the log).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, TypeAlias

from conveyor.errors import TransientError
from conveyor.schemas import codec
from conveyor.schemas.types import (
    DeleteSchemas,
    Record,
    RegisterSchema,
    RegisterTypes,
    SetCompatibility,
)
from conveyor.store.catalog import Catalog
from conveyor.store.memory import MemoryKV
from conveyor.store.tables import Tables
from conveyor.streams.clock import Clock
from conveyor.streams.log.api import Log
from conveyor.streams.machine import Reply, apply
from conveyor.streams.machine.outcome import Meta
from conveyor.streams.routing import partition_for_key

if TYPE_CHECKING:
    from conveyor.streams.node import Node

log = logging.getLogger("conveyor.registry")

CATALOG_RECORDS = (RegisterTypes, RegisterSchema, DeleteSchemas, SetCompatibility)
CATALOG_KINDS = frozenset(cls.__name__ for cls in CATALOG_RECORDS)
MIRROR_RETRY_MS = 500
MIRROR_WAIT_S = 10.0  # how long a request waits for a mirror to catch up before its 503
CatalogRecord: TypeAlias = RegisterTypes | RegisterSchema | DeleteSchemas | SetCompatibility


def registry_partition(tenant: str, partitions: int) -> int:
    return partition_for_key(tenant, "\x00registry\x00", partitions)


class Mirror:
    """One partition's catalog rows, applied from its log (rule 2)."""

    def __init__(self, log_: Log, partition: int, clock: Clock) -> None:
        self.log = log_
        self.partition = partition
        self.clock = clock
        self.kv = MemoryKV()
        self.applied = log_.start_offset(partition) - 1
        self.target = log_.end_offset(partition) - 1  # caught up once applied reaches it
        self.failed: BaseException | None = None
        self._replies: dict[int, list[Reply]] = {}
        self._progress = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._follow())

    async def _follow(self) -> None:
        try:
            async for batch in self.log.read(self.partition, self.applied + 1, follow=True):
                for item in batch:
                    self._apply(item.offset, item.data)
                self.applied = batch[-1].offset
                self._progress.set()
                self._progress = asyncio.Event()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            self.failed = exc
            log.exception("the catalog mirror of partition %d stopped", self.partition)
            self._progress.set()

    def _apply(self, offset: int, data: bytes) -> None:
        try:
            envelope = codec.decode_envelope(data)
            if codec.kind_of(envelope)[0] not in CATALOG_KINDS:
                return
            record = codec.decode_body(envelope)
        except codec.RecordDecodeError:
            return  # the owner quarantines it: it changed nothing there either
        tables = Tables(self.kv)
        meta = Meta(
            partition=self.partition,
            offset=offset,
            epoch=envelope.epoch,
            ts_ms=envelope.ts_ms,
            partitions=self.log.partitions,
        )
        outcome = apply(tables, record, meta)
        self.kv.write(tables.take_changes())
        self._replies[offset] = [a for a in outcome.actions if isinstance(a, Reply)]

    async def wait_caught_up(self, timeout_s: float) -> None:
        """Until it has read up to the log's end it saw at its start (or ``timeout_s``)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.applied < self.target and self.failed is None:
            left = deadline - loop.time()
            if left <= 0:
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._progress.wait(), left)

    def _check(self) -> None:
        if self.failed is not None:
            raise TransientError(
                f"the task types of partition {self.partition} cannot be read here "
                f"({self.failed!r}); try another node",
                retry_after_ms=MIRROR_RETRY_MS,
            )

    def reader(self) -> Tables:
        self._check()
        if self.applied < self.target:
            raise TransientError(
                f"this node is still reading the task types of partition {self.partition}; "
                "try again",
                retry_after_ms=MIRROR_RETRY_MS,
            )
        return Tables(self.kv)

    async def submit(self, record: Record, key: str) -> list[Reply]:
        self._check()
        data = codec.encode_record(record, epoch=0, ts_ms=self.clock.now_ms(), key=key)
        (offset,) = await self.log.append(self.partition, [data])
        while self.applied < offset:
            self._check()
            await self._progress.wait()
        return self._replies.pop(offset, [])

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


class LocalCatalogs:
    """The catalog of a registry with no node (unit tests, tools): one partition in memory,
    records applied at once through the same machine."""

    def __init__(self) -> None:
        self.kv = MemoryKV()
        self.offset = 0

    def read(self, tenant: str) -> Catalog:
        return Catalog(Tables(self.kv))

    def applied(self, tenant: str) -> int:
        return self.offset

    async def submit(self, tenant: str, record: CatalogRecord) -> Reply:
        return self.apply(record)

    async def ready(self, tenant: str) -> None:
        return None

    def apply(self, record: CatalogRecord) -> Reply:
        tables = Tables(self.kv)
        self.offset += 1
        meta = Meta(partition=0, offset=self.offset, epoch=0, ts_ms=0)
        outcome = apply(tables, record, meta)
        self.kv.write(tables.take_changes())
        (reply,) = [a for a in outcome.actions if isinstance(a, Reply)]
        return reply


class NodeCatalogs:
    """The catalogs of every tenant as a node sees them (rules 2 and 3)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self._mirrors: dict[int, Mirror] = {}
        self._partitions: dict[str, int] = {}  # a hash per read is most of a read's cost

    def partition(self, tenant: str) -> int:
        p = self._partitions.get(tenant)
        if p is None:
            p = self._partitions[tenant] = registry_partition(tenant, self.node.partitions)
        return p

    def read(self, tenant: str) -> Catalog:
        p = self.partition(tenant)
        try:
            return Catalog(self.node.serving(p).reader())
        except TransientError:
            return Catalog(self._mirror(p).reader())

    async def ready(self, tenant: str) -> None:
        """Wait (up to ``MIRROR_WAIT_S``) for a mirror still reading the tenant's partition,
        so that a request after a start or a hand-over waits a moment instead of a 503."""
        p = self.partition(tenant)
        try:
            self.node.serving(p)
        except TransientError:
            await self._mirror(p).wait_caught_up(MIRROR_WAIT_S)

    def applied(self, tenant: str) -> int:
        """The offset the tenant's catalog was read up to: while it stays, no catalog record
        was applied, and a reader's cache of decoded rows holds (``gateway/registry.py``)."""
        p = self.partition(tenant)
        try:
            return self.node.serving(p).applied
        except TransientError:
            mirror = self._mirror(p)
            mirror.reader()  # caught up, or the refusal
            return mirror.applied

    async def submit(self, tenant: str, record: CatalogRecord) -> Reply:
        p = self.partition(tenant)
        key = f"registry/{tenant}"
        try:
            processor = self.node.serving(p)
        except TransientError:
            replies = await self._mirror(p).submit(record, key)
        else:
            replies = await processor.submit(record, key)
        (reply,) = replies
        return reply

    def _mirror(self, p: int) -> Mirror:
        mirror = self._mirrors.get(p)
        if mirror is None or mirror.failed is not None:
            mirror = self._mirrors[p] = Mirror(self.node.log, p, self.node.clock)
        return mirror

    async def close(self) -> None:
        for mirror in self._mirrors.values():
            await mirror.close()
        self._mirrors.clear()


Catalogs: TypeAlias = LocalCatalogs | NodeCatalogs
