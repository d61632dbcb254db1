"""``conveyor bench projection``: events/s from the events log into Postgres, and the lag.

Throughput: a synthetic but realistic events stream is written to a fresh events log first
(five events a task: enqueued, leased, retry scheduled, leased, succeeded -- the e2e mix with
one retry in five tasks would be lighter), then a projector over an embedded PostgreSQL
catches up from offset 0 while the clock runs: ``events_per_s``.

Lag: then the projector follows the log (as in a node) while more events are appended in real
time at ``rate`` events/s (default: the bar, 25,000) for ``lag_tasks`` tasks, stamped when
appended. ``lag_s`` is the projection's lag behind the log when that run ends: from the last
append until every event is projected. ``lag_gauge_s`` is what the node's
``conveyor_projection_lag_seconds`` said at the last append.
"""

from __future__ import annotations

import asyncio
import dataclasses
import tempfile
import time
from pathlib import Path
from typing import Any

from conveyor.schemas.codec import EVENT_BATCH
from conveyor.schemas.types import EventBatch, EventKind, TaskEvent
from conveyor.streams.log.local import LocalLog
from conveyor.streams.node import Node
from conveyor.streams.routing import mint_task_id
from conveyor.streams.sinks.snapshot import Snapshot

EVENTS_PER_BATCH = 256  # about what one processor batch emits under load
T0_MS = 1_700_000_000_000
_LIFE = (
    (EventKind.TaskEnqueued, "ENQUEUED", 1, None),
    (EventKind.TaskLeased, "LEASED", 1, None),
    (EventKind.TaskRetryScheduled, "RETRY_WAIT", 2, "IOError"),
    (EventKind.TaskLeased, "LEASED", 2, None),
    (EventKind.TaskSucceeded, "SUCCEEDED", 2, None),
)


def _events(partition: int, tasks: int) -> list[TaskEvent]:
    """The lives of ``tasks`` tasks, interleaved as a processor would emit them."""
    ids = [mint_task_id(partition) for _ in range(tasks)]
    out = []
    for step, (kind, status, attempt, error) in enumerate(_LIFE):
        for i, task_id in enumerate(ids):
            offset = step * tasks + i
            out.append(
                TaskEvent(
                    kind=kind,
                    task_id=task_id,
                    tenant=f"t{i % 4}",
                    app="bench",
                    task_type="noop",
                    queue="default",
                    status=status,
                    attempt=attempt,
                    ts_ms=T0_MS + offset,
                    version=offset,
                    agent_id="a" if step else None,
                    error_class=error,
                    error_message="flaky" if error else None,
                )
            )
    return out


async def _fill(events_log: LocalLog, tasks: int) -> int:
    total = 0
    per_partition = tasks // events_log.partitions
    for p in range(events_log.partitions):
        events = _events(p, per_partition)
        records = [
            EVENT_BATCH.encode(
                EventBatch(partition=p, offset=i, events=events[i : i + EVENTS_PER_BATCH])
            )
            for i in range(0, len(events), EVENTS_PER_BATCH)
        ]
        await events_log.append(p, records)
        total += len(events)
    return total


async def _paced(
    snapshot: Snapshot, events_log: LocalLog, tasks: int, rate: float
) -> dict[str, float]:
    """Append ``tasks`` more task lives at ``rate`` events/s while the projector follows."""
    chunks = []
    for p in range(events_log.partitions):
        events = _events(p, tasks // events_log.partitions)
        chunks += [
            (p, events[i : i + EVENTS_PER_BATCH]) for i in range(0, len(events), EVENTS_PER_BATCH)
        ]
    chunks.sort(key=lambda c: c[1][0].version)  # the partitions' lives interleave in time
    clock = snapshot.projector.clock
    snapshot.start()
    started = time.perf_counter()
    for i, (p, chunk) in enumerate(chunks):
        pause = started + i * EVENTS_PER_BATCH / rate - time.perf_counter()
        if pause > 0:
            await asyncio.sleep(pause)
        now_ms = clock.now_ms()
        stamped = [dataclasses.replace(e, ts_ms=now_ms) for e in chunk]
        batch = EventBatch(partition=p, offset=i, events=stamped)
        await events_log.append(p, [EVENT_BATCH.encode(batch)])
    appended = time.perf_counter()
    gauge_s = snapshot.projector.lag_s()
    await snapshot.wait_caught_up(timeout_s=120.0)
    return {
        "lag_s": round(time.perf_counter() - appended, 3),
        "lag_gauge_s": round(gauge_s, 3),
        "paced_events_per_s": round(sum(len(c) for _, c in chunks) / (appended - started)),
    }


async def bench_projection(
    *,
    tasks: int = 50_000,
    partitions: int = 8,
    dsn: str | None = None,
    lag_tasks: int = 10_000,
    rate: float = 25_000.0,
) -> dict[str, Any]:
    Node.tune_gc()  # as `conveyor node` runs (its projector process too)
    with tempfile.TemporaryDirectory(prefix="conveyor-bench-projection-") as tmp:
        home = Path(tmp)
        events_log = await LocalLog.open(home / "events", partitions)
        try:
            total = await _fill(events_log, tasks)
            snapshot = await Snapshot.open(home, events_log, dsn=dsn)
            try:
                started = time.perf_counter()
                projected = await snapshot.catch_up()
                elapsed = time.perf_counter() - started
                rows = await snapshot.pool.fetchval("SELECT count(*) FROM tasks")
                lag = await _paced(snapshot, events_log, lag_tasks, rate)
                if dsn is not None:  # an external server: leave it as we found it
                    await snapshot.pool.execute("TRUNCATE tasks, attempts, watermarks")
            finally:
                await snapshot.close()
        finally:
            await events_log.close()
    return {
        "events": total,
        "projected": projected,
        "task_rows": int(rows),
        "seconds": round(elapsed, 3),
        "events_per_s": round(projected / elapsed),
        **lag,
        "lag_rate": rate,
        "partitions": partitions,
    }


def main() -> None:  # pragma: no cover - a manual entry point
    print(asyncio.run(bench_projection()))
