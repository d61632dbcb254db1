"""What an operator asks of a tenant's queues and agents: the history of a queue over the last
hour or day (``GET /v1/stats/history``, from the snapshot's queue history), pausing and resuming
a queue (``POST /v1/queues/{queue}/pause|resume``), and the agents that poll this node
(``GET /v1/agents``).

Parsing follows validation.py: one small function per request, every error naming its field.
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec
from aiohttp import web

from conveyor.contract import replies as out
from conveyor.errors import ContractError
from conveyor.store.postgres import history, queries
from conveyor.streams.gateway import routes
from conveyor.streams.gateway.fields import Fields, check_client_name, invalid
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


async def queue_history(gw: Gateway, q: history.HistoryQuery) -> out.QueueHistory:
    if gw.snapshot is None:
        raise ContractError(
            "queue history needs the Postgres snapshot; run the node without --no-projection",
            field=None,
        )
    # The snapshot's history is a dict; converting checks it against the model.
    return msgspec.convert(
        await history.read(gw.snapshot, q, gw.node.clock.now_ms()), out.QueueHistory
    )


async def agents(gw: Gateway, tenant: str) -> out.Agents:
    """The agents polling this node for ``tenant``, with their running tasks when the snapshot
    can say (seen_agents.py)."""
    running = None
    if gw.snapshot is not None:
        running = await queries.running_by_agent(gw.snapshot, tenant)
    now_ms = gw.node.clock.now_ms()
    listed = gw.agents.of_tenant(tenant, now_ms, running)  # dicts, with the snapshot's rows
    return msgspec.convert({"agents": listed, "now_ms": now_ms}, out.Agents)


def parse_queue(text: str) -> str:
    """A queue named in a path: a name as an enqueue's ``queue`` is one (``schemas/limits.py``),
    the path parameter's pattern in the document. Any other text names no queue a task could
    be in, so pausing it would answer 200 and hold nothing: a 400 naming the character."""
    return check_client_name(text, "queue")


async def pause_queue(gw: Gateway, tenant: str, queue: str, *, paused: bool) -> out.QueuePaused:
    """Pause or resume ``queue`` on every partition (``machine/handlers/queues.py``)."""
    await gw.node.pause_queue(tenant, queue, paused=paused)
    return out.QueuePaused(queue=queue, paused=paused)


async def stats_history(request: web.Request) -> web.Response:
    gw, tenant = routes.context(request)
    return routes.reply(await queue_history(gw, parse_history(tenant, request.query)))


async def list_agents(request: web.Request) -> web.Response:
    gw, tenant = routes.context(request)
    return routes.reply(await agents(gw, tenant))


async def pause(request: web.Request) -> web.Response:
    gw, tenant = routes.context(request)
    queue = parse_queue(request.match_info["queue"])
    await routes.no_body(request)
    return routes.reply(await pause_queue(gw, tenant, queue, paused=True))


async def resume(request: web.Request) -> web.Response:
    gw, tenant = routes.context(request)
    queue = parse_queue(request.match_info["queue"])
    await routes.no_body(request)
    return routes.reply(await pause_queue(gw, tenant, queue, paused=False))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/queues/{queue}/pause", pause)
    app.router.add_post("/v1/queues/{queue}/resume", resume)
    app.router.add_get("/v1/stats/history", stats_history, allow_head=False)
    app.router.add_get("/v1/agents", list_agents, allow_head=False)
