"""The queue history's fold of one chunk, against a connection that records its statements:
what it costs the projector's transaction (two statements when every latency's start is
remembered), and when it reads task rows (only for a start no hint remembers, never for one
the chunk used up). What the counts read back as is in tests/integration/test_queue_history.py.
"""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.schemas.types import EventBatch, EventKind, TaskEvent
from conveyor.store.postgres import history

T0 = 1_700_000_040_000  # a minute's start


class Recorder:
    """Answers the marks and the task rows; keeps every statement with its arguments."""

    def __init__(self, rows: dict[str, tuple[int | None, int | None]] | None = None) -> None:
        self.rows = rows or {}
        self.statements: list[tuple[str, tuple[Any, ...]]] = []

    async def fetch(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        self.statements.append((sql, args))
        if "history_marks" in sql:
            return []
        wanted = args[0]
        return [
            {"task_id": t, "ready_ms": r, "leased_ms": leased}
            for t, (r, leased) in self.rows.items()
            if t in wanted
        ]

    async def execute(self, sql: str, *args: Any) -> None:
        self.statements.append((sql, args))


def _event(task_id: str, kind: EventKind, status: str, version: int, ts_ms: int) -> TaskEvent:
    return TaskEvent(
        kind=kind,
        task_id=task_id,
        tenant="alpha",
        app="shop",
        task_type="email",
        queue="q",
        status=status,
        attempt=1,
        ts_ms=ts_ms,
        version=version,
    )


def _write(conn: Recorder, hints: history.Hints, *events: TaskEvent) -> history.HistoryFold:
    batch = EventBatch(partition=0, offset=events[-1].version, events=list(events))
    fold = history.HistoryFold([batch], hints)
    asyncio.run(fold.write(conn))  # type: ignore[arg-type]  # the statements it makes
    return fold


def _reads_tasks(conn: Recorder) -> bool:
    return any("FROM tasks" in sql for sql, _ in conn.statements)


def test_a_chunk_whose_starts_are_remembered_costs_two_statements() -> None:
    conn = Recorder()
    fold = _write(
        conn,
        history.Hints(),
        _event("a", EventKind.TaskEnqueued, "ENQUEUED", 1, T0),
        _event("a", EventKind.TaskLeased, "LEASED", 2, T0 + 100),
        _event("a", EventKind.TaskSucceeded, "SUCCEEDED", 3, T0 + 1_100),
    )
    assert len(conn.statements) == 2
    assert "FOR UPDATE" in conn.statements[0][0]
    upsert, args = conn.statements[1]
    assert "queue_history" in upsert and "history_marks" in upsert  # rows and marks at once
    assert args[-2:] == ([0], [3])  # partition 0 counted up to the record at offset 3
    (row,) = fold.rows.values()
    assert row.counts[history.COUNTS.index("succeeded")] == 1
    assert row.wait[history.bucket_of(100)] == 1
    assert row.run[history.bucket_of(1_000)] == 1


def test_a_start_no_hint_remembers_is_read_from_the_task_row() -> None:
    conn = Recorder(rows={"a": (T0 - 400, None), "b": (None, T0 - 2_000)})
    fold = _write(
        conn,
        history.Hints(),  # a projector just restarted: it remembers nothing
        _event("a", EventKind.TaskLeased, "LEASED", 7, T0),
        _event("b", EventKind.TaskSucceeded, "SUCCEEDED", 8, T0),
    )
    reads = [args for sql, args in conn.statements if "FROM tasks" in sql]
    assert len(reads) == 1 and sorted(reads[0][0]) == ["a", "b"]  # one read for both
    (row,) = fold.rows.values()
    assert row.wait[history.bucket_of(400)] == 1
    assert row.run[history.bucket_of(2_000)] == 1


def test_a_start_the_chunk_used_up_is_not_read_back() -> None:
    conn = Recorder(rows={"a": (T0 - 60_000, T0 - 60_000)})
    fold = _write(
        conn,
        history.Hints(),
        _event("a", EventKind.TaskEnqueued, "ENQUEUED", 1, T0),
        _event("a", EventKind.TaskLeased, "LEASED", 2, T0 + 10),
        # An end without a lease of its own, and a second lease with no ready time since:
        # the row's times are older than those this chunk already used.
        _event("a", EventKind.TaskSleeping, "SLEEPING", 3, T0 + 20),
        _event("a", EventKind.TaskFailed, "FAILED", 4, T0 + 30),
    )
    assert not _reads_tasks(conn)
    (row,) = fold.rows.values()
    assert sum(row.wait) == 1  # the lease, from the enqueue's time
    assert sum(row.run) == 1  # the sleep ended the attempt; the failure has none to close
    assert row.run[history.bucket_of(10)] == 1


def test_events_at_or_below_the_marks_are_not_counted_but_still_remembered() -> None:
    hints = history.Hints()
    conn = Recorder()

    async def marked(sql: str, *args: Any) -> list[dict[str, Any]]:
        conn.statements.append((sql, args))
        return [{"partition": 0, "record_offset": 1}] if "history_marks" in sql else []

    conn.fetch = marked  # type: ignore[method-assign]
    fold = _write(
        conn,
        hints,
        _event("a", EventKind.TaskEnqueued, "ENQUEUED", 1, T0),  # counted before
        _event("a", EventKind.TaskLeased, "LEASED", 2, T0 + 50),
    )
    (row,) = fold.rows.values()
    assert row.counts[history.COUNTS.index("enqueued")] == 0
    assert row.counts[history.COUNTS.index("started")] == 1
    assert row.wait[history.bucket_of(50)] == 1  # the enqueue's time, remembered all the same
    assert not _reads_tasks(conn)
