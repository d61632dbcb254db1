"""Messages to other partitions: records the machine writes as rows, the processor ships.

Rule 1 (same batch): a handler that must change another partition's state writes the record
for that partition's log as a ``messages`` row, in the write batch of the state change that
caused it; nothing leaves the partition before that batch is committed.
Rule 2 (shipping is the runtime's): the leader's shipper (``processor/messages.py``) appends
the rows to their partitions' logs as client records (no epoch: never fenced), in row order,
and deletes them only after the append; a crash in between ships them again.
Rule 3 (idempotent receivers): so every message kind must change nothing the second time it
is applied (an enqueue of an existing child id, a landing in a slot that holds a result, a
cancel of a task that ended).
"""

from __future__ import annotations

from conveyor.schemas import codec
from conveyor.schemas.types import Record
from conveyor.store.tables import Tables
from conveyor.streams.machine.outcome import Meta, Outcome


def send(
    tables: Tables, meta: Meta, out: Outcome, partition: int, record: Record, key: str
) -> None:
    """Write ``record`` for ``partition``'s log (rule 1). Row keys follow (offset, order of
    sending), so a receiver sees one sender's messages in the order they were sent."""
    data = codec.encode_record(record, epoch=0, ts_ms=meta.ts_ms, key=key)
    tables.put_message(meta.offset, out.sent, partition, data)
    out.sent += 1
