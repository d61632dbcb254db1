"""Workflow reads from the snapshot: the list of workflows, and the times of a workflow's steps.

Listing: the tasks that recorded a step, newest first.

A workflow is a task whose body records steps, so nothing in the ``tasks`` row says it is one:
the ``steps`` table does. A page walks the tenant's tasks that match the filter in listing
order (the same indexes and keyset as ``queries.list_page``) and keeps those with a step row
(a probe of the steps' primary key each). A tenant with many plain tasks would make that walk
long, so a page examines at most ``SCAN_ROWS_MAX`` tasks and may come back short, even empty,
with a cursor to go on from, as a text search does. The kept rows are then read with their
step counts.

Step times: when each step of a workflow started (its row's first event: the claim made before
its body runs) and, once committed, ended (its commit), for the page's timing waterfall. The
partition's live step rows carry no times; the snapshot's trail them by the projection lag.
"""

from __future__ import annotations

from typing import Any

import asyncpg

from conveyor.frozen import frozen
from conveyor.store.postgres.queries import _QUALIFIED, TaskQuery, _escape_like, _where

SCAN_ROWS_MAX = 5_000


@frozen(kw_only=True)
class WorkflowQuery:
    tasks: TaskQuery
    id_prefix: str | None = None  # lowercase hex, checked by the gateway


async def list_workflows(
    conn: asyncpg.Connection | asyncpg.Pool,
    q: WorkflowQuery,
    limit: int,
    after: tuple[int, str] | None = None,
    *,
    scan_rows_max: int = SCAN_ROWS_MAX,
) -> tuple[list[dict[str, Any]], tuple[int, str] | None]:
    """Up to ``limit`` workflows after the keyset ``after``, with ``steps`` and
    ``steps_committed`` counts, and the key to continue after (None: nothing more)."""
    w = _where(q.tasks)
    if q.id_prefix:
        w.add("task_id LIKE ?", f"{_escape_like(q.id_prefix)}%")
    if after is not None:
        w.args.extend(after)
        w.clauses.append(f"(created_ms, task_id) < (${len(w.args) - 1}, ${len(w.args)})")
    w.args.append(scan_rows_max)
    sql = f"""
        SELECT t.created_ms, t.task_id,
               EXISTS (SELECT 1 FROM steps s WHERE s.task_id = t.task_id) AS workflow
        FROM tasks t WHERE {w.sql()}
        ORDER BY t.created_ms DESC, t.task_id DESC LIMIT ${len(w.args)}
    """
    scanned = await conn.fetch(sql, *w.args)
    picked = [r for r in scanned if r["workflow"]][:limit]
    if len(picked) == limit:
        resume: tuple[int, str] | None = _key(picked[-1])
    elif len(scanned) == scan_rows_max:
        resume = _key(scanned[-1])  # the walk stopped at its bound: go on from there
    else:
        resume = None
    if not picked:
        return [], resume
    rows = await conn.fetch(
        f"""
        SELECT {_QUALIFIED},
               (SELECT count(*) FROM steps s WHERE s.task_id = t.task_id) AS steps,
               (SELECT count(*) FROM steps s WHERE s.task_id = t.task_id
                AND s.state = 'COMMITTED') AS steps_committed,
               (SELECT max(s.updated_ms) FROM steps s WHERE s.task_id = t.task_id) AS last_step_ms
        FROM tasks t WHERE t.tenant = $1 AND t.task_id = ANY($2::text[])
        ORDER BY t.created_ms DESC, t.task_id DESC
        """,
        q.tasks.tenant,
        [r["task_id"] for r in picked],
    )
    return [dict(r) for r in rows], resume


def _key(row: Any) -> tuple[int, str]:
    return int(row["created_ms"]), str(row["task_id"])


async def step_times(
    conn: asyncpg.Connection | asyncpg.Pool, tenant: str, task_id: str
) -> dict[str, tuple[int | None, int | None]]:
    """(started_ms, ended_ms) per step identity of ``task_id``; ended is None until the step
    is committed, started None for a row projected before the snapshot kept it."""
    rows = await conn.fetch(
        "SELECT identity, started_ms, updated_ms, state FROM steps "
        "WHERE tenant = $1 AND task_id = $2",
        tenant,
        task_id,
    )
    return {
        r["identity"]: (r["started_ms"], r["updated_ms"] if r["state"] == "COMMITTED" else None)
        for r in rows
    }
