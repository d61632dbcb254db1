"""Nodes of one cluster on Kafka: which node leads which partition of the log.

membership.py   the consumer group that hands partitions out (sticky, dynamic members)
ownership.py    what a node does when a partition is assigned or revoked, and its epoch
directory.py    every node's card (URL, partitions led, epochs, lag) in <cluster>-nodes
"""

from __future__ import annotations

from conveyor.frozen import frozen
from conveyor.streams.cluster.directory import Card, Directory
from conveyor.streams.cluster.membership import Membership
from conveyor.streams.cluster.ownership import Fences, NotOwner, Ownership
from conveyor.streams.node import Node

__all__ = ["ClusterMember", "NotOwner", "join"]


@frozen
class ClusterMember:
    ownership: Ownership
    membership: Membership
    directory: Directory
    node_id: str

    async def leave(self) -> None:
        """Leave the group, then stop taking partitions; the node is stopped by its owner."""
        await self.membership.stop()
        await self.ownership.close()
        await self.directory.leave(self.node_id)


def card(node: Node, url: str) -> Card:
    """What the directory says of ``node``: where it serves, what it leads."""
    leading = {
        str(p.partition): {"epoch": p.epoch, "lag_records": p.lag_records()}
        for p in node.processors
        if p.leader
    }
    return {"node_id": node.node_id, "url": url, "leading": leading}


async def join(
    node: Node,
    fences: Fences,
    *,
    bootstrap: str,
    topic: str,
    cluster: str,
    session_timeout_ms: int,
    url: str,
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
    directory = Directory(bootstrap, cluster, lambda: card(node, url))
    await directory.start()
    await membership.start()
    return ClusterMember(
        ownership=ownership, membership=membership, directory=directory, node_id=node.node_id
    )
