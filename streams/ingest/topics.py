"""Topics the stream surfaces create when they are missing (the ingest topic and its
quarantine, a tenant's task events topic), with the log's replication rule: factor 3 and
``min.insync.replicas`` 2 on a cluster of 3 or more brokers, 1 and 1 on a single broker."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import TopicAlreadyExistsError, for_code

METADATA_TRIES_MAX = 100


async def ensure(bootstrap: str, names: Sequence[str], partitions: int) -> None:
    """Create each topic of ``names`` that does not exist, with ``partitions`` partitions;
    return once every one of them shows its partitions. An existing topic is left as it is."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        existing = set(await admin.list_topics())
        missing = [name for name in names if name not in existing]
        if missing:
            rf = min(3, len((await admin.describe_cluster())["brokers"]))
            config = {"min.insync.replicas": "2" if rf >= 3 else "1"}
            new = [NewTopic(name, partitions, rf, None, config) for name in missing]
            response = await admin.create_topics(new)
            for entry in response.topic_errors:
                error = for_code(entry[1])
                if entry[1] != 0 and error is not TopicAlreadyExistsError:
                    raise error(f"creating topic {entry[0]}: {entry[2] if len(entry) > 2 else ''}")
        for name in names:
            await _wait_shown(admin, name)
    finally:
        await admin.close()


async def _wait_shown(admin: AIOKafkaAdminClient, name: str) -> None:
    for _ in range(METADATA_TRIES_MAX):
        described = await admin.describe_topics([name])
        if described and described[0]["error_code"] == 0 and described[0]["partitions"]:
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"Kafka topic {name} was created but its metadata never showed")
