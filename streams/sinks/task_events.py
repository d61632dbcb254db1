"""The public task events topics on Kafka: each tenant's task events as Avro records in
Confluent's wire format, keyed by task id, under a subject of the tenant's schema registry.

``<cluster>-events`` is the node's own stream: one record per processor batch, an
``EventBatch`` in Conveyor's column layout with a version byte in front
(``schemas/codec.py``), every tenant's events together. No outside consumer should read it.
The relay turns it into topics an outside consumer can::

    <cluster>-task-events.<tenant>    value: 0x00 | schema id | Avro TaskEvent   key: task id
    subject <topic>-value             TaskEvent.avsc, in the TENANT's registry (/registry)

so confluent-kafka's ``AvroDeserializer`` (or Faust, ``conveyor.faust``), pointed at
``<gateway>/registry`` with the tenant's client key, reads it.

The rules, and why:

1. Fed from the outbox, never a dual write. The processors write events to their outbox in
   the batch that changes state and ship them to ``<cluster>-events``
   (``processor/outbox.py``); the relay reads that topic and produces what it read. A task's
   events are in one partition of it, in order, and go to one partition of the tenant's
   topic (its key), in the same order.
2. Tenants never see each other's events: one topic per tenant, named after it (a
   character other than ``A-Z a-z 0-9 . -`` is written ``_xx``, its UTF-8 bytes in hex, so
   two tenants never share a name), and its subject is in that tenant's registry only. Give
   each tenant's principal read access to its own topic (a literal ACL); operators may read
   the prefix ``<cluster>-task-events.``.
3. At least once. The relay is a consumer group of the nodes that run it
   (``conveyor node --kafka ... --task-events``); it commits its offsets in
   ``<cluster>-events`` after every record it produced for them was acknowledged (acks=all),
   so a crash re-produces the events since the last commit, as the outbox itself may ship a
   batch twice. Consumers dedupe on (``task_id``, ``version``, ``kind``): ``version`` is the
   log offset that caused the event.
4. A batch the relay cannot decode (written by a newer Conveyor) stops the relay with the
   reason in the log, restarted from its committed offset: skipping it would lose events.
5. The events topic is not trimmed from under it. The owner of each partition of
   ``<cluster>-events`` trims it below what the nodes' readers need, and below the relay
   group's committed offset in that partition too (``cluster/events_trim.py``, rule 4): a
   relay that lags, or whose nodes are all stopped, resumes where it committed and misses
   nothing. Its hold ends when its offsets do: the broker deletes a group's offsets once it
   has had no member for ``offsets.retention.minutes`` (7 days unless configured), and
   ``kafka-consumer-groups.sh --delete --group <cluster>-task-events-relay`` deletes them
   when a cluster stops relaying for good. A relay that starts with no offsets reads the
   topic from its start (re-producing what is still there: consumers dedupe, rule 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import re
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from aiohttp import web
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from conveyor.schemas import codec
from conveyor.schemas.types import TaskEvent
from conveyor.streams.clock import Clock, SystemClock
from conveyor.streams.ingest import topics, wire

log = logging.getLogger("conveyor.task_events")

SCHEMA = resources.files("conveyor.schemas").joinpath("events/TaskEvent.avsc").read_text()
POLL_MS = 500
BATCHES_MAX = 64  # events-stream records per commit
_PLAIN = re.compile(r"[A-Za-z0-9.\-]")

# (tenant, subject, schema text) -> the schema's id in the tenant's registry
Register = Callable[[str, str, str], Awaitable[int]]


def group_of(cluster: str) -> str:
    """The relay's consumer group: its committed offsets are its position (rule 5)."""
    return f"{cluster}-task-events-relay"


def topic_of(cluster: str, tenant: str) -> str:
    """The tenant's task events topic (rule 2)."""
    name = "".join(
        c if _PLAIN.fullmatch(c) else "".join(f"_{b:02x}" for b in c.encode()) for c in tenant
    )
    return f"{cluster}-task-events.{name}"


