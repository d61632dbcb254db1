"""The outbox shipper (a leader duty): committed event batches go to the events stream.

Events are written to the ``outbox`` table in the same batch as the state they describe, then
appended here to the events log (partition p of the events stream) and only then deleted. A
crash between the append and the delete ships a batch twice; consumers dedupe on the event's
``version`` (the log offset that caused it), so delivery is at-least-once and never lost.
"""

from __future__ import annotations

from conveyor.store import keys
from conveyor.store.api import KV
from conveyor.streams.log.api import Log
from conveyor.streams.processor.duties import Partition
from conveyor.streams.processor.waiting import Poke, ship_while

SHIP_MAX = 256  # outbox rows per append
# Shipping is not on any task's critical path; a short pause between appends turns many small
# fsyncs of the events log into a few larger ones, leaving the disk to the record log.
SHIP_PAUSE_MS = 20.0


class OutboxShipper:
    def __init__(self, partition: Partition, kv: KV, events_log: Log | None) -> None:
        self._p = partition
        self._kv = kv  # the partition's store: the outbox rows, deleted once shipped
        self._events = events_log
        self._poke = Poke(partition.clock)
        self.shipped = 0
        # Shipped rows are deleted; scanning from the last one skips their tombstones.
        self._after: bytes | None = None

    def poke(self) -> None:
        self._poke.poke()

    async def run(self) -> None:
        p = self._p
        duty = f"partition {p.partition} outbox"
        await ship_while(lambda: p.leader, self.ship_once, self._poke, p.clock, duty, SHIP_PAUSE_MS)

    def holds_through(self, offset: int) -> bool:
        """Whether a row of a record at or before ``offset`` is still to ship (a listing that
        reads its writes waits for its events to reach the stream: ``gateway/snapshot.py``)."""
        for key, _ in self._kv.scan(keys.OUTBOX, self._after):
            if key != self._after:
                return key <= keys.outbox(offset)
        return False

    async def ship_once(self) -> bool:
        rows = []
        for key, value in self._kv.scan(keys.OUTBOX, self._after):
            if key == self._after:
                continue
            rows.append((key, value))
            if len(rows) >= SHIP_MAX:
                break
        if not rows:
            return False
        if self._events is not None:
            await self._events.append(self._p.partition, [value for _, value in rows])
        self._kv.write({key: None for key, _ in rows})
        self._after = rows[-1][0]
        self.shipped += len(rows)
        return True
