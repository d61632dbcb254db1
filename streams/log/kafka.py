"""KafkaLog: the Log on an Apache Kafka cluster -- one topic of P partitions, read_committed.

Layout on the cluster::

    <topic>            P partitions, the records (replication factor 3 and min.insync.replicas
                       2 on a cluster of 3 or more brokers, 1 and 1 on a single broker)
    <topic>-fences     1 partition, compacted: key b"<partition>", value b"<epoch>"

Offsets are Kafka's, and Kafka's are not dense: a transaction's commit marker takes an offset
of its own. With three epoched appends of one record each::

    offset   0     1        2     3        4     5
           | e1 | commit | e3 | commit | e4 | commit |      reads see 0, 2, 4
                                                  end_offset = 5 (one past the last record)

Dense offsets are not worth mapping. Nothing above the log computes with them: the processor
keeps "applied through offset N" and reads on from N + 1 (a gap there is simply skipped), task
versions and event sequence numbers need offsets that only grow, ids minted from (partition,
offset) need offsets that never repeat. A mapping would have to be stored and recovered beside
the topic for every record. So the Log protocol says "strictly increasing, gaps allowed", and
``end_offset`` stays exact for the lag arithmetic (``end_offset - applied - 1``): it is one past
the last record this log knows of, not the partition's last stable offset (which counts the
final commit marker).

The rules, and why:

1. Durable before acknowledged: every producer runs with ``acks=all`` and idempotence, so an
   acknowledged record is on min.insync.replicas brokers and a retried send is never doubled.
2. Appends with an epoch are the partition owner's. They go through a transactional producer
   whose ``transactional.id`` belongs to the partition (``conveyor-<topic>-p<N>``), one
   transaction per group: appends that arrive while a transaction is in flight wait and share
   the next one (group commit; a transaction costs a few round trips, a record almost nothing).
   Appends without an epoch (client ingest) are never fenced: they go through one shared
   idempotent producer, whose own batching groups concurrent sends.
3. Kafka does not compare our epochs, so the fence is ours: ``seal`` raises the in-memory fence
   at once, waits for the partition's transaction in flight, persists the fence in
   ``<topic>-fences`` and then re-creates the partition's transactional producer. Its
   InitProducerId bumps Kafka's producer epoch for the transactional id, so the broker refuses
   every later send of the previous owner -- in another process too -- with ProducerFenced,
   which is ``LogSealed`` here, and its open transaction is aborted (read_committed readers
   never see it). The fences topic is what a log opened later (a restart, a new owner) reads
   to know the epoch to beat; a separate compacted topic keeps it out of the records' offsets.
   A producer created lazily (an epoched append before any seal) first re-reads the fences,
   so a stale owner coming back does not fence the current one.
4. Reads are ``read_committed`` with manual assignment (no consumer group): aborted and open
   transactions are never seen. ``follow=True`` long-polls the broker at the tail.
5. Every aiokafka error is translated here: a fenced producer is ``LogSealed``, a read below
   the log start is ``LogTrimmed``, anything else (broker unreachable, timeouts, not enough
   in-sync replicas) is ``LogUnavailable``, retryable. A failed transaction drops its producer;
   the next append creates a new one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic, RecordsToDelete
from aiokafka.errors import (
    InvalidProducerEpoch,
    KafkaError,
    LeaderNotAvailableError,
    NodeNotReadyError,
    NotControllerError,
    NotLeaderForPartitionError,
    OffsetOutOfRangeError,
    ProducerFenced,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
    for_code,
)

from conveyor.errors import ContractError, InvariantError
from conveyor.streams.log.api import LogRecord, LogSealed, LogTrimmed, LogUnavailable

log = logging.getLogger(__name__)

T = TypeVar("T")
FENCED = (ProducerFenced, InvalidProducerEpoch)
# The cluster answered but is changing (a broker died and is still in the metadata, a new
# controller or leader is being chosen): opening tries again; an unreachable one fails at once.
CLUSTER_CHANGING = (
    TimeoutError,
    NodeNotReadyError,
    NotControllerError,
    LeaderNotAvailableError,
    NotLeaderForPartitionError,
    UnknownTopicOrPartitionError,
)
POLL_MS = 500  # a follow read's long poll; the broker answers as soon as a record is there
REQUEST_TIMEOUT_MS = 15_000
METADATA_TRIES_MAX = 100
OPEN_TRIES_MAX = 30
OPEN_RETRY_S = 1.0
TAIL_SCAN_RECORDS = 64  # how far back open() looks for the last record behind commit markers


def transactional_id(topic: str, partition: int) -> str:
    return f"conveyor-{topic}-p{partition}"


async def _translated(what: str, call: Awaitable[T]) -> T:
    """Await ``call``; a Kafka error becomes ours (rule 5)."""
    try:
        return await call
    except FENCED as exc:
        raise LogSealed(f"{what}: a newer owner took the partition over ({exc})") from exc
    except OffsetOutOfRangeError as exc:
        raise LogTrimmed(f"{what}: the offset was trimmed ({exc})") from exc
    except (KafkaError, TimeoutError) as exc:  # aiokafka's admin times out with TimeoutError
        raise LogUnavailable(f"{what}: Kafka did not answer ({exc!r}); try again") from exc


@dataclass(slots=True)
class _Pending:
    records: Sequence[bytes]
    epoch: int
    done: asyncio.Future[list[int]]


class _Fences:
    """The persisted fences (rule 3): ``<topic>-fences``, read whole, last value per key."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.topic = f"{topic}-fences"
        self._bootstrap = bootstrap
        self._producer = AIOKafkaProducer(
            bootstrap_servers=bootstrap, acks="all", enable_idempotence=True
        )
        self.epochs: dict[int, int] = {}

    async def start(self) -> None:
        await self._producer.start()
        await self.refresh()

    async def refresh(self) -> None:
        consumer = _consumer(self._bootstrap)
        tp = TopicPartition(self.topic, 0)
        await consumer.start()
        try:
            consumer.assign([tp])
            end = (await consumer.end_offsets([tp]))[tp]
            await consumer.seek_to_beginning(tp)
            while await consumer.position(tp) < end:
                for message in (await consumer.getmany(tp, timeout_ms=POLL_MS)).get(tp, []):
                    p, epoch = int(message.key), int(message.value)
                    self.epochs[p] = max(self.epochs.get(p, 0), epoch)
        finally:
            await consumer.stop()

    async def persist(self, partition: int, epoch: int) -> None:
        key, value = str(partition).encode(), str(epoch).encode()
        await self._producer.send_and_wait(self.topic, value, key=key, partition=0)

    async def stop(self) -> None:
        await self._producer.stop()


