"""What an operator asks of a tenant's queues and agents: the history of a queue over the last
hour or day (``GET /v1/stats/history``, from the snapshot's queue history).

Parsing follows validation.py: one small function per request, every error naming its field.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from aiohttp import web

from conveyor.errors import ContractError
from conveyor.store.postgres import history
from conveyor.streams.gateway import routes
from conveyor.streams.gateway.fields import Fields, invalid
from conveyor.streams.gateway.service import Gateway

_HISTORY_FIELDS = ("window", "queue", "task_type")


def parse_history(tenant: str, query: Mapping[str, str]) -> history.HistoryQuery:
    q = Fields(dict(query), "", _HISTORY_FIELDS)
    window = q.raw("window") or "1h"
    if window not in history.WINDOWS_MS:
        known = "|".join(history.WINDOWS_MS)
        raise invalid("window", f"{window[:32]!r} is not a window; expected {known}")
    return history.HistoryQuery(
        tenant=tenant, window=window, queue=q.opt_str("queue"), task_type=q.opt_str("task_type")
    )


async def queue_history(gw: Gateway, q: history.HistoryQuery) -> dict[str, Any]:
    if gw.snapshot is None:
        raise ContractError(
            "queue history needs the Postgres snapshot; run the node without --no-projection",
            field=None,
        )
    return await history.read(gw.snapshot, q, gw.node.clock.now_ms())


async def stats_history(request: web.Request) -> web.Response:
    gw, tenant = routes.context(request)
    return routes.reply(await queue_history(gw, parse_history(tenant, request.query)))


def add_routes(app: web.Application) -> None:
    app.router.add_get("/v1/stats/history", stats_history, allow_head=False)
