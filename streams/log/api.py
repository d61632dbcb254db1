"""The Log protocol: a partitioned, fenced, append-only sequence of opaque records.

Offsets per partition start at 0, strictly increase and never repeat. They MAY have gaps
(Kafka's transaction markers take offsets of their own); the memory and local logs keep them
dense. Code above the log never relies on density: it reads on from "applied offset + 1",
where a gap is simply skipped, and a lag computed as ``end_offset - applied - 1`` is an upper
bound where there are gaps::

      trimmed      retained                      tail
    |----------|=========== ===== ===== =======|
    0      start_offset    (gaps)         end_offset (one past the last record)

Rules every implementation MUST follow:

1. ``append`` returns only once every record of the batch is durable (local: written and
   fdatasync'd; Kafka: acks=all). The offsets it returns increase in batch order.
   Concurrent appends to one partition SHOULD share one flush (group commit).
2. ``seal(partition, epoch)`` raises the partition's fence. From then on an append that carries
   an epoch lower than the fence MUST fail with ``LogSealed`` and write nothing. An append
   without an epoch (client ingest) is never fenced.
3. ``read`` yields records in offset order from the first one at or after ``from_offset``;
   with ``follow=True`` it waits for new records at the tail instead of returning.
4. A record is never changed once acknowledged. Corruption before the durable tail is reported
   as ``LogCorruption`` naming the file and offset, never skipped.
5. ``trim(partition, up_to)`` MAY drop records below ``up_to``; reads below ``start_offset``
   fail with ``LogTrimmed``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import NewType, Protocol

from conveyor.errors import ContractError, FencedError, TransientError
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


class LogUnavailable(TransientError):
    """The log's service (a Kafka cluster) could not be reached or did not answer in time."""

    code = "log_unavailable"


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
        """One past the offset of the last record; the next record gets this one or higher."""
        ...

    @property
    def ends_known(self) -> bool:
        """Whether ``end_offset`` is always the true end of every partition (this process is
        the log's only writer), so a reader may skip to it without reading; False where other
        processes append and the end is only what this one last saw."""
        ...

    def start_offset(self, partition: int) -> int: ...

    def fence(self, partition: int) -> int:
        """The current seal epoch (0 if never sealed)."""
        ...

    async def close(self) -> None: ...
