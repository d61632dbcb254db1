"""This node's membership of its cluster: a Kafka consumer group that hands out partitions.

The group is ``<cluster>-owners``; its members subscribe to the record log's topic itself, so
the group's partitions are the log's partitions, with no second topic to create and to keep
at the same partition count. The member never reads the topic through the group: the
processors read the log with manual assignment (``log/kafka.py`` rule 4), so every assigned
partition is paused at once and the member's poll loop fetches nothing; it only keeps the
membership alive (heartbeats in the background, the poll within ``max.poll.interval.ms``).

- Sticky assignment (``StickyPartitionAssignor``): a rebalance moves only the partitions that
  must move (those of a node that left, or a share for a node that joined); the others stay
  with their owner, which leads them again right after the rebalance (``ownership.py`` rule 1).
- Dynamic membership, not static (``group.instance.id``): aiokafka's static members do not
  leave the group when they stop, so a node's clean shutdown would leave its partitions
  unled for a whole session timeout; a dynamic member leaves at once and its partitions move.
- A dead node is noticed after ``session_timeout_ms`` without a heartbeat; that bounds how
  long its partitions go unled.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, TopicPartition
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor
from aiokafka.errors import KafkaError

from conveyor.streams.cluster.ownership import Ownership

log = logging.getLogger("conveyor.cluster")

SESSION_TIMEOUT_MS = 10_000
HEARTBEAT_INTERVAL_MS = 1_000
POLL_MS = 1_000


def group_id(cluster: str) -> str:
    return f"{cluster}-owners"


class _Listener(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, membership: Membership) -> None:
        self._m = membership

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._m.ownership.revoked(tp.partition for tp in revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._m.consumer.pause(*assigned)  # the processors read the log, not this member
        await self._m.ownership.assigned((tp.partition for tp in assigned), self._m.generation)


class Membership:
    def __init__(
        self,
        bootstrap: str,
        topic: str,
        ownership: Ownership,
        *,
        cluster: str,
        node_id: str,
        session_timeout_ms: int = SESSION_TIMEOUT_MS,
        heartbeat_interval_ms: int = HEARTBEAT_INTERVAL_MS,
    ) -> None:
        self.topic = topic
        self.ownership = ownership
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=bootstrap,
            group_id=group_id(cluster),
            client_id=f"conveyor-{node_id}",
            enable_auto_commit=False,
            auto_offset_reset="latest",
            partition_assignment_strategy=(StickyPartitionAssignor,),
            session_timeout_ms=session_timeout_ms,
            heartbeat_interval_ms=min(heartbeat_interval_ms, session_timeout_ms // 3),
        )
        self._poller: asyncio.Task[None] | None = None

    @property
    def generation(self) -> int:
        # aiokafka keeps the group generation on its coordinator and has no public accessor.
        coordinator: Any = getattr(self.consumer, "_coordinator", None)
        return int(getattr(coordinator, "generation", -1))

    async def start(self) -> None:
        self.consumer.subscribe([self.topic], listener=_Listener(self))
        await self.consumer.start()
        self._poller = asyncio.create_task(self._poll(), name="cluster-membership")

    async def _poll(self) -> None:
        while True:
            try:
                await self.consumer.getmany(timeout_ms=POLL_MS)
            except KafkaError as exc:  # the group is changing; the next poll rejoins
                log.warning("cluster membership: %r", exc)
                await asyncio.sleep(POLL_MS / 1000)

    async def stop(self) -> None:
        """Leave the group (its partitions move to the other nodes at once)."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
        await self.consumer.stop()
