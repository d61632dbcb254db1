"""Which partitions this node leads, as the cluster's group membership hands them out.

The rules, and why:

1. Ownership follows the consumer group (``membership.py``): a partition assigned to this node
   is led here, one that is not is served elsewhere. Kafka's group protocol (aiokafka has no
   cooperative rebalancing) revokes every partition at the start of each rebalance and then
   assigns the new set, so a revocation only *pauses* a partition: before the callback returns
   its dispatch and its leader duties have stopped (nothing is handed to an agent, no timer or
   lease expiry is proposed), but its processor stays open and keeps applying the log. The
   assignment that follows decides: a partition that came back (the sticky assignor keeps
   every partition that need not move where it was) leads again at once, without a replay; a
   partition that went away is closed, and every call for it is refused with ``NotOwner``.
2. Taking a partition: open its processor if it was closed (``restore`` first: with
   snapshots on, ``snapshots.py`` puts the newest snapshot in place of an older local store;
   without, nothing), replay the log from the applied offset, then mint the epoch, seal the
   log there, announce it through the log and start the leader duties
   (``PartitionProcessor.lead``).
3. The epoch comes from the ownership change: at least ``generation << GENERATION_SHIFT``,
   where generation is the group's generation in which this node was assigned the partition,
   and above the persisted fence. Kafka gives each generation one assignment, and each
   partition to one member of it; generations only grow. So an owner of an earlier
   generation, even one that was paused through the rebalance and never heard of it (a
   zombie), has an epoch below ``generation << GENERATION_SHIFT``, whatever it saw of the
   fences and whatever it re-led meanwhile: a re-lead after a failed duty takes the fence +
   1, which stays inside its generation's block of ``2 ** GENERATION_SHIFT`` epochs. The state
   machine ignores leader records below the last announced epoch, and the log's seal fences
   the zombie's producer at the broker, so its writes are harmless.
4. Taking retries (doubling pauses) while the partition stays assigned: Kafka may be
   changing under us (a broker restarting, a leader being elected), the snapshot store may
   be unreachable, or the log may have been trimmed past the local store since ``restore``
   looked (``LogTrimmed``): the next try restores again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from conveyor.errors import FencedError, TransientError
from conveyor.streams.log.api import LogTrimmed
from conveyor.streams.node import Node

log = logging.getLogger("conveyor.cluster")

GENERATION_SHIFT = 20
TAKE_RETRY_MIN_S, TAKE_RETRY_MAX_S = 0.5, 10.0
NOT_OWNER_RETRY_MS = 500


class NotOwner(TransientError):
    """This node does not own the partition of the request (another node does)."""

    code = "not_owner"

    def __init__(self, partition: int) -> None:
        super().__init__(
            f"partition {partition} is owned by another node of the cluster; send the request "
            "again (to any node: it is forwarded to the owner)",
            retry_after_ms=NOT_OWNER_RETRY_MS,
        )
        self.partition = partition


class Fences(Protocol):
    """What ownership needs of the log: re-reading the persisted fences (``KafkaLog``)."""

    async def refresh_fences(self) -> None: ...


async def restore(partition: int) -> None:
    """Make the local store of ``partition`` fit to replay from. Without snapshots the local
    store is always fit: the log is never trimmed, so it replays whatever it lacks
    (``Snapshots.restore`` is the one with snapshots)."""


def epoch_floor(generation: int) -> int:
    """Rule 3."""
    return max(0, generation) << GENERATION_SHIFT


class Ownership:
    """The partitions this node owns; ``revoked`` and ``assigned`` are the group's callbacks."""

    def __init__(
        self,
        node: Node,
        fences: Fences,
        *,
        restore_partition: Callable[[int], Awaitable[None]] = restore,
    ) -> None:
        self.node = node
        self._fences = fences
        self._restore = restore_partition
        self.assigned_set: frozenset[int] = frozenset()
        self.generation = -1
        self._takes: dict[int, asyncio.Task[None]] = {}
        self.taken_ms: dict[int, int] = {}  # partition -> when it last started leading here

    def leading(self) -> list[int]:
        return sorted(p for p in self.assigned_set if self.node.processors[p].leader)

    async def revoked(self, partitions: Iterable[int]) -> None:
        """Rule 1: stop dispatch and duties of ``partitions`` before returning."""
        revoked = sorted(partitions)
        await self._cancel_takes(revoked)
        await asyncio.gather(*(self.node.pause_partition(p) for p in revoked))
        self.assigned_set = self.assigned_set.difference(revoked)
        if revoked:
            log.info("partitions %s paused for a rebalance", revoked)

    async def assigned(self, partitions: Iterable[int], generation: int) -> None:
        """Rule 1: close what went away, take (in the background) what is ours now."""
        self.assigned_set = frozenset(partitions)
        self.generation = generation
        gone = [
            p
            for p in range(self.node.partitions)
            if self.node.is_open(p) and p not in self.assigned_set
        ]
        await self._cancel_takes(gone)
        for p in gone:
            await self.node.stop_partition(p, NotOwner(p))
        if gone:
            log.info("partitions %s moved to other nodes", gone)
        floor = epoch_floor(generation)
        for p in sorted(self.assigned_set):
            self._takes[p] = asyncio.create_task(self._take(p, floor), name=f"take-{p}")

    async def _take(self, p: int, floor: int) -> None:
        """Rules 2 and 4."""
        pause_s = TAKE_RETRY_MIN_S
        while True:
            try:
                await self._fences.refresh_fences()
                if not self.node.is_open(p):
                    await self._restore(p)
                await self.node.start_partition(p, epoch_floor=floor)
            except (TransientError, FencedError, LogTrimmed) as exc:
                log.warning("taking partition %d failed (%s); again in %.1f s", p, exc, pause_s)
                await self.node.pause_partition(p)
                await asyncio.sleep(pause_s)
                pause_s = min(2 * pause_s, TAKE_RETRY_MAX_S)
                continue
            self.taken_ms[p] = self.node.clock.now_ms()
            processor = self.node.processors[p]
            log.info(
                "partition %d: led here at epoch %d, %d records applied since it opened",
                p,
                processor.epoch,
                processor.records_applied,
            )
            return

    async def _cancel_takes(self, partitions: Iterable[int]) -> None:
        tasks = [t for p in partitions if (t := self._takes.pop(p, None)) is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def close(self) -> None:
        await self._cancel_takes(list(self._takes))
