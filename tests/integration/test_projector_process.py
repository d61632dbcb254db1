"""The projector in a process of its own (``streams/sinks/projector_process.py``) against a
real PostgreSQL and a real events log: it follows what is appended, a killed one is started
again and resumes from its watermark, and closing the snapshot ends the process."""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from test_embedded_postgres import alive
from test_projection import pg_server  # noqa: F401  (the fixture, by name)

from conveyor.schemas.codec import EVENT_BATCH
from conveyor.schemas.types import EventBatch, EventKind, TaskEvent
from conveyor.streams.log.local import LocalLog
from conveyor.streams.routing import mint_task_id
from conveyor.streams.sinks import snapshot as snapshot_module
from conveyor.streams.sinks.metrics import Metrics
from conveyor.streams.sinks.snapshot import Snapshot

pytestmark = pytest.mark.timeout(120)

PARTITIONS = 2
TASKS = 150  # per partition and round


async def _database(dsn: str) -> str:
    name = f"t_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    await admin.close()
    return dsn.replace("/postgres?", f"/{name}?")


ENQUEUED = (EventKind.TaskEnqueued, "ENQUEUED")
LEASED = (EventKind.TaskLeased, "LEASED")
SUCCEEDED = (EventKind.TaskSucceeded, "SUCCEEDED")


async def _append_lives(
    events: LocalLog,
    round_: int,
    steps: tuple[tuple[EventKind, str], ...] = (ENQUEUED, SUCCEEDED),
    ids: list[list[str]] | None = None,
) -> list[list[str]]:
    """``TASKS`` tasks per partition (new ones, or ``ids``), one record per step; the ids."""
    ids = ids or [[mint_task_id(p) for _ in range(TASKS)] for p in range(PARTITIONS)]
    for p in range(PARTITIONS):
        for step, (kind, status) in enumerate(steps):
            version = 10 * round_ + step
            batch = EventBatch(
                partition=p,
                offset=version,
                events=[
                    TaskEvent(
                        kind=kind,
                        task_id=task_id,
                        tenant="acme",
                        app="shop",
                        task_type="email",
                        queue="default",
                        status=status,
                        attempt=1,
                        ts_ms=1_700_000_000_000 + version,
                        version=version,
                    )
                    for task_id in ids[p]
                ],
            )
            await events.append(p, [EVENT_BATCH.encode(batch)])
    return ids


@contextlib.asynccontextmanager
async def _following(dsn: str, home: Path) -> AsyncIterator[tuple[LocalLog, Snapshot, Metrics]]:
    """An events log, and a snapshot (a fresh database) whose projector process follows it."""
    events = await LocalLog.open(home / "events", PARTITIONS)
    metrics = Metrics()
    snap = await Snapshot.open(home, events, dsn=await _database(dsn), metrics=metrics)
    try:
        snap.start()
        yield events, snap, metrics
    finally:
        await snap.close()
        await events.close()


def test_a_killed_projector_process_is_started_again_and_resumes_from_its_watermark(
    pg_server: Any,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(snapshot_module, "RESTART_MS", 50)

    async def main() -> None:
        async with _following(pg_server.get_uri(), tmp_path) as (events, snap, metrics):
            await _append_lives(events, 0)
            await snap.wait_caught_up()
            first = snap.projector.pid
            assert first is not None and first != os.getpid()
            os.kill(first, signal.SIGKILL)
            await _append_lives(events, 1)
            await snap.wait_caught_up()
            assert snap.projector.pid != first, "the supervisor starts a new process"
            counts = await snap.pool.fetch("SELECT status, count(*) AS n FROM tasks GROUP BY 1")
            assert [(r["status"], r["n"]) for r in counts] == [("SUCCEEDED", 4 * TASKS)]
            # Two events a task; the second process projected only what its watermark had
            # not covered (round 0 was all written before the kill).
            projected = metrics.registry.get_sample_value("conveyor_projection_events_total")
            assert snap.projector.events_projected == projected == 8 * TASKS
            last = snap.projector.pid
        assert last is not None and not alive(last), "closing the snapshot ends the process"

    asyncio.run(main())
