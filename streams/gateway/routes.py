"""The HTTP handlers: parse -> validate -> call the gateway service -> render. Nothing else."""

from __future__ import annotations

from typing import Any

import msgspec
from aiohttp import web
from msgspec import Struct

from conveyor.contract import replies as out
from conveyor.errors import ContractError
from conveyor.streams.gateway import (
    events,
    operators,
    render,
    schedules,
    validation,
    worker_requests,
)
from conveyor.streams.gateway.auth import Grant
from conveyor.streams.gateway.errors import PayloadTooLarge, UnsupportedMediaType, dumps
from conveyor.streams.gateway.fields import BODY_BYTES_MAX, describe, invalid, parse_json
from conveyor.streams.gateway.service import Gateway
from conveyor.streams.webhooks import api as webhooks_api

_encode = msgspec.json.Encoder().encode
GATEWAY = web.AppKey("gateway", Gateway)
TENANT = web.RequestKey("tenant", str)  # set by the auth middleware
GRANT = web.RequestKey("grant", Grant)  # the key's grant: its tenant, roles and app


def reply(body: Any, status: int = 200) -> web.Response:
    """``body`` as JSON: a reply model (``conveyor.contract.replies``) as msgspec encodes it,
    which is what the document states; a dict as ``json`` does: the OpenAPI documents, the
    worker protocol's replies, and a cluster's merge of the replies of other nodes."""
    if isinstance(body, Struct):
        data = _encode(body)
        return web.Response(
            status=status, body=data, content_type="application/json", charset="utf-8"
        )
    return web.Response(status=status, text=dumps(body), content_type="application/json")


def _is_json(content_type: str) -> bool:
    return content_type == "application/json" or (
        content_type.startswith("application/") and content_type.endswith("+json")
    )


async def read_body(request: web.Request, *, optional: bool = False) -> Any:
    """The JSON body. A body must say it is JSON (415); a declared length over the cap is a
    413 before any byte is read (the client may never send it); the cap also holds for
    chunked and compressed bodies (counted after decompression), and a body that does not
    decompress is a 400."""
    if request.body_exists and not _is_json(request.content_type):
        raise UnsupportedMediaType(
            f"body: Content-Type {request.content_type!r}; send application/json"
        )
    if request.content_length is not None and request.content_length > BODY_BYTES_MAX:
        raise PayloadTooLarge(
            f"body: {request.content_length} bytes; the limit is {BODY_BYTES_MAX}"
        )
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"body: over the limit of {BODY_BYTES_MAX} bytes") from None
    except web.RequestPayloadError as exc:  # bad gzip/deflate, broken chunked framing
        reason = " ".join(str(exc).split())
        raise ContractError(f"body: could not be read: {reason}", field=None) from None
    if optional and not raw.strip():
        return None
    return parse_json(raw)


async def no_body(request: web.Request) -> None:
    """The body of a POST whose operation declares none (a queue's or schedule's pause and
    resume, a redelivery): nothing, ``null`` or ``{}``, which clients send for "no body" (the
    dashboard sends ``null``); anything else is a 400 (``contract/operations.py``, rule 2:
    fields sent to a route that reads none are options its sender expects and would not get).
    """
    body = await read_body(request, optional=True)
    if body is None or body == {}:
        return
    resource = request.match_info.route.resource
    route = f"{request.method} {resource.canonical if resource else request.path}"
    if isinstance(body, dict):
        name = min(body)
        raise invalid(name, f"unknown field: {route} takes no body; send none")
    raise invalid("", f"{route} takes no body; send none, got {describe(body)}")


def context(request: web.Request) -> tuple[Gateway, str]:
    tenant = request[TENANT]
    assert isinstance(tenant, str)
    return request.app[GATEWAY], tenant


def worker_context(request: web.Request) -> tuple[Gateway, Grant]:
    """The gateway and the agent key's grant: worker calls check the app against it."""
    return request.app[GATEWAY], request[GRANT]


# -- client API ----------------------------------------------------------------------------


