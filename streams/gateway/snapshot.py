"""Listing from the Postgres query snapshot (when the node runs the projector).

The snapshot trails the processors by the projection lag (normally well under a second): a
task enqueued a moment ago may not be listed yet, while ``GET /v1/tasks/{id}`` (answered by
its processor) always sees it. Listing needs filters and pages over millions of rows; the
processors' RocksDB scans cannot give that, Postgres indexes can.

Read your writes: before it reads, a listing waits (up to ``FRESH_WAIT_MS``) until the
snapshot holds every record the node's processors had applied when the request came in, so a
task whose enqueue was acknowledged, to this client or to any other, is listed. For each
partition this node leads, in two steps: its outbox ships the events of those records to the
events stream, then the projector's watermark passes the end of the stream as it stood once
they were in. Past the wait the page is served as it is, with ``may_trail`` true. The position
is the node's, not the client's: no client has to carry one from its enqueue to its listing
(a shell's ``conveyor enqueue`` then ``conveyor list`` are two processes).

The cursor is opaque to clients: base64url of ``<created_ms>:<task id>`` of the last row
examined. A search by error text examines a bounded number of rows per page, so its pages may
be short (even empty) while ``next_cursor`` is set. ``count`` is exact when it is cheap and
otherwise the planner's estimate, with ``count_exact`` saying which (``queries.py``).
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

import asyncpg

from conveyor.contract import replies as out
from conveyor.errors import ContractError
from conveyor.store.postgres import StoreUnavailable, queries
from conveyor.streams.gateway.fields import check_task_id
from conveyor.streams.gateway.render import error_reply
from conveyor.streams.gateway.validation import ListQuery, TaskFilter
from conveyor.streams.node import Node
from conveyor.streams.sinks.projector import Progress

FRESH_WAIT_MS = 2_000.0  # a listing waits at most this long for the snapshot to pass it
FRESH_POLL_MS = 5.0  # how often it looks while waiting


def encode_cursor(created_ms: int, task_id: str) -> str:
    return base64.urlsafe_b64encode(f"{created_ms}:{task_id}".encode()).decode()


def decode_cursor(text: str) -> tuple[int, str]:
    try:
        raw = base64.urlsafe_b64decode(text.encode("ascii")).decode("ascii")
        created, task_id = raw.split(":", 1)
        check_task_id(task_id, "cursor")
        return int(created), task_id
    except (ValueError, UnicodeError, binascii.Error, ContractError):
        raise ContractError(
            "cursor: not a cursor this server issued; pass next_cursor back unchanged",
            field="cursor",
        ) from None


def task_query(tenant: str, flt: TaskFilter) -> queries.TaskQuery:
    return queries.TaskQuery(
        tenant=tenant,
        statuses=tuple(sorted(s.value for s in flt.statuses)),
        queue=flt.queue,
        task_type=flt.task_type,
        error_class=flt.error_class,
        error_text=flt.error_text,
        created_from_ms=flt.since_ms,
        created_to_ms=flt.created_to_ms,
        finished_from_ms=flt.finished_from_ms,
        finished_to_ms=flt.finished_to_ms,
        payload_fields=flt.payload_fields,
    )


def summary(row: dict[str, Any]) -> out.TaskSummary:
    """A snapshot row as ``render.task_summary`` renders a task. The events do not carry
    priority, run_at or the error stack, so those are null here; a pending cancel shows as
    the last event having been CancelRequested on a LEASED task."""
    return out.TaskSummary(
        task_id=row["task_id"],
        app=row["app"],
        task_type=row["task_type"],
        queue=row["queue"],
        priority=None,
        status=row["status"],
        attempt=row["attempt"],
        created_ms=row["created_ms"],
        updated_ms=row["updated_ms"],
        run_at_ms=None,
        finished_ms=row["finished_ms"],
        error=error_reply(row["error_class"], row["error_message"], None),
        cancel_requested=row["status"] == "LEASED" and row["last_event"] == "CancelRequested",
    )


async def list_tasks(pool: asyncpg.Pool, tenant: str, query: ListQuery) -> out.TaskPage:
    q = task_query(tenant, query.filter)
    after = decode_cursor(query.cursor) if query.cursor else None
    try:
        return await _page(pool, q, query, after)
    except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
        raise StoreUnavailable(f"the query snapshot is unavailable: {exc}") from exc


async def _page(
    pool: asyncpg.Pool, q: queries.TaskQuery, query: ListQuery, after: tuple[int, str] | None
) -> out.TaskPage:
    rows, resume = await queries.list_page(pool, q, query.limit, after)
    cursor = encode_cursor(*resume) if resume is not None else None
    page = out.TaskPage(tasks=[summary(r) for r in rows], next_cursor=cursor)
    if query.count:
        page.count, page.count_exact = await queries.count_or_estimate(pool, q)
    return page


async def wait_fresh(node: Node, progress: Progress, wait_ms: float = FRESH_WAIT_MS) -> bool:
    """Wait until the snapshot holds what this node's processors have applied now (the
    module's docstring); whether it does, rather than the wait ran out."""
    clock = node.clock
    deadline = clock.monotonic_ms() + wait_ms
    applied = {
        p: processor.applied
        for p, processor in enumerate(node.processors)
        if processor.leader and processor.applied >= 0
    }
    ends: dict[int, int] = {}  # per partition: the events stream's end once its events are in
    while True:
        for p in [p for p in applied if p not in ends]:
            if not node.processors[p].outbox.holds_through(applied[p]):
                ends[p] = node.events.end_offset(p)
        if len(ends) == len(applied) and all(
            progress.next_offsets.get(p, 0) >= end for p, end in ends.items()
        ):
            return True
        if clock.monotonic_ms() >= deadline:
            return False
        await clock.sleep_ms(FRESH_POLL_MS)
