"""Nodes of one cluster on Kafka: which node leads which partition of the log.

membership.py   the consumer group that hands partitions out (sticky, dynamic members)
ownership.py    what a node does when a partition is assigned or revoked, and its epoch
directory.py    every node's card (URL, partitions led, epochs, lag) in <cluster>-nodes
signing.py      cards are signed with the cluster's secret; an unsigned one is not believed
events_trim.py  the events topic trimmed below what every node's readers still need
snapshots.py    partition snapshots: taken by the owner on a schedule, restored by a node that
                takes a partition, the log trimmed below the oldest kept (snapshot_store.py:
                a directory or S3)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from conveyor.frozen import frozen
from conveyor.streams.cluster.directory import Card, Directory
from conveyor.streams.cluster.events_trim import (
    INTERVAL_MS,
    KEEP_MS_DEFAULT,
    NEEDED,
    RELAYS,
    EventsLog,
    EventsTrimmer,
)
from conveyor.streams.cluster.events_trim import needed as events_needed
from conveyor.streams.cluster.membership import Membership
from conveyor.streams.cluster.ownership import Fences, NotOwner, Ownership, restore
from conveyor.streams.cluster.signing import ClusterSecret
from conveyor.streams.cluster.snapshots import Snapshots
from conveyor.streams.node import Node

__all__ = ["ClusterMember", "ClusterSecret", "NotOwner", "Snapshots", "join", "leading"]


@frozen
class ClusterMember:
    ownership: Ownership
    membership: Membership
    directory: Directory
    node_id: str
    trimmer: EventsTrimmer
    snapshots: Snapshots | None = None

    async def leave(self) -> None:
        """Stop snapshotting and trimming, leave the group, then stop taking partitions; the
        node is stopped by its owner."""
        await self.trimmer.stop()
        if self.snapshots is not None:
            await self.snapshots.stop()
        await self.membership.stop()
        await self.ownership.close()
        await self.directory.leave(self.node_id)


Readers = Callable[[], list[Mapping[int, int]]]


def card(node: Node, url: str, readers: Readers, relays: bool = False) -> Card:
    """What the directory says of ``node``: where it serves, what it leads, what its readers
    of the events topic still need of it, and whether it runs the task events relay, whose
    position the trim keeps too (``events_trim.py``)."""
    leading = {
        str(p.partition): {"epoch": p.epoch, "lag_records": p.lag_records()}
        for p in node.processors
        if p.leader
    }
    needed = events_needed(readers(), node.partitions)
    return {
        "node_id": node.node_id,
        "url": url,
        "leading": leading,
        NEEDED: needed,
        RELAYS: relays,
    }


async def join(
    node: Node,
    fences: Fences,
    *,
    bootstrap: str,
    topic: str,
    cluster: str,
    session_timeout_ms: int,
    url: str,
    secret: ClusterSecret,
    events: EventsLog,
    readers: Readers = list,
    events_keep_ms: int = KEEP_MS_DEFAULT,
    events_interval_ms: int = INTERVAL_MS,
    relays: bool = False,
    snapshots: Snapshots | None = None,
) -> ClusterMember:
    """Join ``cluster`` as ``node.node_id``: from now on ``node`` leads what the group gives
    it. ``fences``: the record log (a ``KafkaLog``), unwrapped. ``secret``: signs this node's
    card and checks the others' (``signing.py``). ``events``: the events topic, trimmed here
    every ``events_interval_ms`` below what ``readers`` (each a reader's next offset by
    partition) and every other node's need, and below the task events relay's committed
    offsets, keeping ``events_keep_ms`` (``events_trim.py``). ``relays``: this node runs the
    relay (``--task-events``), which its card says.
    ``snapshots``: restores the partitions taken here and snapshots those led here
    (``snapshots.start`` is called)."""
    restore_partition = restore if snapshots is None else snapshots.restore
    ownership = Ownership(node, fences, restore_partition=restore_partition)
    membership = Membership(
        bootstrap,
        topic,
        ownership,
        cluster=cluster,
        node_id=node.node_id,
        session_timeout_ms=session_timeout_ms,
    )
    from conveyor.streams.sinks.task_events import group_of

    directory = Directory(
        bootstrap, cluster, lambda: card(node, url, readers, relays), secret.card_key(cluster)
    )
    trimmer = EventsTrimmer(
        events,
        lambda: directory.cards,
        lambda p: leading(node, p),
        node.partitions,
        relay_group=group_of(cluster),
        clock=node.clock,
        keep_ms=events_keep_ms,
        interval_ms=events_interval_ms,
    )
    await directory.start()
    await membership.start()
    trimmer.start()
    if snapshots is not None:
        snapshots.start()
    return ClusterMember(
        ownership=ownership,
        membership=membership,
        directory=directory,
        node_id=node.node_id,
        trimmer=trimmer,
        snapshots=snapshots,
    )


def leading(node: Node, p: int) -> bool:
    """Whether ``node`` leads partition ``p`` now (what snapshots may be taken of)."""
    return node.is_open(p) and node.processors[p].leader
