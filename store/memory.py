"""In-memory KV: the reference implementation and test double of ``store.api.KV``."""

from __future__ import annotations

from collections.abc import Iterator, Mapping

from sortedcontainers import SortedDict


class MemoryKV:
    def __init__(self) -> None:
        self.data: SortedDict = SortedDict()

    def get(self, key: bytes) -> bytes | None:
        value: bytes | None = self.data.get(key)
        return value

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        lo = start if start is not None and start > prefix else prefix
        for key in self.data.irange(minimum=lo):
            if not key.startswith(prefix):
                return
            yield key, self.data[key]

    def write(self, changes: Mapping[bytes, bytes | None]) -> None:
        for key, value in changes.items():
            if value is None:
                self.data.pop(key, None)
            else:
                self.data[key] = value

    def close(self) -> None:
        return None
