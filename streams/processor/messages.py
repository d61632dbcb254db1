"""The message shipper (a leader duty): records the machine wrote for other partitions' logs.

The machine writes a ``messages`` row in the batch of the state change that needs another
partition to act (``machine/messages.py``: spilled children, their landings, their cancels).
Here the leader appends the rows, in key order, to their partitions' record logs as client
records (no epoch: an append to another partition is never fenced by this one's leadership),
restamped with the leader's clock, and only then deletes them. A crash between the append and
the delete ships them again; every message kind is a no-op the second time it is applied.
Rows of one target are appended in one call, in order, so a receiver applies one sender's
messages in the order they were written (an EnqueueChildren before the CancelTasks that
follows it).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict

from conveyor.schemas import codec
from conveyor.store import keys
from conveyor.store.api import KV
from conveyor.streams import failpoints
from conveyor.streams.log.api import Log
from conveyor.streams.processor.duties import Partition
from conveyor.streams.processor.waiting import Poke, ship_while

SHIP_MAX = 256  # message rows per round
SHIP_BYTES_MAX = 8 * 2**20  # and their bytes (a message holds up to 2 MiB of items)


class MessageShipper:
    def __init__(self, partition: Partition, kv: KV, log: Log) -> None:
        self._p = partition
        self._kv = kv  # the partition's store: the message rows, deleted once shipped
        self._log = log  # the record log: the messages go to their partitions there
        self._poke = Poke(partition.clock)
        self.shipped = 0
        self._after: bytes | None = None  # the last row shipped: deleted rows are skipped

    def poke(self) -> None:
        self._poke.poke()

    async def run(self) -> None:
        p = self._p
        duty = f"partition {p.partition} messages"
        await ship_while(lambda: p.leader, self.ship_once, self._poke, p.clock, duty)

    async def ship_once(self) -> bool:
        rows: list[bytes] = []
        size = 0
        by_target: dict[int, list[bytes]] = defaultdict(list)
        now_ms = self._p.clock.now_ms()
        for key, value in self._kv.scan(keys.MESSAGES, self._after):
            if key == self._after:
                continue
            target, data = keys.parse_message_value(value)
            rows.append(key)
            by_target[target].append(_restamp(data, now_ms))
            size += len(data)
            if len(rows) >= SHIP_MAX or size >= SHIP_BYTES_MAX:
                break
        if not rows:
            return False
        await asyncio.gather(
            *(self._log.append(target, datas) for target, datas in by_target.items())
        )
        failpoints.hit("message-shipped")
        self._kv.write({key: None for key in rows})
        self._after = rows[-1]
        self.shipped += len(rows)
        return True


def _restamp(data: bytes, now_ms: int) -> bytes:
    """The record as appended now: "now" on the receiving partition is the append's time."""
    envelope = codec.decode_envelope(data)
    return codec.ENVELOPE.encode(dataclasses.replace(envelope, ts_ms=now_ms))
