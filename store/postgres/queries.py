"""Read queries over the snapshot: task listing (filters, keyset pages, count) and queues.

Every query takes the tenant as its first condition: rows of other tenants are never read,
and every index leads with ``tenant``.

Listing order is newest first, ``(created_ms, task_id)`` descending; the keyset cursor is the
last row's pair, so a page costs the same at row 10 and at row 10,000,000 (no OFFSET).

Bounded work per request (``conveyor bench query`` measures it over a million rows):
- A finished range also bounds the creation time (a task finishes after it is created), so
  the newest-first scan starts at the end of the range instead of at the newest task.
- Text in the error message has no index to use (the embedded server ships no pg_trgm): a
  page examines at most ``TEXT_SCAN_ROWS_MAX`` rows that have an error, newest first, and may
  come back short with a cursor to continue from (``list_page``), as RocksDB listing does.
- ``count`` is exact when it takes at most ``COUNT_BUDGET_MS``; past that the planner's
  estimate answers, marked inexact (``count_or_estimate``). Counting a tenant's million rows
  exactly costs 100+ ms on every page load, and nobody needs the last digit of it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from conveyor.frozen import frozen
from conveyor.schemas.types import StepRow

TASK_LIST_COLUMNS = (
    "task_id, app, task_type, queue, status, attempt, created_ms, updated_ms, finished_ms, "
    "ready_ms, leased_ms, agent_id, error_class, error_message, last_event, version, partition"
)

_QUALIFIED = ", ".join(f"t.{c.strip()}" for c in TASK_LIST_COLUMNS.split(","))


@frozen(kw_only=True)
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
    payload_fields: str | None = None  # a JSON object the task's payload_fields contain


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
    if len(q.statuses) == 1:  # "= ANY" would keep the planner from an ordered index scan
        w.add("status = ?", q.statuses[0])
    elif q.statuses:
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
    if q.finished_to_ms is not None and (
        q.created_to_ms is None or q.created_to_ms > q.finished_to_ms
    ):
        w.add("created_ms < ?", q.finished_to_ms)  # implied: created before it finished
    if q.error_text:
        w.add("error_message ILIKE ?", f"%{_escape_like(q.error_text)}%")
    if q.payload_fields is not None:  # the GIN index tasks_payload_fields answers it
        w.add("payload_fields @> ?::jsonb", q.payload_fields)
    return w


TEXT_SCAN_ROWS_MAX = 5_000  # rows with an error examined per page by a text search
COUNT_BUDGET_MS = 20


async def list_page(
    conn: asyncpg.Connection | asyncpg.Pool,
    q: TaskQuery,
    limit: int,
    after: tuple[int, str] | None = None,
    *,
    scan_rows_max: int = TEXT_SCAN_ROWS_MAX,
) -> tuple[list[dict[str, Any]], tuple[int, str] | None]:
    """One page: up to ``limit`` rows after ``after``, and the key to continue after (None
    when there is nothing more). A text search examines at most ``scan_rows_max`` rows with
    an error per page, so its pages may be short, even empty, with a key to go on."""
    if not q.error_text:
        page = await list_tasks(conn, q, limit, after)
        return page, _key(page[-1]) if len(page) == limit else None
    w = _where(dataclasses.replace(q, error_text=None))
    w.clauses.append("error_message IS NOT NULL")
    if after is not None:
        w.args.extend(after)
        w.clauses.append(f"(created_ms, task_id) < (${len(w.args) - 1}, ${len(w.args)})")
    w.args.extend([f"%{_escape_like(q.error_text)}%", scan_rows_max, limit])
    text_at, scan_at, limit_at = (f"${len(w.args) - i}" for i in (2, 1, 0))
    # The walk reads keys only (an index-only scan of tasks_tenant_errors when no other
    # filter is given); the chosen rows are then fetched by id.
    sql = f"""
        WITH scanned AS MATERIALIZED (
            SELECT created_ms, task_id, error_message ILIKE {text_at} AS hit FROM tasks
            WHERE {w.sql()} ORDER BY created_ms DESC, task_id DESC LIMIT {scan_at}
        ), picked AS (
            (SELECT task_id, false AS edge FROM scanned WHERE hit
             ORDER BY created_ms DESC, task_id DESC LIMIT {limit_at})
            UNION ALL
            (SELECT task_id, true AS edge FROM scanned
             WHERE (SELECT count(*) FROM scanned) = {scan_at}
             ORDER BY created_ms, task_id LIMIT 1)
        )
        SELECT {_QUALIFIED}, picked.edge FROM picked JOIN tasks t USING (task_id)
        ORDER BY t.created_ms DESC, t.task_id DESC
    """
    rows: list[dict[str, Any]] = []
    edge = None  # the oldest row examined, when the scan stopped at its bound
    for record in await conn.fetch(sql, *w.args):
        row = dict(record)
        if row.pop("edge"):
            edge = row
        else:
            rows.append(row)
    if len(rows) == limit:
        return rows, _key(rows[-1])
    return rows, _key(edge) if edge is not None else None


def _key(row: dict[str, Any]) -> tuple[int, str]:
    return int(row["created_ms"]), str(row["task_id"])


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
    """The exact count, however long it takes (bulk operations, off the request path)."""
    w = _where(q)
    return int(await conn.fetchval(f"SELECT count(*) FROM tasks WHERE {w.sql()}", *w.args))


async def count_or_estimate(
    pool: asyncpg.Pool, q: TaskQuery, *, budget_ms: int = COUNT_BUDGET_MS
) -> tuple[int, bool]:
    """(count, exact): exact if counting takes at most ``budget_ms``, else the planner's
    estimate of the matching rows."""
    w = _where(q)
    async with pool.acquire() as conn:
        try:
            async with conn.transaction():
                await conn.execute(f"SET LOCAL statement_timeout = {int(budget_ms)}")
                sql = f"SELECT count(*) FROM tasks WHERE {w.sql()}"
                return int(await conn.fetchval(sql, *w.args)), True
        except asyncpg.QueryCanceledError:
            plan = await conn.fetchval(
                f"EXPLAIN (FORMAT JSON) SELECT 1 FROM tasks WHERE {w.sql()}", *w.args
            )
    return int(json.loads(plan)[0]["Plan"]["Plan Rows"]), False


# An ENQUEUED task whose ready_ms is still ahead was enqueued with a delay and is not due:
# it is counted as delayed, and the oldest ready task is the oldest that is due (a task
# delayed by an hour and a half is not a queue stuck for ten minutes).
QUEUE_DEPTH = """
SELECT queue, status, count(*) AS n,
       min(ready_ms) FILTER (WHERE status = 'ENQUEUED' AND ready_ms <= $2) AS ready,
       count(*) FILTER (WHERE status = 'ENQUEUED' AND ready_ms > $2) AS delayed,
       min(ready_ms) FILTER (WHERE status = 'ENQUEUED' AND ready_ms > $2) AS next_due
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
    """Per queue of ``tenant``: depth by state, age of the oldest ready task that is due, the
    tasks enqueued with a delay that are not due yet and when the next is, and throughput and
    error rate over the last 1, 5 and 60 minutes."""
    out: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        return out.setdefault(
            name,
            {
                "queue": name,
                "depth": {},
                "oldest_ready_age_ms": None,
                "delayed": 0,
                "next_due_in_ms": None,
                "windows": {},
            },
        )

    for r in await conn.fetch(QUEUE_DEPTH, tenant, now_ms):
        e = entry(r["queue"])
        e["depth"][r["status"]] = int(r["n"])
        if r["ready"] is not None:
            e["oldest_ready_age_ms"] = max(0, now_ms - int(r["ready"]))
        if r["next_due"] is not None:
            e["delayed"] = int(r["delayed"])
            e["next_due_in_ms"] = max(0, int(r["next_due"]) - now_ms)
    for window_s in WINDOWS_S:
        for r in await conn.fetch(QUEUE_WINDOW, tenant, now_ms - window_s * 1000):
            finished, errors = int(r["finished"]), int(r["errors"])
            entry(r["queue"])["windows"][f"{window_s}s"] = {
                "finished_per_s": round(finished / window_s, 3),
                "error_rate": round(errors / finished, 4) if finished else 0.0,
            }
    return sorted(out.values(), key=lambda e: str(e["queue"]))


