"""What KafkaLog adds to the Log contract: fencing across instances through Kafka's producer
epochs, and group commit of the owner's appends into shared transactions."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from conveyor.streams.log.api import LogSealed
from conveyor.streams.log.kafka import KafkaLog
from conveyor.streams.log.kafka_broker import KafkaCluster

PARTITIONS = 2


def topic() -> str:
    return f"kafka-only-{uuid.uuid4().hex[:12]}"


async def read_committed(log: KafkaLog, partition: int) -> list[bytes]:
    return [r.data for batch in [b async for b in log.read(partition, 0)] for r in batch]


def test_a_second_instance_taking_over_a_partition_fences_the_first(
    kafka_cluster: KafkaCluster,
) -> None:
    name = topic()

    async def main() -> None:
        first = await KafkaLog.open(kafka_cluster.bootstrap, PARTITIONS, topic=name)
        second: KafkaLog | None = None
        try:
            await first.seal(0, 1)
            await first.append(0, [b"first owner"], epoch=1)
            second = await KafkaLog.open(kafka_cluster.bootstrap, PARTITIONS, topic=name)
            assert second.fence(0) == 1  # read back from the fences topic
            await second.seal(0, 2)
            assert first.fence(0) == 1  # the first does not know yet: the broker tells it
            with pytest.raises(LogSealed):
                await first.append(0, [b"zombie"], epoch=1)
            assert first.fence(0) == 2
            with pytest.raises(LogSealed):  # and now it refuses on its own, before sending
                await first.append(0, [b"zombie again"], epoch=1)
            await second.append(0, [b"second owner"], epoch=2)
            await first.append(0, [b"client"])  # client ingest is never fenced
            assert await read_committed(second, 0) == [b"first owner", b"second owner", b"client"]
            await first.append(1, [b"other partition"], epoch=1)  # p1 was never taken over
        finally:
            await first.close()
            if second is not None:
                await second.close()

    asyncio.run(main())


def test_concurrent_owner_appends_share_transactions(kafka_cluster: KafkaCluster) -> None:
    async def main() -> None:
        log = await KafkaLog.open(kafka_cluster.bootstrap, PARTITIONS, topic=topic())
        try:
            await log.seal(0, 1)
            appends = 60
            results = await asyncio.gather(
                *(log.append(0, [f"r{i}".encode()], epoch=1) for i in range(appends))
            )
            offsets = sorted(o for r in results for o in r)
            # each transaction ends with a commit marker: the gaps between records are the
            # markers of all transactions but the last
            transactions = offsets[-1] + 1 - appends + 1
            assert 1 <= transactions <= appends // 4
        finally:
            await log.close()

    asyncio.run(main())


def test_acknowledged_appends_survive_the_kill_of_one_of_three_brokers(
    kafka_three: KafkaCluster,
) -> None:
    name = topic()
    written: list[tuple[int, bytes]] = []

    async def append_some(tag: str) -> None:
        log = await KafkaLog.open(kafka_three.bootstrap, PARTITIONS, topic=name)
        try:
            await log.seal(0, log.fence(0) + 1)
            for i in range(5):
                data = [f"{tag}-{i}-{j}".encode() for j in range(3)]
                offsets = await log.append(0, data, epoch=log.fence(0))
                written.extend(zip(offsets, data, strict=True))
                client = f"{tag}-c{i}".encode()
                (offset,) = await log.append(0, [client])
                written.append((offset, client))
        finally:
            await log.close()

    async def read_back() -> list[tuple[int, bytes]]:
        log = await KafkaLog.open(kafka_three.bootstrap, PARTITIONS, topic=name)
        try:
            return [(r.offset, r.data) async for batch in log.read(0, 0) for r in batch]
        finally:
            await log.close()

    asyncio.run(append_some("all-up"))
    kafka_three.kill(1)  # 2 of 3 in sync: min.insync.replicas still met
    asyncio.run(asyncio.wait_for(append_some("one-down"), timeout=120))
    kafka_three.restart(1)
    kafka_three.kill(0)
    assert asyncio.run(asyncio.wait_for(read_back(), timeout=120)) == written


def test_an_unreachable_cluster_is_a_retryable_error() -> None:
    from conveyor.errors import TransientError
    from conveyor.streams.log.kafka_broker import free_port

    async def main() -> None:
        with pytest.raises(TransientError, match="connect to Kafka"):
            await KafkaLog.open(f"127.0.0.1:{free_port()}", PARTITIONS, topic=topic())

    asyncio.run(main())
