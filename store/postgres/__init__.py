"""The Postgres query snapshot: migrations, the projector-facing writes and the list queries.

The processors answer "what is task X doing right now" from RocksDB; this snapshot answers
"show me every failure of resize_image since 14:00". It is fed only by the events stream
(``conveyor.streams.sinks.projector``) and can be rebuilt from it at any time.
"""

from __future__ import annotations

from conveyor.store.postgres.migrate import migrate
from conveyor.store.postgres.server import EmbeddedPostgres, StoreUnavailable, connect_pool

__all__ = ["EmbeddedPostgres", "StoreUnavailable", "connect_pool", "migrate"]
