"""The ingest router: enqueues written to a Kafka topic by any producer, appended to the log
exactly once per (topic, partition, offset).

A record of the ingest topic (``streams/gateway/PROTOCOL.md``, "The ingest topic")::

    key      the idempotency key (UTF-8, at most 256 bytes); none: the router names the task
             ``ingest:<topic>:<partition>:<offset>``
    headers  conveyor-app: <app>   conveyor-task-type: <task type>   (UTF-8, both required)
    value    0x00 | schema id (4 bytes, big-endian) | Avro binary datum
             (Confluent's wire format, a version of the subject <app>.<task_type>-value)

The rules, and why:

1. The tenant is the topic's, never the record's. A router reads one topic with one client
   key, and the key's tenant is the tenant of everything it enqueues; a tenant gets a topic
   of its own (Kafka's ACLs say who may write it). Nothing in a record can name another
   tenant, so no producer can enqueue into one.
2. One enqueue path. The router enqueues through the node's HTTP API
   (``POST /v1/tasks:batch``, ``node_api.py``) with that key, as any client does: the type's
   defaults, its schema check, the tenant's quotas and a cluster's forwarding apply
   unchanged. It is its own process (``conveyor ingest``), not a part of ``conveyor node``:
   a flood or a poison topic costs the router's CPU and never the event loop that runs the
   partitions; it scales by starting more of them in one consumer group; it holds the client
   keys of the tenants it routes, and no node needs Kafka credentials for outside topics.
3. Exactly once per (topic, partition, offset). Every enqueue is keyed: by the record's key,
   or by its source coordinates when it has none. Offsets are committed only after the node
   acknowledged the batch (durable in the log and applied), inside a Kafka transaction that
   also produces the batch's quarantined records (``send_offsets_to_transaction``). A router
   killed anywhere in between re-reads from the last commit: an enqueue it re-sends meets
   its twin (same key, same task), and an open transaction is aborted when the router's
   transactional id starts again (its quarantined records, read with read_committed, were
   never seen), so they are produced once with the commit that follows. Two batches may
   be out at once (the node applies one while the next is sent), but a batch commits only
   after the one read before it: committed offsets only move forward, and everything below
   them was acknowledged.
4. A record the router cannot enqueue goes to the quarantine topic and the partition moves
   on: no value or not Confluent's wire format, a missing header, an unknown schema id, an
   id that is not a version of the type's subject (a datum of another type), a datum that
   does not decode, a key that is not UTF-8, or an item the node refuses (an unknown task
   type, a payload that does not fit, a key naming another task: the node's 4xx). It keeps
   its key, value and headers (a tombstone without a key gets its coordinates as key), plus
   ``conveyor-quarantine-code``, ``-reason`` and ``conveyor-source-topic``, ``-partition``,
   ``-offset``, so it can be fixed and produced again. A record whose reading fails in a way
   this module did not foresee is quarantined too (code ``router-error``, logged with its
   traceback): a poison record must not stop its partition, nor crash the router over and
   over at the same offset. What is the node's trouble and not the record's (unreachable,
   5xx, 429) is waited out, never quarantined; a key the node refuses stops the router
   (``KeyRefused``).
5. A partition is given up only between batches: the consumer's revocation waits for the
   batches in flight, so a router never commits a partition another router already reads.
   (A router stalled past the group's session timeout can still commit late; the enqueues
   stay exactly once by rule 3, and its quarantined records may appear twice, with the same
   source coordinates.)
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition
from aiokafka.structs import ConsumerRecord

from conveyor.streams.clock import Clock, SystemClock
from conveyor.streams.ingest import topics, wire
from conveyor.streams.ingest.node_api import KeyRefused, NodeApi, NotNow

log = logging.getLogger("conveyor.ingest")

APP_HEADER = "conveyor-app"
TYPE_HEADER = "conveyor-task-type"
KEY_BYTES_MAX = 256  # the gateway's limit of an idempotency key
BATCH_MAX = 1_000  # records per enqueue batch: the most the node takes in one
IN_FLIGHT_MAX = 2  # batches being enqueued at once; the node works on one while the other flies
POLL_MS = 500


@dataclass(frozen=True, slots=True, kw_only=True)
class Settings:
    bootstrap: str
    url: str
    key: str = field(repr=False)
    topic: str
    quarantine_topic: str = ""  # "": <topic>-quarantine
    group: str = ""  # "": conveyor-ingest-<topic>
    instance: str = "0"  # the transactional id's suffix: one per router of a group
    partitions: int = 4  # of a topic the router creates
    batch_max: int = BATCH_MAX
    in_flight_max: int = IN_FLIGHT_MAX

    @property
    def quarantine(self) -> str:
        return self.quarantine_topic or f"{self.topic}-quarantine"

    @property
    def group_id(self) -> str:
        return self.group or f"conveyor-ingest-{self.topic}"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a record is quarantined: a stable code and a sentence."""

    code: str
    reason: str


