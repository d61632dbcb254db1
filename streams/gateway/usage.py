"""``GET /v1/tenants/me/usage``: what the caller's tenant has in the system right now.

Tasks by status come from the Postgres snapshot when the node runs the projector (one
``GROUP BY`` over the tenant's rows; it trails the processors by the projection lag), else
from the RocksDB scan that listing uses, page by page (``listing.list_tasks``), yielding to
the event loop between pages and stopping after ``SCAN_PAGES_MAX`` pages (``complete``:
false). ``running`` is the LEASED count.

``dispatch`` (leases granted to this tenant / to all tenants over the last minutes) is folded
into ``Metrics.dispatch_window`` by the node's processors as they commit (``Metrics.watch``),
with or without the projector.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import asyncpg
from aiohttp import web

from conveyor.contract import replies as out
from conveyor.schemas.types import TaskStatus
from conveyor.store.postgres import StoreUnavailable
from conveyor.streams.gateway import listing, routes
from conveyor.streams.gateway.service import Gateway
from conveyor.streams.gateway.validation import TaskFilter
from conveyor.streams.sinks.metrics import Metrics

PATH = "/v1/tenants/me/usage"
SCAN_PAGES_MAX = 100  # x listing.SCAN_ROWS_MAX rows examined at most
BY_STATUS = "SELECT status, count(*) AS n FROM tasks WHERE tenant = $1 GROUP BY status"


async def snapshot_counts(pool: asyncpg.Pool, tenant: str) -> dict[str, int]:
    try:
        rows = await pool.fetch(BY_STATUS, tenant)
    except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
        raise StoreUnavailable(f"the query snapshot is unavailable: {exc}") from exc
    return {str(r["status"]): int(r["n"]) for r in rows}


async def scan_counts(gw: Gateway, tenant: str) -> tuple[dict[str, int], bool]:
    """Counts by status from the RocksDB scan, and whether the scan saw every row."""
    counts: dict[str, int] = {}
    cursor: str | None = None
    for _ in range(SCAN_PAGES_MAX):
        tasks, cursor = listing.list_tasks(
            gw.node, tenant, TaskFilter(), listing.SCAN_ROWS_MAX, cursor
        )
        for task in tasks:
            counts[task.status.value] = counts.get(task.status.value, 0) + 1
        if cursor is None:
            return counts, True
        await asyncio.sleep(0)  # a page is ~10,000 rows: let other requests run
    return counts, False


async def usage(gw: Gateway, metrics: Metrics | None, tenant: str) -> out.Usage:
    source: Literal["snapshot", "scan"]
    if gw.snapshot is not None:
        counts, source, complete = await snapshot_counts(gw.snapshot, tenant), "snapshot", True
    else:
        (counts, complete), source = await scan_counts(gw, tenant), "scan"
    tasks = {s.value: counts.get(s.value, 0) for s in TaskStatus}
    dispatch: dict[str, Any] | None = None
    if metrics is not None:
        window = metrics.dispatch_window
        recent = window.counts(gw.node.clock.now_ms())
        mine, everyone = recent.get(tenant, 0), sum(recent.values())
        dispatch = {
            "window_s": window.window_ms // 1000,
            "dispatched": mine,
            "dispatched_all_tenants": everyone,
            "share": round(mine / everyone, 4) if everyone else None,
        }
    return out.Usage(
        tenant=tenant,
        source=source,
        complete=complete,
        tasks=tasks,
        total=sum(tasks.values()),
        running=tasks[TaskStatus.LEASED.value],
        dispatch=dispatch,  # a dict: the model leaves its fields free-form
    )


def add_route(app: web.Application, metrics: Metrics | None) -> None:
    async def handler(request: web.Request) -> web.Response:
        gw, tenant = routes.context(request)
        return routes.reply(await usage(gw, metrics, tenant))

    app.router.add_get(PATH, handler, allow_head=False)
