"""Read queries over the snapshot: task listing (filters, keyset pages, count) and queues.

Every query takes the tenant as its first condition: rows of other tenants are never read,
and every index leads with ``tenant``.

Listing order is newest first, ``(created_ms, task_id)`` descending; the keyset cursor is the
last row's pair, so a page costs the same at row 10 and at row 10,000,000 (no OFFSET).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import asyncpg

TASK_LIST_COLUMNS = (
    "task_id, app, task_type, queue, status, attempt, created_ms, updated_ms, finished_ms, "
    "ready_ms, leased_ms, agent_id, error_class, error_message, last_event, version, partition"
)


@dataclass(frozen=True, slots=True, kw_only=True)
class TaskQuery:
    tenant: str
    statuses: tuple[str, ...] = ()
    queue: str | None = None
    task_type: str | None = None
    error_class: str | None = None
    error_text: str | None = None  # substring of the error message, case-insensitive
    created_from_ms: int | None = None  # inclusive
    created_to_ms: int | None = None  # exclusive
    finished_from_ms: int | None = None
    finished_to_ms: int | None = None


@dataclass(slots=True)
class _Where:
    clauses: list[str] = field(default_factory=list)
    args: list[Any] = field(default_factory=list)

    def add(self, template: str, value: Any) -> None:
        self.args.append(value)
        self.clauses.append(template.replace("?", f"${len(self.args)}"))

    def sql(self) -> str:
        return " AND ".join(self.clauses)


def _escape_like(text: str) -> str:
    return text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")


def _where(q: TaskQuery) -> _Where:
    w = _Where()
    w.add("tenant = ?", q.tenant)
    if q.statuses:
        w.add("status = ANY(?::text[])", list(q.statuses))
    optional = (
        ("queue = ?", q.queue),
        ("task_type = ?", q.task_type),
        ("error_class = ?", q.error_class),
        ("created_ms >= ?", q.created_from_ms),
        ("created_ms < ?", q.created_to_ms),
        ("finished_ms >= ?", q.finished_from_ms),
        ("finished_ms < ?", q.finished_to_ms),
    )
    for template, value in optional:
        if value is not None:
            w.add(template, value)
    if q.error_text:
        w.add("error_message ILIKE ?", f"%{_escape_like(q.error_text)}%")
    return w


async def list_tasks(
    conn: asyncpg.Connection | asyncpg.Pool,
    q: TaskQuery,
    limit: int,
    after: tuple[int, str] | None = None,
) -> list[dict[str, Any]]:
    """Up to ``limit`` rows after the keyset ``after`` = (created_ms, task_id) of the last row
    of the previous page."""
    sql, args = _page_sql(TASK_LIST_COLUMNS, q, limit, after)
    return [dict(r) for r in await conn.fetch(sql, *args)]


async def task_keys(
    conn: asyncpg.Connection | asyncpg.Pool,
    q: TaskQuery,
    limit: int,
    after: tuple[int, str] | None = None,
) -> list[tuple[int, str]]:
    """The keys (created_ms, task_id) of the next ``limit`` matching rows after ``after``, in
    listing order: the batches of a bulk operation."""
    sql, args = _page_sql("created_ms, task_id", q, limit, after)
    return [(int(r["created_ms"]), str(r["task_id"])) for r in await conn.fetch(sql, *args)]


def _page_sql(
    columns: str, q: TaskQuery, limit: int, after: tuple[int, str] | None
) -> tuple[str, list[Any]]:
    w = _where(q)
    if after is not None:
        w.args.extend(after)
        n = len(w.args)
        w.clauses.append(f"(created_ms, task_id) < (${n - 1}, ${n})")
    w.args.append(limit)
    sql = (
        f"SELECT {columns} FROM tasks WHERE {w.sql()} "
        f"ORDER BY created_ms DESC, task_id DESC LIMIT ${len(w.args)}"
    )
    return sql, w.args


async def count_tasks(conn: asyncpg.Connection | asyncpg.Pool, q: TaskQuery) -> int:
    w = _where(q)
    return int(await conn.fetchval(f"SELECT count(*) FROM tasks WHERE {w.sql()}", *w.args))


QUEUE_DEPTH = """
SELECT queue, status, count(*) AS n, min(ready_ms) FILTER (WHERE status = 'ENQUEUED') AS ready
FROM tasks WHERE tenant = $1 AND finished_ms IS NULL
GROUP BY queue, status
"""
QUEUE_WINDOW = """
SELECT queue, count(*) AS finished, count(*) FILTER (WHERE status <> 'SUCCEEDED') AS errors
FROM tasks WHERE tenant = $1 AND finished_ms >= $2
GROUP BY queue
"""
WINDOWS_S = (60, 300, 3600)


async def queues(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, now_ms: int
) -> list[dict[str, Any]]:
    """Per queue of ``tenant``: depth by state, age of the oldest ready task, and throughput
    and error rate over the last 1, 5 and 60 minutes."""
    out: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return out.setdefault(
            name, {"queue": name, "depth": {}, "oldest_ready_age_ms": None, "windows": {}}
        )

    for r in await conn.fetch(QUEUE_DEPTH, tenant):
        e = entry(r["queue"])
        e["depth"][r["status"]] = int(r["n"])
        if r["ready"] is not None:
            e["oldest_ready_age_ms"] = max(0, now_ms - int(r["ready"]))
    for window_s in WINDOWS_S:
        for r in await conn.fetch(QUEUE_WINDOW, tenant, now_ms - window_s * 1000):
            finished, errors = int(r["finished"]), int(r["errors"])
            entry(r["queue"])["windows"][f"{window_s}s"] = {
                "finished_per_s": round(finished / window_s, 3),
                "error_rate": round(errors / finished, 4) if finished else 0.0,
            }
    return sorted(out.values(), key=lambda e: str(e["queue"]))


async def tasks_by_state(conn: asyncpg.Connection | asyncpg.Pool) -> list[tuple[str, str, int]]:
    """(queue, status, count) over every tenant, for the ``conveyor_tasks`` gauge."""
    rows = await conn.fetch("SELECT queue, status, count(*) AS n FROM tasks GROUP BY 1, 2")
    return [(r["queue"], r["status"], int(r["n"])) for r in rows]
