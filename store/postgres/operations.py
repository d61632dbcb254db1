"""The ``operations`` table: durable progress of bulk operations (retry or cancel by filter).

Rules:
1. The filter is frozen at creation: ``created_to_ms`` is set to the creation time when the
   caller gave none, so tasks created while the operation runs (a bulk retry's own new tasks
   among them) are never picked up, and the matched set only shrinks.
2. Progress moves forward only: ``advance`` writes the cursor of the last task done together
   with the counters, in one statement, after the batch was applied. A batch done again after
   a crash (submitted, not yet advanced) is harmless: the state machine ignores a retry of a
   retried task and a cancel of a canceled one.
3. Every read is scoped to the tenant, like the task queries.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

import asyncpg

from conveyor.errors import InvariantError
from conveyor.frozen import frozen
from conveyor.store.postgres.queries import TaskQuery

RUNNING = "running"
DONE = "done"
FAILED = "failed"

_COLUMNS = (
    "operation_id, tenant, kind, filter, reason, limit_tasks, state, matched, done, changed, "
    "cursor_created_ms, cursor_task_id, created_ms, updated_ms, error"
)


@frozen(kw_only=True)
class Operation:
    operation_id: str
    tenant: str
    kind: str  # "retry" | "cancel"
    query: TaskQuery
    reason: str | None
    limit_tasks: int | None
    state: str
    matched: int | None
    done: int
    changed: int
    cursor: tuple[int, str] | None
    created_ms: int
    updated_ms: int
    error: str | None


def query_json(q: TaskQuery) -> str:
    fields = dataclasses.asdict(q)
    fields["statuses"] = list(q.statuses)
    return json.dumps(fields, separators=(",", ":"))


def query_of(text: str) -> TaskQuery:
    fields = json.loads(text)
    fields["statuses"] = tuple(fields["statuses"])
    return TaskQuery(**fields)


def _row(r: asyncpg.Record) -> Operation:
    cursor = None
    if r["cursor_task_id"] is not None:
        cursor = (int(r["cursor_created_ms"]), str(r["cursor_task_id"]))
    return Operation(
        operation_id=r["operation_id"],
        tenant=r["tenant"],
        kind=r["kind"],
        query=query_of(r["filter"]),
        reason=r["reason"],
        limit_tasks=r["limit_tasks"],
        state=r["state"],
        matched=r["matched"],
        done=int(r["done"]),
        changed=int(r["changed"]),
        cursor=cursor,
        created_ms=int(r["created_ms"]),
        updated_ms=int(r["updated_ms"]),
        error=r["error"],
    )


async def create(
    conn: asyncpg.Connection | asyncpg.Pool,
    *,
    operation_id: str,
    kind: str,
    query: TaskQuery,
    reason: str | None,
    limit_tasks: int | None,
    now_ms: int,
) -> Operation:
    if query.created_to_ms is None or query.created_to_ms > now_ms + 1:
        query = dataclasses.replace(query, created_to_ms=now_ms + 1)  # rule 1
    row = await conn.fetchrow(
        f"INSERT INTO operations (operation_id, tenant, kind, filter, reason, limit_tasks, "
        f"state, created_ms, updated_ms) VALUES ($1, $2, $3, $4::jsonb, $5, $6, $7, $8, $8) "
        f"RETURNING {_COLUMNS}",
        operation_id,
        query.tenant,
        kind,
        query_json(query),
        reason,
        limit_tasks,
        RUNNING,
        now_ms,
    )
    if row is None:
        raise InvariantError("the operations query returned no row")
    return _row(row)


async def get(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, operation_id: str
) -> Operation | None:
    row = await conn.fetchrow(
        f"SELECT {_COLUMNS} FROM operations WHERE tenant = $1 AND operation_id = $2",
        tenant,
        operation_id,
    )
    return None if row is None else _row(row)


async def running(conn: asyncpg.Connection | asyncpg.Pool) -> list[Operation]:
    """Every unfinished operation, oldest first: what a starting node resumes."""
    rows = await conn.fetch(
        f"SELECT {_COLUMNS} FROM operations WHERE state = $1 ORDER BY created_ms", RUNNING
    )
    return [_row(r) for r in rows]


async def set_matched(
    conn: asyncpg.Connection | asyncpg.Pool, operation_id: str, matched: int, now_ms: int
) -> None:
    await conn.execute(
        "UPDATE operations SET matched = $2, updated_ms = $3 WHERE operation_id = $1",
        operation_id,
        matched,
        now_ms,
    )


async def advance(
    conn: asyncpg.Connection | asyncpg.Pool,
    operation_id: str,
    *,
    cursor: tuple[int, str],
    done: int,
    changed: int,
    now_ms: int,
) -> None:
    """Record one more batch: its last key and how many tasks it did and changed (rule 2)."""
    await conn.execute(
        "UPDATE operations SET cursor_created_ms = $2, cursor_task_id = $3, done = done + $4, "
        "changed = changed + $5, updated_ms = $6 WHERE operation_id = $1",
        operation_id,
        cursor[0],
        cursor[1],
        done,
        changed,
        now_ms,
    )


async def finish(
    conn: asyncpg.Connection | asyncpg.Pool,
    operation_id: str,
    state: str,
    now_ms: int,
    error: str | None = None,
) -> None:
    """``matched`` was counted from the snapshot at the start, which lags the node by the
    projection lag: a task enqueued just before the operation, projected later, is walked
    and done without having been counted. A finished operation counts it too."""
    await conn.execute(
        "UPDATE operations SET state = $2, updated_ms = $3, error = $4, "
        "matched = CASE WHEN $2 = 'done' THEN GREATEST(matched, done) ELSE matched END "
        "WHERE operation_id = $1",
        operation_id,
        state,
        now_ms,
        error,
    )


def as_json(op: Operation) -> dict[str, Any]:
    """The operation as ``GET /v1/operations/{id}`` answers it."""
    flt = {k: v for k, v in dataclasses.asdict(op.query).items() if k != "tenant"}
    flt["statuses"] = list(op.query.statuses)
    return {
        "operation_id": op.operation_id,
        "kind": op.kind,
        "state": op.state,
        "matched": op.matched,
        "done": op.done,
        "changed": op.changed,
        "limit": op.limit_tasks,
        "filter": flt,
        "created_ms": op.created_ms,
        "updated_ms": op.updated_ms,
        "error": op.error,
    }
