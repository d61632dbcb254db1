"""In-memory Log: the reference implementation and the test double."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence

from conveyor.streams.log.api import LogRecord, LogSealed, LogTrimmed


class MemoryLog:
    def __init__(self, partitions: int) -> None:
        self._records: list[list[bytes]] = [[] for _ in range(partitions)]
        self._start: list[int] = [0] * partitions
        self._fence: list[int] = [0] * partitions
        self._changed: list[asyncio.Event] = [asyncio.Event() for _ in range(partitions)]

    @property
    def partitions(self) -> int:
        return len(self._records)

    @property
    def ends_known(self) -> bool:
        return True

    async def append(
        self, partition: int, records: Sequence[bytes], epoch: int | None = None
    ) -> list[int]:
        if epoch is not None and epoch < self._fence[partition]:
            raise LogSealed(
                f"partition {partition} is sealed at epoch {self._fence[partition]}; "
                f"append carried epoch {epoch}"
            )
        first = self.end_offset(partition)
        self._records[partition].extend(records)
        event = self._changed[partition]
        self._changed[partition] = asyncio.Event()
        event.set()
        return list(range(first, first + len(records)))

    async def read(
        self, partition: int, from_offset: int, *, follow: bool = False, max_batch: int = 1024
    ) -> AsyncIterator[list[LogRecord]]:
        offset = from_offset
        if offset < self._start[partition]:
            raise LogTrimmed(f"offset {offset} of partition {partition} was trimmed")
        while True:
            waiter = self._changed[partition]
            end = self.end_offset(partition)
            if offset < end:
                base = self._start[partition]
                stop = min(end, offset + max_batch)
                chunk = self._records[partition][offset - base : stop - base]
                yield [LogRecord(offset + i, data) for i, data in enumerate(chunk)]
                offset = stop
                continue
            if not follow:
                return
            await waiter.wait()

    async def seal(self, partition: int, epoch: int) -> None:
        self._fence[partition] = max(self._fence[partition], epoch)

    async def trim(self, partition: int, up_to: int) -> None:
        up_to = min(up_to, self.end_offset(partition))
        drop = up_to - self._start[partition]
        if drop > 0:
            del self._records[partition][:drop]
            self._start[partition] = up_to

    def end_offset(self, partition: int) -> int:
        return self._start[partition] + len(self._records[partition])

    def start_offset(self, partition: int) -> int:
        return self._start[partition]

    def fence(self, partition: int) -> int:
        return self._fence[partition]

    async def close(self) -> None:
        return None
