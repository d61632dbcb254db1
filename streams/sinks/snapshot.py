"""The query snapshot as a node runs it: PostgreSQL (embedded or external), a connection pool
with the schema migrated, and the projector following the events stream in a process of its
own (``projector_process.py``), supervised by an asyncio task.

A projector failure never stops the node: the processors do not depend on it. It is logged and
the projector restarts from its watermark after ``RESTART_MS``; meanwhile listing serves a
snapshot that grows stale, and ``conveyor_projection_lag_*`` shows by how much.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

import asyncpg

from conveyor.errors import InvariantError
from conveyor.store.postgres import EmbeddedPostgres, connect_pool
from conveyor.store.postgres.server import configured_dsn
from conveyor.streams.log.api import Log
from conveyor.streams.sinks.metrics import Metrics
from conveyor.streams.sinks.projector import Projector
from conveyor.streams.sinks.projector_process import ProjectorProcess

log = logging.getLogger("conveyor.projector")

RESTART_MS = 5_000
EMBEDDED_DIR = "postgres"


class Snapshot:
    def __init__(
        self,
        events: Log,
        pool: asyncpg.Pool,
        projector: ProjectorProcess,
        embedded: EmbeddedPostgres | None,
    ) -> None:
        self.events = events
        self.pool = pool
        self.projector = projector
        self.embedded = embedded
        self._task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, home: Path, events: Log, *, dsn: str | None = None, metrics: Metrics | None = None
    ) -> Snapshot:
        """Connect to ``dsn`` (or ``CONVEYOR_POSTGRES_DSN``), else start the embedded server
        in ``home/postgres``; migrate the schema."""
        embedded = None
        target = configured_dsn(dsn)
        if target is None:
            embedded = EmbeddedPostgres(home / EMBEDDED_DIR)
            target = await embedded.start()
        try:
            pool = await connect_pool(target)
        except BaseException:
            if embedded is not None:
                await embedded.stop()
            raise
        return cls(events, pool, ProjectorProcess(events, pool, target, metrics=metrics), embedded)

    def start(self) -> None:
        """Follow the events stream in the background until ``close``."""
        if self._task is not None:
            raise InvariantError("the projector is already running")
        self._task = asyncio.create_task(self._supervise(), name="projector")

    async def _supervise(self) -> None:
        while True:
            try:
                await self.projector.run()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("projector failed; restarting from the watermark")
            await self.projector.clock.sleep_ms(RESTART_MS)

    async def catch_up(self) -> int:
        """Project everything in the events log now, in this process (a tool's, or a bench's,
        with the follower not started); the number of events projected."""
        return await Projector(self.events, self.pool).catch_up()

    async def rebuild(self) -> int:
        """Truncate the snapshot and project the whole events log again (node stopped)."""
        return await Projector(self.events, self.pool).rebuild()

    async def wait_caught_up(self, timeout_s: float = 30.0) -> None:
        """Until every event appended so far is projected (for tests and benches)."""
        async with asyncio.timeout(timeout_s):
            while any(self.projector.lag_records().values()):
                await asyncio.sleep(0.01)

    async def close(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.pool.close()
        if self.embedded is not None:
            await self.embedded.stop()
