"""Who leads what: every node's card in the compacted topic ``<cluster>-nodes``, keyed by node id.

    key b"n1"  value {"node_id": "n1", "url": "http://127.0.0.1:7401", "ts_ms": ...,
                      "leading": {"0": {"epoch": 3145729, "lag_records": 0}, ...},
                      "mac": "<HMAC-SHA256 of the rest, keyed by the cluster's secret>"}

A node publishes its card every ``PUBLISH_S`` and a tombstone when it leaves. A node killed
leaves its last card behind; the partitions on it are led by others at higher epochs by then,
so the owner of a partition is the card that lists it at the highest epoch (and a card's age
says how stale it is). Readers (``conveyor cluster status``) read the topic whole; a running
node follows it (``Directory``): its gateway forwards what it does not lead to the owner
(``gateway/forward.py``) and tells agents which nodes to poll (``nodes``). A card whose
``mac`` does not check is not believed (``signing.py``): it names no owner and no URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError, TopicAlreadyExistsError

from conveyor.streams.cluster.signing import sign, verified

log = logging.getLogger("conveyor.cluster")

PUBLISH_S = 1.0
READ_POLL_MS = 200

Card = dict[str, Any]


def topic_of(cluster: str) -> str:
    return f"{cluster}-nodes"


async def ensure_topic(bootstrap: str, cluster: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        if topic_of(cluster) in await admin.list_topics():
            return
        brokers = len((await admin.describe_cluster())["brokers"])
        rf = min(3, brokers)
        config = {"cleanup.policy": "compact", "min.insync.replicas": "2" if rf >= 3 else "1"}
        with contextlib.suppress(TopicAlreadyExistsError):
            await admin.create_topics([NewTopic(topic_of(cluster), 1, rf, None, config)])
    finally:
        await admin.close()


async def read_cards(
    bootstrap: str, cluster: str, key: bytes | None
) -> tuple[dict[str, Card], list[str]]:
    """Every node's last card, by node id (the nodes that left are not there), and the node
    ids under which only refused cards were found. With ``key`` (``ClusterSecret.card_key``)
    a card must be signed with it; without, every card is taken unchecked."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    tp = TopicPartition(topic_of(cluster), 0)
    cards: dict[str, Card] = {}
    refused: set[str] = set()
    await consumer.start()
    try:
        consumer.assign([tp])
        end = (await consumer.end_offsets([tp]))[tp]
        # An explicit seek: after seek_to_beginning, position() may answer the end first.
        consumer.seek(tp, (await consumer.beginning_offsets([tp]))[tp])
        while await consumer.position(tp) < end:
            for message in (await consumer.getmany(tp, timeout_ms=READ_POLL_MS)).get(tp, []):
                if not _note(cards, message.key, message.value, key):
                    refused.add((message.key or b"").decode(errors="replace"))
    finally:
        await consumer.stop()
    return cards, sorted(refused - set(cards))


def _note(
    cards: dict[str, Card], key: bytes | None, value: bytes | None, mac_key: bytes | None
) -> bool:
    """Take one message of the topic into ``cards``; False: a card refused (``signing.py``
    rule 3), ``cards`` unchanged."""
    if key is None:
        return True
    node_id = key.decode(errors="replace")
    if value is None:
        cards.pop(node_id, None)
        return True
    if mac_key is None:
        cards[node_id] = json.loads(value)
        return True
    card = verified(node_id, value, mac_key)
    if card is None:
        return False
    cards[node_id] = card
    return True


def owners(cards: dict[str, Card]) -> dict[int, Card]:
    """Partition -> the card that lists it at the highest epoch."""
    best: dict[int, tuple[int, Card]] = {}
    for card in cards.values():
        for p, info in card.get("leading", {}).items():
            epoch = int(info["epoch"])
            if int(p) not in best or epoch > best[int(p)][0]:
                best[int(p)] = (epoch, card)
    return {p: card for p, (_, card) in best.items()}


class Directory:
    """Publishes this node's card and follows everyone's (``owners``)."""

    def __init__(self, bootstrap: str, cluster: str, card: Callable[[], Card], key: bytes) -> None:
        self._bootstrap = bootstrap
        self._key = key  # signs this node's card, checks everyone's (``signing.py``)
        self._refused: set[str] = set()  # keys a refused card came under, warned about once
        self._topic = topic_of(cluster)
        self._cluster = cluster
        self._card = card
        self._producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
        self.cards: dict[str, Card] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._news = asyncio.Event()  # set and replaced each time cards arrive

    async def start(self) -> None:
        await ensure_topic(self._bootstrap, self._cluster)
        await self._producer.start()
        await self.publish()
        self._tasks = [
            asyncio.create_task(self._publish_loop()),
            asyncio.create_task(self._follow()),
        ]

    def owner_url(self, partition: int) -> str | None:
        card = owners(self.cards).get(partition)
        return None if card is None else str(card["url"])

    def nodes(self) -> list[dict[str, Any]]:
        """The nodes that own partitions now (a dead node's last card owns none once its
        partitions are led elsewhere), by node id."""
        led: dict[str, list[int]] = {}
        for p, card in owners(self.cards).items():
            led.setdefault(str(card["node_id"]), []).append(p)
        return [
            {"node_id": n, "url": str(self.cards[n]["url"]), "partitions": sorted(ps)}
            for n, ps in sorted(led.items())
            if n in self.cards
        ]

    async def wait_owner_changed(self, partition: int, url: str | None, timeout_s: float) -> None:
        """Until the owner of ``partition`` is not ``url``, or ``timeout_s`` passed."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.owner_url(partition) == url and (left := deadline - loop.time()) > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._news.wait(), left)

    async def publish(self) -> None:
        card = {**self._card(), "ts_ms": int(time.time() * 1000)}
        key = str(card["node_id"]).encode()
        await self._producer.send_and_wait(self._topic, sign(card, self._key), key=key)

    async def _publish_loop(self) -> None:
        while True:
            await asyncio.sleep(PUBLISH_S)
            try:
                await self.publish()
            except KafkaError as exc:
                log.warning("publishing this node's card failed: %r", exc)

    async def _follow(self) -> None:
        consumer = AIOKafkaConsumer(bootstrap_servers=self._bootstrap, enable_auto_commit=False)
        tp = TopicPartition(self._topic, 0)
        await consumer.start()
        try:
            consumer.assign([tp])
            consumer.seek(tp, (await consumer.beginning_offsets([tp]))[tp])
            while True:
                got = await consumer.getmany(tp, timeout_ms=READ_POLL_MS)
                for message in got.get(tp, []):
                    if not _note(self.cards, message.key, message.value, self._key):
                        self._warn_refused(message.key)
                if got:
                    self._news.set()
                    self._news = asyncio.Event()
        finally:
            await consumer.stop()

    def _warn_refused(self, key: bytes | None) -> None:
        name = (key or b"").decode(errors="replace")[:64]
        if name in self._refused:
            return
        self._refused.add(name)
        log.warning(
            "a card under node id %r in %s is not signed with this cluster's secret: it is "
            "ignored (no request is forwarded to it, no agent is sent there). Someone wrote "
            "to the topic without the secret, or that node was given another secret",
            name,
            self._topic,
        )

    async def leave(self, node_id: str) -> None:
        """Tombstone this node's card, then stop."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, KafkaError):
                await task
        with contextlib.suppress(KafkaError):
            await self._producer.send_and_wait(self._topic, None, key=node_id.encode())
        await self._producer.stop()