def as_datum(event: TaskEvent) -> dict[str, Any]:
    """The event as a datum of ``TaskEvent.avsc``."""
    datum = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
    datum["kind"] = event.kind.value
    return datum


class TaskEventsRelay:
    def __init__(self, bootstrap: str, cluster: str, partitions: int, register: Register) -> None:
        self.bootstrap = bootstrap
        self.cluster = cluster
        self.source = f"{cluster}-events"
        self.partitions = partitions  # of each tenant's topic it creates: as the source's
        self._register = register
        self._ids: dict[str, int] = {}  # by tenant: the subject's schema id
        self.relayed = 0
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None

    async def start(self) -> None:
        self._producer = AIOKafkaProducer(
            bootstrap_servers=self.bootstrap, acks="all", enable_idempotence=True, linger_ms=5
        )
        await self._producer.start()
        self._consumer = AIOKafkaConsumer(
            self.source,
            bootstrap_servers=self.bootstrap,
            group_id=group_of(self.cluster),
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
        )
        await self._consumer.start()

    async def stop(self) -> None:
        for part in (self._consumer, self._producer):
            if part is not None:
                await part.stop()
        self._consumer = self._producer = None

    async def run(self) -> None:
        """Relay until cancelled (rule 3)."""
        assert self._consumer is not None, "TaskEventsRelay.start() first"
        while True:
            fetched = await self._consumer.getmany(timeout_ms=POLL_MS, max_records=BATCHES_MAX)
            if not fetched:
                continue
            sent = []
            ends: dict[TopicPartition, int] = {}
            for tp, messages in fetched.items():
                for message in messages:
                    batch = codec.EVENT_BATCH.decode(message.value)
                    for event in batch.events:
                        sent.append(await self._send(event))
                    ends[tp] = message.offset + 1
            await asyncio.gather(*sent)  # every one acknowledged before the commit
            await self._consumer.commit(ends)
            self.relayed += len(sent)

    async def _send(self, event: TaskEvent) -> asyncio.Future[Any]:
        assert self._producer is not None
        schema_id = self._ids.get(event.tenant)
        topic = topic_of(self.cluster, event.tenant)
        if schema_id is None:
            await topics.ensure(self.bootstrap, [topic], self.partitions)
            schema_id = await self._register(event.tenant, f"{topic}-value", SCHEMA)
            self._ids[event.tenant] = schema_id
            log.info(
                "tenant %r's task events go to %s (schema id %d)", event.tenant, topic, schema_id
            )
        value = wire.frame(schema_id, wire.encode(SCHEMA, as_datum(event)))
        future: asyncio.Future[Any] = await self._producer.send(
            topic, value, key=event.task_id.encode()
        )
        return future


RESTART_MS = 2_000  # after a failed run (Kafka away, a batch it cannot read): rule 4


def attach(
    app: web.Application,
    bootstrap: str,
    cluster: str,
    partitions: int,
    *,
    clock: Clock | None = None,
) -> None:
    """Run the relay while ``app`` (a node's gateway) serves; subjects are registered in
    each tenant's registry through the gateway's catalogs."""
    from conveyor.streams.gateway.routes import GATEWAY
    from conveyor.streams.registry.service import SchemaRegistry

    async def register(tenant: str, subject: str, text: str) -> int:
        gateway = app[GATEWAY]
        await gateway.registry.ready(tenant)
        return await SchemaRegistry(gateway.registry.catalogs).register(tenant, subject, text)

    relay = TaskEventsRelay(bootstrap, cluster, partitions, register)
    clock = clock or SystemClock()
    runner: list[asyncio.Task[None]] = []

    async def supervise() -> None:
        while True:
            try:
                await relay.start()
                await relay.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("task events: the relay failed; restarting from its commit")
            finally:
                await relay.stop()
            await clock.sleep_ms(RESTART_MS)

    async def start(_: web.Application) -> None:
        runner.append(asyncio.create_task(supervise()))

    async def stop(_: web.Application) -> None:
        for task in runner:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
