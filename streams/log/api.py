"""The Log protocol: a partitioned, fenced, append-only sequence of opaque records.

Offsets are dense per partition, start at 0 and never repeat::

      trimmed      retained                      tail
    |----------|===============================|
    0      start_offset                   end_offset (next offset to be written)

Rules every implementation MUST follow:

1. ``append`` returns only once every record of the batch is durable (local: written and
   fdatasync'd; Kafka: acks=all). The offsets it returns are consecutive and in batch order.
   Concurrent appends to one partition SHOULD share one flush (group commit).
2. ``seal(partition, epoch)`` raises the partition's fence. From then on an append that carries
   an epoch lower than the fence MUST fail with ``LogSealed`` and write nothing. An append
   without an epoch (client ingest) is never fenced.
3. ``read`` yields records in offset order starting at ``from_offset``; with ``follow=True`` it
   waits for new records at the tail instead of returning.
4. A record is never changed once acknowledged. Corruption before the durable tail is reported
   as ``LogCorruption`` naming the file and offset, never skipped.
5. ``trim(partition, up_to)`` MAY drop records below ``up_to``; reads below ``start_offset``
   fail with ``LogTrimmed``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import NewType, Protocol

from conveyor.errors import ContractError, FencedError
from conveyor.frozen import frozen

Offset = NewType("Offset", int)
Epoch = NewType("Epoch", int)
PartitionId = NewType("PartitionId", int)


@frozen
class LogRecord:
    offset: int
    data: bytes


class LogSealed(FencedError):
    """An append carried an epoch older than the partition's fence."""

    code = "log_sealed"


class LogTrimmed(ContractError):
    """A read asked for offsets that a trim already dropped."""

    code = "log_trimmed"


class LogCorruption(Exception):
    """A frame before the durable tail failed its checksum or framing; never skipped."""

    def __init__(self, path: str, offset: int, reason: str) -> None:
        super().__init__(f"log corrupt in {path} at offset {offset}: {reason}")
        self.path = path
        self.offset = offset
        self.reason = reason


class Log(Protocol):
    @property
    def partitions(self) -> int: ...

    async def append(
        self, partition: int, records: Sequence[bytes], epoch: int | None = None
    ) -> list[int]:
        """Durably append ``records``; return their offsets (see rule 1 and 2)."""
        ...

    def read(
        self, partition: int, from_offset: int, *, follow: bool = False, max_batch: int = 1024
    ) -> AsyncIterator[list[LogRecord]]:
        """Yield batches of records from ``from_offset`` on (rule 3)."""
        ...

    async def seal(self, partition: int, epoch: int) -> None:
        """Raise the fence of ``partition`` to ``epoch`` (rule 2). Never lowers it."""
        ...

    async def trim(self, partition: int, up_to: int) -> None: ...

    def end_offset(self, partition: int) -> int:
        """The offset the next appended record will get."""
        ...

    def start_offset(self, partition: int) -> int: ...

    def fence(self, partition: int) -> int:
        """The current seal epoch (0 if never sealed)."""
        ...

    async def close(self) -> None: ...