RUNNING_MAX = 1_000  # leased tasks listed per tenant (GET /v1/agents)


async def running_by_agent(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, limit: int = RUNNING_MAX
) -> dict[str, list[dict[str, Any]]]:
    """The tenant's LEASED tasks by agent id, longest running first, at most ``limit``."""
    rows = await conn.fetch(
        "SELECT agent_id, task_id, app, task_type, queue, attempt, leased_ms FROM tasks"
        " WHERE tenant = $1 AND status = 'LEASED' AND agent_id IS NOT NULL"
        " ORDER BY leased_ms LIMIT $2",
        tenant,
        limit,
    )
    out: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        row = dict(r)
        out.setdefault(row.pop("agent_id"), []).append(row)
    return out


def with_paused(listed: list[dict[str, Any]], paused: dict[str, int]) -> list[dict[str, Any]]:
    """The queue list with each queue's pause (from the partitions' state, not the snapshot):
    ``paused``, and ``paused_partitions`` where a pause reached some partitions only. A paused
    queue without tasks is listed too, so that it can be resumed."""
    out = {q["queue"]: q for q in listed}
    for name in paused:
        out.setdefault(
            name,
            {"queue": name, "depth": {}, "oldest_ready_age_ms": None, "delayed": 0,
             "next_due_in_ms": None, "windows": {}},
        )  # fmt: skip
    for name, entry in out.items():
        entry["paused"] = name in paused
        entry["paused_partitions"] = paused.get(name, 0)
    return sorted(out.values(), key=lambda e: str(e["queue"]))


