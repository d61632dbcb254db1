"""The gateway's aiohttp application and server (PROTOCOL.md is the contract).

    request -> error middleware -> auth middleware -> forward middleware (a partition led by
            another node of the cluster: to its owner, forward.py) -> routes (parse, validate)
            -> service.Gateway (node calls) -> render -> JSON

Shutdown: stop accepting, give in-flight requests ``SHUTDOWN_GRACE_S`` (long polls are cut
short: an agent just polls again), then return so the caller stops the node. Anything a client
got an acknowledgement for is already durable in the log, so nothing is lost by cutting the rest.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

import asyncpg
import msgspec
from aiohttp import web

from conveyor.contract import replies as out
from conveyor.errors import Unauthorized
from conveyor.store.attempt_logs import AttemptLogs
from conveyor.store.blobs import Blobs
from conveyor.streams.gateway import (
    dashboard,
    forward,
    health,
    openapi,
    reruns,
    routes,
    usage,
    workflows,
)
from conveyor.streams.gateway.auth import KeyStore, authenticate
from conveyor.streams.gateway.breakers import BreakersCollector
from conveyor.streams.gateway.errors import Handler, error_middleware
from conveyor.streams.gateway.fields import BODY_BYTES_MAX
from conveyor.streams.gateway.operations import BulkOperations
from conveyor.streams.gateway.payloads import Payloads
from conveyor.streams.gateway.registry import Registry
from conveyor.streams.gateway.server import GatewayRunner
from conveyor.streams.gateway.service import Gateway
from conveyor.streams.node import Node
from conveyor.streams.registry import routes as registry_routes
from conveyor.streams.sinks.metrics import CONTENT_TYPE, Metrics
from conveyor.streams.sinks.projector import Progress

log = logging.getLogger("conveyor.gateway")

SHUTDOWN_GRACE_S = 2.0
# /metrics takes no tenant key: it has a key of its own (``metrics_route``).
_PUBLIC = frozenset({"/healthz", "/openapi.json", "/registry/openapi.json", "/metrics"})
METRICS = web.AppKey("metrics", Metrics)
METRICS_KEY = web.AppKey("metrics_key", str)  # "": none was given, /metrics answers 401
_TIMED_ROUTES = {"/v1/tasks": "enqueue", "/v1/tasks:batch": "enqueue_batch"}


@web.middleware
async def auth_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    if request.path not in _PUBLIC and not dashboard.is_public(request.path):
        gw = request.app[routes.GATEWAY]
        if forward.NODE_CALL in request.headers:  # another node of the cluster (forward.py)
            grant = await forward.node_grant(request)
        else:
            grant = authenticate(gw.keys, request.headers.get("Authorization"))
            grant.check_path(request.path)  # the key's role (auth.py, rule 1)
        request[routes.GRANT] = grant
        request[routes.TENANT] = grant.tenant
    return await handler(request)


@web.middleware
async def timing_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Enqueue ack latency: one observation per request, the whole request included."""
    route = _TIMED_ROUTES.get(request.path) if request.method == "POST" else None
    if route is None:
        return await handler(request)
    started = time.perf_counter()
    response = await handler(request)
    if response.status < 300:
        request.app[METRICS].enqueue_ack.labels(route).observe(time.perf_counter() - started)
    return response


async def metrics_route(request: web.Request) -> web.Response:
    """The Prometheus exposition, for a bearer of the node's metrics key only: the series
    describe every tenant's traffic (and, with ``--metrics-tenant-labels on``, name them), so
    a tenant's API key does not open them, and a node started without a metrics key serves
    them to nobody."""
    check_metrics_key(request.app[METRICS_KEY], request.headers.get("Authorization"))
    body = request.app[METRICS].exposition()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def check_metrics_key(expected: str, header: str | None) -> None:
    if not expected:
        raise Unauthorized(
            "this node serves /metrics to no one: start it with --metrics-key (or "
            "$CONVEYOR_METRICS_KEY) and send that key as 'Authorization: Bearer <key>'"
        )
    scheme, _, key = (header or "").partition(" ")
    sent = key.strip().encode("utf-8", "surrogateescape")  # bytes: compare_digest takes any
    if scheme.lower() != "bearer" or not hmac.compare_digest(sent, expected.encode()):
        raise Unauthorized(
            "/metrics needs the node's metrics key (--metrics-key, $CONVEYOR_METRICS_KEY) as "
            "'Authorization: Bearer <key>'; an API key does not open it"
        )


