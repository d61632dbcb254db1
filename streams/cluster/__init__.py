"""Nodes of one cluster on Kafka: which node leads which partition of the log.

    membership.py   the consumer group that hands partitions out (sticky, dynamic members)
    ownership.py    what a node does when a partition is assigned or revoked, and its epoch
"""

from __future__ import annotations

from conveyor.frozen import frozen
from conveyor.streams.cluster.membership import Membership
from conveyor.streams.cluster.ownership import Fences, NotOwner, Ownership
from conveyor.streams.node import Node

__all__ = ["ClusterMember", "NotOwner", "join"]


@frozen
class ClusterMember:
    ownership: Ownership
    membership: Membership

    async def leave(self) -> None:
        """Leave the group, then stop taking partitions; the node is stopped by its owner."""
        await self.membership.stop()
        await self.ownership.close()


async def join(
    node: Node,
    fences: Fences,
    *,
    bootstrap: str,
    topic: str,
    cluster: str,
    session_timeout_ms: int,
) -> ClusterMember:
    """Join ``cluster`` as ``node.node_id``: from now on ``node`` leads what the group gives
    it. ``fences``: the record log (a ``KafkaLog``), unwrapped."""
    ownership = Ownership(node, fences)
    membership = Membership(
        bootstrap,
        topic,
        ownership,
        cluster=cluster,
        node_id=node.node_id,
        session_timeout_ms=session_timeout_ms,
    )
    await membership.start()
    return ClusterMember(ownership=ownership, membership=membership)
