"""The webhook routes: parse -> validate -> ``Webhooks`` (``deliver.py``) -> JSON.

    POST   /v1/webhooks {url, events, task_types?}     -> 201 {webhook_id, secret, ...}
    GET    /v1/webhooks                                -> {webhooks: [...]}  (no secrets)
    DELETE /v1/webhooks/{webhook_id}                   -> {webhook_id, deleted: true}
    GET    /v1/webhooks/{webhook_id}/deliveries?status=&limit=  -> {deliveries: [...]}
    POST   /v1/webhooks/{webhook_id}/deliveries/{delivery_id}:redeliver -> 202

Rule 1: a webhook is its tenant's: another tenant's id is the same 404 as a missing one.
Rule 2: the URL is checked before anything is stored (``addresses.py``): a refused one is a
400 saying which address and which flag would allow it.
Rule 3: the secret is in the answer to the POST only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from pathlib import Path
from typing import Any

from aiohttp import web

from conveyor.contract import replies as out
from conveyor.errors import Conflict, ContractError, NotFound
from conveyor.streams.clock import Clock
from conveyor.streams.gateway import routes
from conveyor.streams.log.api import Log
from conveyor.streams.webhooks.addresses import check_url
from conveyor.streams.webhooks.deliver import Settings, Webhooks
from conveyor.streams.webhooks.store import FAILED, FILE_NAME, PENDING, SUCCEEDED, Store
from conveyor.streams.webhooks.stream import EVENT_TYPES

log = logging.getLogger("conveyor.webhooks")
RESTART_MS = 1_000  # after the deliverer failed, before it starts again from its cursor
WEBHOOKS = web.AppKey("webhooks", Webhooks)
WEBHOOKS_PER_TENANT_MAX = 32
TASK_TYPES_MAX = 64
NAME_CHARS_MAX = 200
DELIVERIES_LIMIT_DEFAULT = 50
DELIVERIES_LIMIT_MAX = 1_000
_FIELDS = frozenset({"url", "events", "task_types"})
_STATUSES = (PENDING, SUCCEEDED, FAILED)


def _service(request: web.Request) -> tuple[Webhooks, str]:
    _, tenant = routes.context(request)
    service = request.app.get(WEBHOOKS)
    if service is None:
        raise NotFound("this node does not deliver webhooks (it was built without them)")
    return service, tenant


def _names(body: dict[str, Any], name: str, known: frozenset[str] | None, most: int) -> list[str]:
    value = body.get(name)
    if not isinstance(value, list) or not value:
        raise ContractError(f"{name}: must be a non-empty list of strings", field=name)
    if len(value) > most:
        raise ContractError(f"{name}: {len(value)} items, over the limit of {most}", field=name)
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item or len(item) > NAME_CHARS_MAX:
            raise ContractError(
                f"{name}[{i}]: must be a string of 1 to {NAME_CHARS_MAX} characters",
                field=f"{name}[{i}]",
            )
        if known is not None and item not in known:
            raise ContractError(
                f"{name}[{i}]: {item!r} is not an event type; one of {', '.join(sorted(known))}",
                field=f"{name}[{i}]",
            )
    return value


async def create(request: web.Request) -> web.Response:
    service, tenant = _service(request)
    body = await routes.read_body(request)
    if not isinstance(body, dict):
        raise ContractError("body: must be a JSON object {url, events, task_types?}")
    unknown = sorted(set(body) - _FIELDS)
    if unknown:
        raise ContractError(
            f"{unknown[0]}: unknown field (url, events, task_types)", field=unknown[0]
        )
    events = frozenset(_names(body, "events", EVENT_TYPES, len(EVENT_TYPES)))
    task_types = None
    if body.get("task_types") is not None:
        task_types = frozenset(_names(body, "task_types", None, TASK_TYPES_MAX))
    url = await check_url(body.get("url"), service.settings.policy)
    if len(service.of_tenant(tenant)) >= WEBHOOKS_PER_TENANT_MAX:
        raise Conflict(
            f"tenant has {WEBHOOKS_PER_TENANT_MAX} webhooks, the most it may; delete one first"
        )
    hook = await service.create(tenant, url, events, task_types)
    return routes.reply(out.NewWebhook(**hook.public(), secret=hook.secret), 201)


async def list_webhooks(request: web.Request) -> web.Response:
    service, tenant = _service(request)
    hooks = [out.Webhook(**h.public()) for h in service.of_tenant(tenant)]
    return routes.reply(out.Webhooks(webhooks=hooks))


async def delete(request: web.Request) -> web.Response:
    service, tenant = _service(request)
    webhook_id = request.match_info["webhook_id"]
    await service.delete(tenant, webhook_id)
    return routes.reply(out.WebhookDeleted(webhook_id=webhook_id, deleted=True))


async def deliveries(request: web.Request) -> web.Response:
    service, tenant = _service(request)
    status = request.query.get("status") or None
    if status is not None and status not in _STATUSES:
        raise ContractError(f"status: must be one of {', '.join(_STATUSES)}", field="status")
    text = request.query.get("limit", "")
    digits = re.fullmatch(r"[0-9]{1,9}", text) is not None
    limit = int(text) if digits else DELIVERIES_LIMIT_DEFAULT if text == "" else -1
    if not 1 <= limit <= DELIVERIES_LIMIT_MAX:
        raise ContractError(
            f"limit: must be an integer from 1 to {DELIVERIES_LIMIT_MAX}", field="limit"
        )
    webhook_id = request.match_info["webhook_id"]
    found = await service.deliveries(tenant, webhook_id, status, limit)
    listed = [out.Delivery(**d.public()) for d in found]
    return routes.reply(out.Deliveries(webhook_id=webhook_id, deliveries=listed))


async def redeliver(request: web.Request) -> web.Response:
    service, tenant = _service(request)
    webhook_id, delivery_id = request.match_info["webhook_id"], request.match_info["delivery_id"]
    await routes.no_body(request)
    await service.redeliver(tenant, webhook_id, delivery_id)
    return routes.reply(out.Redelivered(delivery_id=delivery_id, status="pending"))


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/webhooks", create)
    app.router.add_get("/v1/webhooks", list_webhooks, allow_head=False)
    app.router.add_delete("/v1/webhooks/{webhook_id}", delete)
    app.router.add_get("/v1/webhooks/{webhook_id}/deliveries", deliveries, allow_head=False)
    app.router.add_post("/v1/webhooks/{webhook_id}/deliveries/{delivery_id}:redeliver", redeliver)


def attach(
    app: web.Application,
    home: Path,
    events: Log,
    settings: Settings,
    *,
    clock: Clock | None = None,
) -> Webhooks:
    """Give ``app`` the webhooks of ``home`` (``home/webhooks.sqlite3``): the registrations load
    and the deliverer starts with the app, and stop with it."""
    service = Webhooks(Store(home / FILE_NAME), events, settings, clock=clock)
    app[WEBHOOKS] = service
    runner: list[asyncio.Task[None]] = []

    async def supervise() -> None:
        while True:
            try:
                await service.run()
            except Exception:
                log.exception("webhooks: the deliverer failed; restarting from its cursor")
            await service.clock.sleep_ms(RESTART_MS)

    async def start(_: web.Application) -> None:
        await service.load()
        runner.append(asyncio.create_task(supervise()))

    async def stop(_: web.Application) -> None:
        for task in runner:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        service.store.close()

    app.on_startup.append(start)
    app.on_cleanup.append(stop)
    return service