async def healthz(request: web.Request) -> web.Response:
    """200 while every partition applies records; 503 naming the halted ones and why (a
    corrupt log, a failed fsync: rule 4 of the processor), so a supervisor or a load
    balancer sees a node that can only serve part of its tasks."""
    node = request.app[routes.GATEWAY].node
    halted = {str(p.partition): repr(p.halted) for p in node.processors if p.halted is not None}
    body = {"ok": not halted, "partitions": node.partitions, **health.leadership(node)}
    if halted:
        body["halted"] = halted
    # health.leadership's rows are dicts; converting checks them against the model.
    return routes.reply(msgspec.convert(body, out.Health), 503 if halted else 200)


async def openapi_json(request: web.Request) -> web.Response:
    # A dict: the document is free-form JSON (its model, Document, names two keys only).
    return routes.reply(openapi.document())


async def registry_openapi_json(request: web.Request) -> web.Response:
    return routes.reply(openapi.registry_document())


def build_app(
    node: Node,
    keys: KeyStore,
    registry: Registry,
    *,
    blobs: Blobs | None = None,
    snapshot: asyncpg.Pool | None = None,
    progress: Progress | None = None,
    metrics: Metrics | None = None,
    logs: AttemptLogs | None = None,
    metrics_key: str | None = None,
) -> web.Application:
    """The gateway. ``snapshot``: list from Postgres (else RocksDB scans), after waiting for
    ``progress`` (its projector's) to pass what the node applied (``snapshot.py``).
    ``metrics``: the process's metrics to serve at /metrics (a fresh set watching ``node`` if
    not given), to bearers of ``metrics_key`` (to nobody without one)."""
    if metrics is None:
        metrics = Metrics()
        metrics.watch(node)
    app = web.Application(
        # forward after auth: a bad key is refused here (forward.py rule 1)
        middlewares=[error_middleware, timing_middleware, auth_middleware, forward.middleware],
        client_max_size=BODY_BYTES_MAX,  # routes.read_body turns the overflow into a 413
    )
    app[routes.GATEWAY] = Gateway(
        node, keys, registry, Payloads(blobs), snapshot=snapshot, progress=progress, logs=logs
    )
    node.pool.caps = lambda tenant: keys.settings(tenant).max_concurrent
    metrics.registry.register(
        BreakersCollector(app[routes.GATEWAY].breakers, node.clock.monotonic_ms)
    )
    app[METRICS] = metrics
    app[METRICS_KEY] = metrics_key or ""
    app.router.add_get("/healthz", healthz, allow_head=False)
    app.router.add_get("/metrics", metrics_route, allow_head=False)
    app.router.add_get("/openapi.json", openapi_json, allow_head=False)
    app.router.add_get("/registry/openapi.json", registry_openapi_json, allow_head=False)
    routes.add_routes(app)
    registry_routes.add_routes(app)  # the schema registry, under /registry
    registry_routes.add_type_routes(app)  # GET /v1/task-types
    forward.add_to(app, node)
    _run_operations(app, app[routes.GATEWAY].operations)
    usage.add_route(app, metrics)
    workflows.add_routes(app)
    reruns.add_routes(app)  # re-runs of tasks, runs of schedules
    dashboard.add_routes(app)
    return app


def _run_operations(app: web.Application, operations: BulkOperations | None) -> None:
    """Resume unfinished bulk operations when serving starts; stop their runners (they stay
    resumable) when it ends, before the caller closes the snapshot's pool."""
    if operations is None:
        return

    async def resume(_: web.Application) -> None:
        await operations.resume()

    async def stop(_: web.Application) -> None:
        await operations.close()

    app.on_startup.append(resume)
    app.on_cleanup.append(stop)


async def start(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Bind and start serving ``app``; the runner (for ``cleanup``) and the URL it serves."""
    runner = GatewayRunner(
        app,
        shutdown_timeout=SHUTDOWN_GRACE_S,
        # A client that hangs up (an agent's poll, a waiting result) frees its handler at once.
        handler_cancellation=True,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    bound: Any = runner.addresses[0]
    return runner, f"http://{host}:{bound[1]}"


async def serve(
    node: Node,
    host: str,
    port: int,
    *,
    keys: KeyStore,
    registry: Registry,
    blobs: Blobs | None = None,
    stop: asyncio.Event | None = None,
    ready: Callable[[str], None] | None = None,
) -> None:
    """Serve ``node`` until ``stop`` is set (forever without one). ``ready`` gets the URL once
    the socket accepts connections. The caller owns the node: it starts and stops it."""
    runner, url = await start(build_app(node, keys, registry, blobs=blobs), host, port)
    log.info("gateway listening on %s", url)
    try:
        if ready is not None:
            ready(url)
        await (stop or asyncio.Event()).wait()
    finally:
        await runner.cleanup()