async def tasks_by_state(conn: asyncpg.Connection | asyncpg.Pool) -> list[tuple[str, str, int]]:
    """(queue, status, count) over every tenant, for the ``conveyor_tasks`` gauge."""
    rows = await conn.fetch("SELECT queue, status, count(*) AS n FROM tasks GROUP BY 1, 2")
    return [(r["queue"], r["status"], int(r["n"])) for r in rows]


# -- steps: the history of ended tasks (a live task's rows are in its partition's state) -----

STEP_COLUMNS = "identity, position, claims, value, wake_at_ms"


async def projected_version(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, task_id: str
) -> int | None:
    """The log offset of the newest event of the task folded into the snapshot."""
    sql = "SELECT version FROM tasks WHERE tenant = $1 AND task_id = $2"
    version = await conn.fetchval(sql, tenant, task_id)
    return None if version is None else int(version)


async def step_rows(
    conn: asyncpg.Connection | asyncpg.Pool,
    tenant: str,
    task_id: str,
    *,
    after: str | None = None,
    limit: int | None = None,
) -> list[StepRow]:
    """A task's steps in identity order (byte order, as in RocksDB: ``COLLATE "C"``),
    from the one after ``after``, at most ``limit``."""
    sql = f"SELECT {STEP_COLUMNS} FROM steps WHERE tenant = $1 AND task_id = $2"
    args: list[Any] = [tenant, task_id]
    if after is not None:
        args.append(after)
        sql += f' AND identity COLLATE "C" > ${len(args)}'
    sql += ' ORDER BY identity COLLATE "C"'
    if limit is not None:
        args.append(limit)
        sql += f" LIMIT ${len(args)}"
    rows = await conn.fetch(sql, *args)
    return [
        StepRow(
            identity=r["identity"],
            position=r["position"],
            claims=r["claims"],
            value=None if r["value"] is None else bytes(r["value"]),
            wake_at_ms=r["wake_at_ms"],
        )
        for r in rows
    ]
