"""The storage protocol under the state machine: an ordered byte-key store with atomic batches.

Rules:

1. ``write(changes)`` is atomic: after a crash either every change of the batch is visible or
   none is. The processor puts the table changes, the outbox and the applied offset in ONE
   batch, so state and the offset it reflects can never disagree.
2. ``scan`` yields committed pairs in ascending key order.
3. A value of ``None`` in a batch deletes the key.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Protocol


class KV(Protocol):
    def get(self, key: bytes) -> bytes | None: ...

    def scan(self, prefix: bytes, start: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        """Pairs whose key starts with ``prefix``, from ``start`` (inclusive) if given."""
        ...

    def write(self, changes: Mapping[bytes, bytes | None]) -> None: ...

    def close(self) -> None: ...