def _consumer(bootstrap: str) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        bootstrap_servers=bootstrap,
        isolation_level="read_committed",
        enable_auto_commit=False,
        group_id=None,
        auto_offset_reset="none",
        request_timeout_ms=REQUEST_TIMEOUT_MS,
    )


class _Owner:
    """The epoched appends of one partition: its transactional producer and group commit."""

    def __init__(self, log_: KafkaLog, partition: int) -> None:
        self._log = log_
        self._partition = partition
        self._queue: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()  # held by a transaction in flight, and by seal
        self._producer: AIOKafkaProducer | None = None

    async def append(self, records: Sequence[bytes], epoch: int) -> list[int]:
        done: asyncio.Future[list[int]] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(records, epoch, done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.create_task(self._flush_all())
        return await done

    async def _flush_all(self) -> None:
        while self._queue:
            async with self.lock:
                group, self._queue = self._queue, []
                await self._flush(group)

    async def _flush(self, group: list[_Pending]) -> None:
        live = []
        for pending in group:  # checked again as the group is taken (the fence may have risen)
            sealed = self._log.sealed_error(self._partition, pending.epoch)
            if sealed is not None:
                pending.done.set_exception(sealed)
            else:
                live.append(pending)
        if not live:
            return
        try:
            offsets = await self._transaction([r for p in live for r in p.records], live)
        except BaseException as exc:
            await self.drop_producer()
            if isinstance(exc, LogSealed):  # learn the fence before the appenders hear of it
                await self._log.refresh_fences_quietly()
            for pending in live:
                if not pending.done.done():
                    pending.done.set_exception(exc)
            return
        for pending in live:
            mine, offsets = offsets[: len(pending.records)], offsets[len(pending.records) :]
            if not pending.done.done():
                pending.done.set_result(mine)

    async def _transaction(self, records: list[bytes], live: list[_Pending]) -> list[int]:
        what = f"append to partition {self._partition}"
        producer = await self._producer_for(max(p.epoch for p in live))
        return await _translated(what, self._send_in_transaction(producer, records))

    async def _send_in_transaction(
        self, producer: AIOKafkaProducer, records: list[bytes]
    ) -> list[int]:
        async with producer.transaction():
            sent = [await self._log.send(producer, self._partition, data) for data in records]
            metadata = await asyncio.gather(*sent)
        offsets = [int(m.offset) for m in metadata]
        self._log.note_end(self._partition, offsets[-1] + 1)
        return offsets

    async def _producer_for(self, epoch: int) -> AIOKafkaProducer:
        if self._producer is None:
            await self._log.refresh_fences()  # rule 3: a stale owner must not fence the new one
            sealed = self._log.sealed_error(self._partition, epoch)
            if sealed is not None:
                raise sealed
            await self.start_producer()
        if self._producer is None:
            raise InvariantError(f"partition {self._partition}: the producer did not start")
        return self._producer

    async def start_producer(self) -> None:
        """Create the transactional producer; its InitProducerId fences any previous one."""
        await self.drop_producer()
        producer = AIOKafkaProducer(
            bootstrap_servers=self._log.bootstrap,
            transactional_id=transactional_id(self._log.topic, self._partition),
            enable_idempotence=True,
            acks="all",
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )
        try:
            await _translated(f"take over partition {self._partition}", producer.start())
        except BaseException:
            await producer.stop()
            raise
        self._producer = producer

    async def drop_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                await producer.stop()
            except KafkaError as exc:  # a fenced producer may fail to end its transaction
                log.debug("stopping the producer of partition %d: %r", self._partition, exc)

    async def close(self) -> None:
        if self._flusher is not None:
            self._flusher.cancel()
        for pending in self._queue:
            pending.done.cancel()
        await self.drop_producer()


class KafkaLog:
    """The Log protocol (``conveyor.streams.log.api``) on Kafka; open it with ``open``."""

    def __init__(self, bootstrap: str, topic: str, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self._partitions = partitions
        self._admin = AIOKafkaAdminClient(
            bootstrap_servers=bootstrap, request_timeout_ms=REQUEST_TIMEOUT_MS
        )
        self._plain = AIOKafkaProducer(
            bootstrap_servers=bootstrap,
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=REQUEST_TIMEOUT_MS,
        )
        self._fences = _Fences(bootstrap, topic)
        self._fence = [0] * partitions
        self._start = [0] * partitions
        self._end = [0] * partitions
        self._owners = [_Owner(self, p) for p in range(partitions)]
        self._ingest_locks = [asyncio.Lock() for _ in range(partitions)]
        self._readers: set[AIOKafkaConsumer] = set()

    @classmethod
    async def open(
        cls,
        bootstrap: str,
        partitions: int,
        *,
        topic: str = "conveyor",
        replication_factor: int | None = None,
    ) -> KafkaLog:
        """Connect, create the topics if missing, load fences and offsets. Raises
        ``LogUnavailable`` when the cluster cannot be reached."""
        for attempt in range(1, OPEN_TRIES_MAX + 1):
            self = cls(bootstrap, topic, partitions)
            try:
                await _translated(
                    f"connect to Kafka at {bootstrap}", self._connect(replication_factor)
                )
                return self
            except LogUnavailable as exc:
                await self.close()
                if attempt == OPEN_TRIES_MAX or not isinstance(exc.__cause__, CLUSTER_CHANGING):
                    raise
                log.info("opening the Kafka log, try %d: %s", attempt, exc)
                await asyncio.sleep(OPEN_RETRY_S)  # a dead broker is still in the metadata
            except BaseException:
                await self.close()
                raise
        raise AssertionError("unreachable")

    async def _connect(self, replication_factor: int | None) -> None:
        await self._admin.start()
        brokers = len((await self._admin.describe_cluster())["brokers"])
        rf = replication_factor or min(3, brokers)
        await self._ensure_topic(self.topic, self._partitions, rf, {})
        await self._ensure_topic(self._fences.topic, 1, rf, {"cleanup.policy": "compact"})
        await self._plain.start()
        await self._fences.start()
        self._load_fences()
        await self._load_offsets()

    async def _ensure_topic(
        self, name: str, partitions: int, rf: int, config: dict[str, str]
    ) -> None:
        if name not in await self._admin.list_topics():  # creating asks the controller
            await self._create_topic(name, partitions, rf, config)
        found = await self._partition_count(name)
        if found != partitions:
            raise ContractError(
                f"Kafka topic {name} has {found} partitions, this log was opened with "
                f"{partitions}: open it with {found}, or use another topic"
            )

    async def _create_topic(
        self, name: str, partitions: int, rf: int, config: dict[str, str]
    ) -> None:
        config = {"min.insync.replicas": "2" if rf >= 3 else "1", **config}
        response = await self._admin.create_topics([NewTopic(name, partitions, rf, None, config)])
        for entry in response.topic_errors:
            error = for_code(entry[1])
            if entry[1] != 0 and error is not TopicAlreadyExistsError:
                raise error(f"creating topic {name}: {entry[2] if len(entry) > 2 else ''}")

    async def _partition_count(self, name: str) -> int:
        """The topic's partitions, once its metadata reached the broker that answers (a topic
        just created may show none for a moment)."""
        for _ in range(METADATA_TRIES_MAX):
            described = await self._admin.describe_topics([name])
            if described and described[0]["error_code"] == 0 and described[0]["partitions"]:
                return len(described[0]["partitions"])
            await asyncio.sleep(0.05)
        raise LogUnavailable(f"Kafka topic {name} was created but its metadata never showed")

    def _load_fences(self) -> None:
        for p, epoch in self._fences.epochs.items():
            if p < self._partitions:
                self._fence[p] = max(self._fence[p], epoch)

    async def _load_offsets(self) -> None:
        consumer = _consumer(self.bootstrap)
        await consumer.start()
        try:
            tps = [TopicPartition(self.topic, p) for p in range(self._partitions)]
            consumer.assign(tps)
            starts = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
            for tp in tps:
                self._start[tp.partition] = starts[tp]
                self._end[tp.partition] = await _last_record_end(consumer, tp, starts[tp], ends[tp])
        finally:
            await consumer.stop()

    # -- the protocol ---------------------------------------------------------------------

    @property
    def partitions(self) -> int:
        return self._partitions

    @property
    def ends_known(self) -> bool:
        return False  # other nodes append to the partitions they lead

    async def append(
        self, partition: int, records: Sequence[bytes], epoch: int | None = None
    ) -> list[int]:
        if epoch is not None:
            sealed = self.sealed_error(partition, epoch)
            if sealed is not None:
                raise sealed
        if not records:
            return []
        if epoch is not None:
            return await self._owners[partition].append(records, epoch)
        what = f"append to partition {partition}"
        return await _translated(what, self._ingest(partition, records))

    async def _ingest(self, partition: int, records: Sequence[bytes]) -> list[int]:
        async with self._ingest_locks[partition]:  # one append's records stay together
            sent = [await self.send(self._plain, partition, data) for data in records]
        offsets = [int(m.offset) for m in await asyncio.gather(*sent)]
        self.note_end(partition, offsets[-1] + 1)
        return offsets

    async def send(
        self, producer: AIOKafkaProducer, partition: int, data: bytes
    ) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = await producer.send(self.topic, data, partition=partition)
        return future

    async def read(
        self, partition: int, from_offset: int, *, follow: bool = False, max_batch: int = 1024
    ) -> AsyncIterator[list[LogRecord]]:
        consumer = _consumer(self.bootstrap)
        tp = TopicPartition(self.topic, partition)
        self._readers.add(consumer)
        try:
            await _translated(f"read partition {partition}", consumer.start())
            consumer.assign([tp])
            start = (await _translated("read", consumer.beginning_offsets([tp])))[tp]
            if from_offset < start:
                raise LogTrimmed(
                    f"offset {from_offset} of partition {partition} was trimmed; "
                    f"the log starts at {start}"
                )
            end = (await _translated("read", consumer.end_offsets([tp])))[tp]
            consumer.seek(tp, from_offset)
            poll = _poller(consumer, tp, max_batch)
            while follow or await consumer.position(tp) < end:
                batch = await _translated(f"read partition {partition}", poll())
                if batch:
                    self.note_end(partition, batch[-1].offset + 1)
                    yield batch
        finally:
            self._readers.discard(consumer)
            await consumer.stop()

    async def seal(self, partition: int, epoch: int) -> None:
        """Rule 3: fence in memory, persist, then re-create the transactional producer."""
        self._fence[partition] = max(self._fence[partition], epoch)
        owner = self._owners[partition]
        async with owner.lock:
            what = f"seal partition {partition}"
            await _translated(what, self._fences.persist(partition, self._fence[partition]))
            await owner.start_producer()

    async def trim(self, partition: int, up_to: int) -> None:
        tp = TopicPartition(self.topic, partition)
        up_to = min(up_to, await self._high_watermark(tp))
        if up_to <= self._start[partition]:
            return
        what = f"trim partition {partition}"
        await _translated(what, self._admin.delete_records({tp: RecordsToDelete(up_to)}))
        self._start[partition] = up_to
        self._end[partition] = max(self._end[partition], up_to)

    async def offset_for_time(self, partition: int, ts_ms: int) -> int:
        """The first offset of ``partition`` written at ``ts_ms`` or later (the broker's
        record timestamps: the producer's clock); the high watermark if none is."""
        tp = TopicPartition(self.topic, partition)
        consumer = _consumer(self.bootstrap)
        await _translated("find an offset by time", consumer.start())
        try:
            found = await _translated(
                "find an offset by time", consumer.offsets_for_times({tp: max(0, ts_ms)})
            )
        finally:
            await consumer.stop()
        at = found.get(tp)
        return int(at.offset) if at is not None else await self._high_watermark(tp)

    async def committed(self, group: str) -> dict[int, int]:
        """The offsets consumer group ``group`` committed in this topic, by partition; a
        partition where it committed none (or whose offset the broker expired) is left out."""
        tps = [TopicPartition(self.topic, p) for p in range(self._partitions)]
        what = f"read the offsets of consumer group {group}"
        found = await _translated(what, self._admin.list_consumer_group_offsets(group, None, tps))
        if set(found) != set(tps):
            # Asked by partition, the broker names each one; it names none when it failed
            # for the whole group (its coordinator moving or loading), and that is no answer.
            raise LogUnavailable(f"{what}: the broker answered for no partition; try again")
        return {tp.partition: int(at.offset) for tp, at in found.items() if at.offset >= 0}

    async def _high_watermark(self, tp: TopicPartition) -> int:
        consumer = _consumer(self.bootstrap)
        await _translated("trim", consumer.start())
        try:
            ends = await _translated("trim", consumer.end_offsets([tp]))
            return int(ends[tp])
        finally:
            await consumer.stop()

    def end_offset(self, partition: int) -> int:
        """One past the last record this log appended, read or found at open."""
        return self._end[partition]

    def start_offset(self, partition: int) -> int:
        """The log start as this log last saw it (at open, or its own trim)."""
        return self._start[partition]

    async def refresh_start_offset(self, partition: int) -> int:
        """The log start as the broker has it now: another node may have trimmed."""
        tp = TopicPartition(self.topic, partition)
        consumer = _consumer(self.bootstrap)
        await _translated("read the log start", consumer.start())
        try:
            starts = await _translated("read the log start", consumer.beginning_offsets([tp]))
        finally:
            await consumer.stop()
        self._start[partition] = max(self._start[partition], int(starts[tp]))
        return self._start[partition]

    def fence(self, partition: int) -> int:
        return self._fence[partition]

    async def close(self) -> None:
        for owner in self._owners:
            await owner.close()
        for reader in list(self._readers):
            await reader.stop()
        await self._fences.stop()
        await self._plain.stop()
        await self._admin.close()

    # -- for the partition owners ---------------------------------------------------------

    def sealed_error(self, partition: int, epoch: int) -> LogSealed | None:
        if epoch >= self._fence[partition]:
            return None
        return LogSealed(
            f"partition {partition} is sealed at epoch {self._fence[partition]}; "
            f"append carried epoch {epoch}"
        )

    async def refresh_fences(self) -> None:
        await _translated("read the fences", self._fences.refresh())
        self._load_fences()

    async def refresh_fences_quietly(self) -> None:
        try:
            await self.refresh_fences()
        except LogUnavailable as exc:  # the fence stays as it was; the broker still refuses
            log.warning("could not re-read the fences of %s: %s", self.topic, exc)

    def note_end(self, partition: int, end: int) -> None:
        self._end[partition] = max(self._end[partition], end)


def _poller(
    consumer: AIOKafkaConsumer, tp: TopicPartition, max_batch: int
) -> Callable[[], Awaitable[list[LogRecord]]]:
    async def poll() -> list[LogRecord]:
        got = await consumer.getmany(tp, timeout_ms=POLL_MS, max_records=max_batch)
        return [LogRecord(int(m.offset), bytes(m.value or b"")) for m in got.get(tp, [])]

    return poll


async def _last_record_end(
    consumer: AIOKafkaConsumer, tp: TopicPartition, start: int, end: int
) -> int:
    """One past the last committed record below ``end`` (skipping commit markers); ``end``
    itself when none is found in the last ``TAIL_SCAN_RECORDS`` offsets (a long abort)."""
    first = max(start, end - TAIL_SCAN_RECORDS)
    if first >= end:
        return end
    consumer.seek(tp, first)
    last: int | None = None
    while await consumer.position(tp) < end:
        got = await consumer.getmany(tp, timeout_ms=POLL_MS)
        for message in got.get(tp, []):
            last = int(message.offset)
    return end if last is None else last + 1
