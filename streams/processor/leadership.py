"""Fencing of a partition's leader, in three verbs.

``mint``: a new leader takes the next epoch above the log's fence and seals the log there, so
every append from an older leader fails from now on (where the log can refuse: local log).
``accepts``: the state machine's own check; a leader record older than the last announced epoch
is ignored (where the log cannot refuse: Kafka). ``clear``: a leader that learns it was fenced
drops every duty at once; its in-memory leases and waiting polls go with it.

The straggler story, told by ``tests/unit/test_fencing.py``: leader A (epoch 1) pauses; B mints
epoch 2, seals, announces; A wakes and proposes a lease grant with epoch 1. The local log
refuses it; a log that took it anyway would have the machine ignore it.
"""

from __future__ import annotations

from conveyor.streams.log.api import Log
from conveyor.streams.machine.apply import accepts

__all__ = ["accepts", "mint"]


async def mint(log: Log, partition: int, floor: int = 0) -> int:
    """The next epoch above the fence, and at least ``floor`` (what a cluster's ownership
    change asks for: ``streams/cluster/ownership.py``); the log is sealed there."""
    epoch = max(log.fence(partition) + 1, floor)
    await log.seal(partition, epoch)
    return epoch