class Router:
    def __init__(self, settings: Settings, *, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.api = NodeApi(settings.url, settings.key)
        self.enqueued = 0  # records enqueued (a re-read twin counts again)
        self.quarantined = 0
        self._in_flight: deque[asyncio.Task[None]] = deque()  # routing batches, oldest first
        self._producer: AIOKafkaProducer | None = None
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        s = self.settings
        await self.api.start()
        await self.api.check_key()
        await topics.ensure(s.bootstrap, [s.topic, s.quarantine], s.partitions)
        # The producer first: starting its transactional id aborts what a killed router of
        # the same id left open, which would otherwise hold its offsets unstable (rule 3).
        self._producer = AIOKafkaProducer(
            bootstrap_servers=s.bootstrap,
            transactional_id=f"conveyor-ingest-{s.group_id}-{s.instance}",
            enable_idempotence=True,
            acks="all",
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            bootstrap_servers=s.bootstrap,
            group_id=s.group_id,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await self._consumer.start()
        self._consumer.subscribe([s.topic], listener=_WaitForBatches(self))

    async def stop(self) -> None:
        for part in (self._consumer, self._producer):
            if part is not None:
                await part.stop()
        await self.api.close()

    async def run(self) -> None:
        """Route batches until cancelled: up to ``in_flight_max`` at once, each committing
        after the one before it (rule 3)."""
        assert self._consumer is not None, "Router.start() first"
        in_flight = self._in_flight
        try:
            while True:
                fetched = await self._consumer.getmany(
                    timeout_ms=POLL_MS, max_records=self.settings.batch_max
                )
                records = [r for batch in fetched.values() for r in batch]
                if records:
                    while len(in_flight) >= self.settings.in_flight_max:
                        await in_flight.popleft()
                    before = in_flight[-1] if in_flight else None
                    in_flight.append(asyncio.create_task(self.route(records, after=before)))
                while in_flight and in_flight[0].done():
                    await in_flight.popleft()  # raises what its batch raised
        finally:
            for task in in_flight:
                task.cancel()
            await asyncio.gather(*in_flight, return_exceptions=True)
            in_flight.clear()

    async def drain(self) -> None:
        """Until every batch in flight has committed or failed (rule 5)."""
        await asyncio.gather(*list(self._in_flight), return_exceptions=True)

    async def route(
        self,
        records: list[ConsumerRecord[bytes, bytes]],
        *,
        after: asyncio.Task[None] | None = None,
    ) -> None:
        """Enqueue ``records``, quarantine those that cannot be, then commit them once the
        batch ``after`` has committed (rule 3)."""
        while True:
            try:
                refused = await self._enqueue(records)
                break
            except NotNow as exc:  # the node's trouble, not the records': wait it out
                log.warning("%s; the batch is sent again in %d ms", exc, exc.retry_after_ms)
                await self.clock.sleep_ms(exc.retry_after_ms)
        if after is not None:
            await after  # offsets only move forward: the batch read before commits first
        await self._commit(records, refused)
        self.quarantined += len(refused)
        self.enqueued += len(records) - len(refused)

    async def _enqueue(self, records: list[ConsumerRecord[bytes, bytes]]) -> dict[int, Refusal]:
        refused: dict[int, Refusal] = {}
        items: list[dict[str, Any]] = []
        at: list[int] = []  # the record of each item
        for i, record in enumerate(records):
            try:
                item = await self.item(record)
            except (NotNow, KeyRefused):
                raise
            except Exception as exc:  # rule 4: a poison record must not stop the partition
                log.exception("reading %s/%d@%d", record.topic, record.partition, record.offset)
                item = Refusal("router-error", f"the router failed reading it: {exc!r}")
            if isinstance(item, Refusal):
                refused[i] = item
            else:
                items.append(item)
                at.append(i)
        if items:
            for k, reason in (await self.api.enqueue(items)).items():
                refused[at[k]] = Refusal("refused", f"the node refused the enqueue: {reason}")
        return refused

    async def item(self, record: ConsumerRecord[bytes, bytes]) -> dict[str, Any] | Refusal:
        """The enqueue item of ``record``, or why there is none (rule 4)."""
        app, task_type = _header(record, APP_HEADER), _header(record, TYPE_HEADER)
        if app is None or task_type is None:
            missing = APP_HEADER if app is None else TYPE_HEADER
            return Refusal(
                "missing-header",
                f"the record has no {missing} header (UTF-8): name the task type's app in "
                f"{APP_HEADER} and the task type in {TYPE_HEADER}",
            )
        try:
            schema_id = wire.schema_id_of(record.value)
        except wire.WireError as exc:
            return Refusal("not-wire-format", str(exc))
        subject = await self.api.subject(app, task_type)
        if subject is None or schema_id not in subject.ids:  # a version registered since?
            subject = await self.api.subject(app, task_type, fresh=True)
        writer = await self.api.schema(schema_id)
        if writer is None:
            return Refusal(
                "unknown-schema-id",
                f"schema id {schema_id} is not in the tenant's registry: serialize with the "
                "registry the node serves at /registry, with the tenant's key",
            )
        if subject is None:
            return Refusal(
                "no-subject",
                f"task type {task_type!r} of app {app!r} has no payload schema (subject "
                f"{app}.{task_type}-value): its agents register one from the handler's "
                "annotation, or register it with conveyor schemas register",
            )
        if schema_id not in subject.ids:
            return Refusal(
                "wrong-subject",
                f"schema id {schema_id} is not a version of subject {app}.{task_type}-value "
                f"(its ids: {sorted(subject.ids)}): the datum is of another type; serialize "
                "it with the type's schema",
            )
        try:
            payload = wire.decode(record.value, writer, subject.latest)
        except wire.WireError as exc:
            return Refusal("bad-datum", str(exc))
        key = _key(record)
        if isinstance(key, Refusal):
            return key
        return {
            "app": app,
            "task_type": task_type,
            "payload": payload,
            "idempotency_key": key,
        }

    async def _commit(
        self, records: list[ConsumerRecord[bytes, bytes]], refused: dict[int, Refusal]
    ) -> None:
        assert self._producer is not None
        ends: dict[TopicPartition, int] = {}
        for record in records:
            tp = TopicPartition(record.topic, record.partition)
            ends[tp] = max(ends.get(tp, 0), record.offset + 1)
        async with self._producer.transaction():
            for i, refusal in refused.items():
                await self._quarantine(records[i], refusal)
            await self._producer.send_offsets_to_transaction(ends, self.settings.group_id)

    async def _quarantine(self, record: ConsumerRecord[bytes, bytes], refusal: Refusal) -> None:
        assert self._producer is not None
        log.info(
            "quarantined %s/%d@%d: %s",
            record.topic,
            record.partition,
            record.offset,
            refusal.code,
        )
        headers = [
            *(record.headers or ()),
            ("conveyor-quarantine-code", refusal.code.encode()),
            ("conveyor-quarantine-reason", refusal.reason.encode()),
            ("conveyor-source-topic", record.topic.encode()),
            ("conveyor-source-partition", str(record.partition).encode()),
            ("conveyor-source-offset", str(record.offset).encode()),
        ]
        key = record.key
        if key is None and record.value is None:  # Kafka takes no record without both
            key = f"{record.topic}:{record.partition}:{record.offset}".encode()
        await self._producer.send(
            self.settings.quarantine, value=record.value, key=key, headers=headers
        )


class _WaitForBatches(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, router: Router) -> None:
        self._router = router

    async def on_partitions_revoked(self, revoked: Iterable[TopicPartition]) -> None:
        await self._router.drain()  # the batches in flight commit before the partitions go

    async def on_partitions_assigned(self, assigned: Iterable[TopicPartition]) -> None:
        pass


def _header(record: ConsumerRecord[bytes, bytes], name: str) -> str | None:
    for key, value in record.headers or ():
        if key == name:
            try:
                text = bytes(value).decode()
            except UnicodeDecodeError:
                return None
            return text or None
    return None


def _key(record: ConsumerRecord[bytes, bytes]) -> str | Refusal:
    """The enqueue's idempotency key: the record's key, or its source coordinates (rule 3)."""
    if record.key is None:
        return f"ingest:{record.topic}:{record.partition}:{record.offset}"
    try:
        key = bytes(record.key).decode()
    except UnicodeDecodeError:
        return Refusal("bad-key", "the record's key is not UTF-8: it is the idempotency key")
    if not key or len(record.key) > KEY_BYTES_MAX:
        return Refusal(
            "bad-key",
            f"the record's key is {len(record.key)} bytes: an idempotency key is 1..256 bytes "
            "(send no key to have the record's coordinates as its key)",
        )
    return key
