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

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

from conveyor.schemas import codec
from conveyor.schemas.types import Record
from conveyor.store.tables import Tables
from conveyor.streams.machine.outcome import Meta, Outcome

T = TypeVar("T")
MESSAGE_ITEMS_MAX = 256  # children, landings or task ids per message
# Bytes of items per message: far below the log's record limit (16 MiB), and a round of the
# shipper holds a few messages in memory. An item bigger than this alone still fits: it came
# in one record already.
MESSAGE_BYTES_MAX = 2 * 2**20


def send(
    tables: Tables, meta: Meta, out: Outcome, partition: int, record: Record, key: str
) -> None:
    """Write ``record`` for ``partition``'s log (rule 1). Row keys follow (offset, order of
    sending), so a receiver sees one sender's messages in the order they were sent."""
    data = codec.encode_record(record, epoch=0, ts_ms=meta.ts_ms, key=key)
    tables.put_message(meta.offset, out.sent, partition, data)
    out.sent += 1


def chunks(items: Sequence[T], size_of: Callable[[T], int]) -> Iterator[list[T]]:
    """``items`` in order, in runs of at most MESSAGE_ITEMS_MAX items and MESSAGE_BYTES_MAX
    bytes (an item bigger than that makes a run of its own): one message each."""
    run: list[T] = []
    size = 0
    for item in items:
        n = size_of(item)
        if run and (len(run) == MESSAGE_ITEMS_MAX or size + n > MESSAGE_BYTES_MAX):
            yield run
            run, size = [], 0
        run.append(item)
        size += n
    if run:
        yield run