async def enqueue(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    req = validation.parse_task(await read_body(request))
    (r,) = await gw.enqueue(tenant, [req])
    return reply(render.enqueue_reply(r), 201 if r.created else 200)


async def enqueue_batch(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    reqs = validation.parse_batch(await read_body(request))
    replies = await gw.enqueue(tenant, reqs)
    created = any(r.created for r in replies)
    results = [render.enqueue_reply(r) for r in replies]
    return reply(out.EnqueueBatchReply(results=results), 201 if created else 200)


async def get_task(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    wait_ms = validation.parse_wait_ms(request.query)
    return reply(await gw.task(tenant, request.match_info["task_id"], wait_ms))


async def attempt_log(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    task_id = request.match_info["task_id"]
    lease_id = validation.parse_lease_id(request.match_info["lease_id"])
    log = gw.attempt_log(tenant, task_id, lease_id)
    return reply(out.AttemptLog(task_id=task_id, lease_id=lease_id, log=log))


async def list_tasks(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    return reply(await gw.list_tasks(tenant, validation.parse_list_query(request.query)))


async def list_queues(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    return reply(await gw.queues(tenant))


async def cancel(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    reason = validation.parse_cancel(await read_body(request, optional=True))
    return reply(await gw.cancel(tenant, request.match_info["task_id"], reason))


async def retry(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    req = validation.parse_retry(await read_body(request))
    if req.filter is not None:
        return reply(await gw.bulk_retry(tenant, req.filter, req.limit), 202)
    assert req.task_ids is not None
    return reply(out.RetriedList(retried=await gw.retry(tenant, req.task_ids)))


async def bulk_cancel(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    req = validation.parse_bulk_cancel(await read_body(request))
    return reply(await gw.bulk_cancel(tenant, req), 202)


async def get_operation(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    return reply(await gw.operation(tenant, request.match_info["operation_id"]))


# -- schedules -----------------------------------------------------------------------------


async def upsert_schedule(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    req = schedules.parse_schedule(await read_body(request))
    created, body = await gw.upsert_schedule(tenant, req)
    return reply(body, 201 if created else 200)


async def list_schedules(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    return reply(await gw.schedules(tenant))


async def get_schedule(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    return reply(await gw.schedule(tenant, request.match_info["schedule_id"]))


async def delete_schedule(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    return reply(await gw.delete_schedule(tenant, request.match_info["schedule_id"]))


async def pause_schedule(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    schedule_id = request.match_info["schedule_id"]
    await no_body(request)
    return reply(await gw.pause_schedule(tenant, schedule_id, paused=True))


async def resume_schedule(request: web.Request) -> web.Response:
    gw, tenant = context(request)
    schedule_id = request.match_info["schedule_id"]
    await no_body(request)
    return reply(await gw.pause_schedule(tenant, schedule_id, paused=False))


# -- worker API ----------------------------------------------------------------------------


async def register(request: web.Request) -> web.Response:
    gw, key = worker_context(request)
    warnings = await gw.register(key, worker_requests.parse_register(await read_body(request)))
    return reply(out.Warnings(warnings=warnings))


async def poll(request: web.Request) -> web.Response:
    gw, key = worker_context(request)
    req = worker_requests.parse_poll(await read_body(request))
    return reply({"leases": await gw.poll(key, req)})


async def heartbeat(request: web.Request) -> web.Response:
    gw, key = worker_context(request)
    refs = worker_requests.parse_heartbeat(await read_body(request))
    return reply({"actions": gw.heartbeat(key, refs)})


async def signals(request: web.Request) -> web.Response:
    gw, key = worker_context(request)
    req = worker_requests.parse_signals(await read_body(request))
    return reply({"signals": await gw.signals(key, req)})


async def complete(request: web.Request) -> web.Response:
    gw, key = worker_context(request)
    items = worker_requests.parse_complete(await read_body(request))
    return reply({"results": await gw.complete(key, items)})


async def checkpoint(request: web.Request) -> web.Response:
    gw, key = worker_context(request)
    items = worker_requests.parse_checkpoint(await read_body(request))
    return reply({"results": await gw.checkpoint(key, items)})


async def steps(request: web.Request) -> web.Response:
    gw, key = worker_context(request)
    items = worker_requests.parse_steps(await read_body(request))
    return reply({"results": await gw.steps(key, items)})


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/tasks", enqueue)
    app.router.add_post("/v1/tasks:batch", enqueue_batch)
    app.router.add_post("/v1/tasks:retry", retry)
    app.router.add_post("/v1/tasks:cancel", bulk_cancel)
    app.router.add_get("/v1/operations/{operation_id}", get_operation, allow_head=False)
    app.router.add_get("/v1/tasks", list_tasks, allow_head=False)
    app.router.add_get("/v1/tasks/{task_id}", get_task, allow_head=False)
    app.router.add_get("/v1/tasks/{task_id}/logs/{lease_id}", attempt_log, allow_head=False)
    app.router.add_get("/v1/queues", list_queues, allow_head=False)
    app.router.add_post("/v1/tasks/{task_id}/cancel", cancel)
    app.router.add_post("/v1/schedules", upsert_schedule)
    app.router.add_get("/v1/schedules", list_schedules, allow_head=False)
    app.router.add_get("/v1/schedules/{schedule_id}", get_schedule, allow_head=False)
    app.router.add_delete("/v1/schedules/{schedule_id}", delete_schedule)
    app.router.add_post("/v1/schedules/{schedule_id}/pause", pause_schedule)
    app.router.add_post("/v1/schedules/{schedule_id}/resume", resume_schedule)
    app.router.add_post("/worker/register", register)
    app.router.add_post("/worker/poll", poll)
    app.router.add_post("/worker/heartbeat", heartbeat)
    app.router.add_post("/worker/signals", signals)
    app.router.add_post("/worker/complete", complete)
    app.router.add_post("/worker/checkpoint", checkpoint)
    app.router.add_post("/worker/steps", steps)
    events.add_routes(app)  # GET /v1/events (events.py)
    operators.add_routes(app)  # queue history, pause and resume, agents (operators.py)
    webhooks_api.add_routes(app)  # /v1/webhooks (streams/webhooks/api.py)
