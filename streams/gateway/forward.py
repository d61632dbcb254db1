"""Any node of a cluster takes any request: what this node does not lead goes to its owner.

Each partition is led by one node (``streams/cluster/``); a request about a task, a keyed
enqueue or a worker report belongs to one partition (``streams/routing.py``), and only its
leader can append for it and answer from its state. Two ways to serve such a request on
another node were weighed:

- produce the record to the log from here, then wait for the owner's apply. The append is
  durable, but "applied" happens on another process: this node would have to read the
  owner's state (or the events stream) to learn the outcome (a 409 for a key already used, a
  refusal, the task's detail for a read), and a read of a task has no record to produce at
  all. It also needs the owner's epoch to fence the append, which only the owner holds.
- forward the HTTP request to the owner, which serves it as if it had come there. Chosen: an
  answer is the owner's own, so an acknowledgement still means what it means on one node,
  durable in the log AND applied by the partition's leader; reads, waits (``wait_ms``) and
  refusals are exactly the owner's; nothing new is written anywhere.

The rules:

1. Where: ``middleware``, after authentication (a bad key is refused here, not
   carried to the owner). A request goes out only if a partition it touches is not open on
   this node (``Node.is_open``) and the directory names an owner other than this node. An
   owner unknown (a rebalance under way, no card yet) is no reason to guess: the request is
   served here and the node's refusal answers 503 with ``retry_after_ms``, as on one node.
2. One hop: a forwarded request carries ``Conveyor-Forwarded: <node id>`` and is never
   forwarded again, so a stale directory cannot make two nodes bounce it. A forwarded
   request for a partition that is not open on its receiver is answered at once 503 with
   ``Conveyor-Not-Owner: 1`` (nothing was done).
3. The sender, on that answer or when the owner cannot be reached at all (the connection was
   refused: nothing was sent), waits up to ``REFRESH_S`` for the directory to name another
   owner and sends once more; then it answers the 503 (``retry_after_ms``). A request that
   was sent and got no answer in time (``timeout_s``: ``FORWARD_TIMEOUT_S``, plus the
   ``wait_ms`` of a read that waits) may have been applied: it answers 503 saying so, never
   resent here. The caller resends it (a keyed enqueue, a completion fenced by its lease id
   and every heartbeat are safe to resend).
4. The caller's ``Authorization`` header goes with the request, unchanged: the owner checks
   the key again (every node of a cluster holds the same keys). The key is never logged.
5. Batches (``POST /v1/tasks:batch`` and the worker reports) are split per owner: the items
   of each owner go to it in one request (the items led here through this node's own
   gateway, marked forwarded), concurrently, and the replies are merged in the order of the
   request. The batch is validated here first, so a bad item refuses the whole batch with
   nothing written anywhere. If a part fails (a 409 for one key, a 503), its answer is the
   answer, as when one partition of a node's batch fails: the other parts may be applied,
   and resending the batch is safe for every keyed item. Unkeyed enqueues are placed on
   partitions this node leads (``service.py`` rule 3), so they never leave it. A retry of
   listed tasks (``POST /v1/tasks:retry {task_ids}``) is split the same way; its reply lists
   only the tasks retried, so the parts' lists are joined in the order of the request.
6. A registration (``POST /worker/register``) goes to the owner of the tenant's registry
   partition (``registry/catalog.py``): its processor applies the record on the live
   catalog and answers, and the types an agent's deploy removes are computed against that
   catalog, not against this node's mirror of it, which may be a few records behind.
7. The list of schedules (``GET /v1/schedules``) is gathered: schedules live in their
   partitions' state, so each node answers for the partitions it leads (asked with
   ``Conveyor-Forwarded``, it leaves out the rest: its copy of them may be stale) and the
   node asked merges the answers by id. A partition that no node leads now makes it a 503
   (``retry_after_ms``), never a list silently short of it. A deploy's warning about the
   unfinished tasks of the types it removes (rule 6's registration) is gathered the same way
   (``gather``), by calls between nodes (rule 9) to ``POST /internal/tasks:unfinished``:
   each node counts the partitions it leads and names them, and a partition that no node
   counted (no leader now, its node did not answer) is named in the warning, which says its
   count leaves them out.
8. The other routes are served where they arrive: a listing and the queues read this node's
   query snapshot, which every node feeds from every partition of the events topic;
   ``GET /v1/events`` reads that topic, the same for every node; a poll and a signals wait
   are made to every node by the agent (``agents/cluster.py``); ``GET /worker/nodes`` is the
   directory itself. Not cluster-wide yet: the webhooks, each kept by the node it was
   registered with (``webhooks/store.py``).
9. A bulk operation by filter runs on the node it was started at (its row is in that node's
   query snapshot), and each batch's ids go to their partitions' owners
   (``ClusterSubmitter``): those led here to this node's processors, the others in one call
   per owner to ``POST /internal/tasks:submit``. That call carries no user's key (the
   operation runs in the background, after its request); it is signed with a key derived
   from the cluster's secret (``Conveyor-Node-Call: <ts_ms>.<HMAC-SHA256 of the time,
   method, path, tenant and body's SHA-256>``, the tenant in ``Conveyor-Node-Tenant``), is
   accepted within ``NODE_CALL_SKEW_MS`` of its time, and opens that route only, for that
   tenant only. A replayed call within the window retries or cancels the same tasks again,
   which changes nothing. A part that cannot be done now (no owner, owner unreachable, a
   503) fails the batch, which the runner redoes (``operations.py`` rule 3). The count of
   rule 7 (``POST /internal/tasks:unfinished``) is signed the same way; it reads and
   changes nothing.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from conveyor.errors import ContractError, Forbidden, TransientError, Unauthorized
from conveyor.schemas.types import TaskStatus
from conveyor.streams.gateway import routes
from conveyor.streams.gateway.auth import Grant, client_grant
from conveyor.streams.gateway.errors import dumps, render
from conveyor.streams.gateway.validation import parse_batch, parse_retry
from conveyor.streams.machine import Reply
from conveyor.streams.node import Node
from conveyor.streams.registry.catalog import registry_partition
from conveyor.streams.routing import partition_for_key, partition_for_schedule, partition_of

log = logging.getLogger("conveyor.gateway")

FORWARDED = "Conveyor-Forwarded"
NOT_OWNER = "Conveyor-Not-Owner"
FORWARD_TIMEOUT_S = 30.0
REFRESH_S = 2.0  # a node publishes its card every second (``cluster/directory.py``)
RETRY_AFTER_MS = 500
NODES_PATH = "/worker/nodes"
NODE_CALL = "Conveyor-Node-Call"  # rule 9
NODE_TENANT = "Conveyor-Node-Tenant"
NODE_CALL_SKEW_MS = 30_000
SUBMIT_PATH = "/internal/tasks:submit"
UNFINISHED_PATH = "/internal/tasks:unfinished"  # rule 7: a deploy's warning
_NODE_PATHS = frozenset({SUBMIT_PATH, UNFINISHED_PATH})  # the routes calls of rule 9 open
NODE_CALLED = web.RequestKey("node_called", bool)

# POST path -> (the body's list of items, the reply's list: one entry per item, in order)
_ITEMS = {
    "/v1/tasks:batch": ("tasks", "results"),
    "/worker/heartbeat": ("leases", "actions"),
    "/worker/complete": ("completions", "results"),
    "/worker/checkpoint": ("checkpoints", "results"),
    "/worker/steps": ("steps", "results"),
}
# POST path -> (the body's list of task ids, the reply's list: an entry per task changed)
_LISTED = {"/v1/tasks:retry": ("task_ids", "retried")}
_KEYED = frozenset({"/v1/tasks", "/v1/workflows"})  # POST: one task, routed by its key
REGISTER_PATH = "/worker/register"
GATHERED = "/v1/schedules"  # GET: every node's part, merged by id (rule 7)
_PASSED_BACK = ("Content-Type", "Retry-After")


class Owners(Protocol):
    """What forwarding needs of the cluster's directory (``cluster/directory.py``)."""

    def owner_url(self, partition: int) -> str | None: ...

    async def wait_owner_changed(self, partition: int, url: str | None, timeout_s: float) -> None:
        """Return once the owner of ``partition`` is not ``url`` any more, or after
        ``timeout_s``."""
        ...

    def nodes(self) -> list[dict[str, Any]]:
        """The nodes that lead partitions: ``{"node_id", "url", "partitions"}`` each."""
        ...


class Forwarder:
    """This node's view of who leads what, set once it joins a cluster (``attach``)."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.owners: Owners | None = None
        self.url = ""  # this node's own gateway
        self.call_key: bytes | None = None  # signs and checks calls between nodes (rule 9)
        self._http: aiohttp.ClientSession | None = None

    def attach(self, owners: Owners, url: str, call_key: bytes | None = None) -> None:
        self.owners, self.url, self.call_key = owners, url.rstrip("/"), call_key

    def here(self, p: int | None) -> bool:
        return p is None or self.node.is_open(p)

    def owner(self, p: int | None) -> str | None:
        """Where a request for ``p`` goes; None: served here (rule 1)."""
        if self.here(p) or self.owners is None:
            return None
        assert p is not None
        url = self.owners.owner_url(p)
        return None if url is None or url.rstrip("/") == self.url else url.rstrip("/")

    def http(self) -> aiohttp.ClientSession:
        if self._http is None:
            self._http = aiohttp.ClientSession()
        return self._http

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
            self._http = None


FORWARDER = web.AppKey("forwarder", Forwarder)


def forwarder(app: web.Application) -> Forwarder:
    return app[FORWARDER]


# -- which partitions a request touches --------------------------------------------------------


def _partition(fw: Forwarder, request: web.Request, item: Any, list_name: str) -> int | None:
    """The partition of one item; None: any partition serves it, or the handler refuses it."""
    if list_name == "task_ids":
        return _of_task(fw, item)
    if not isinstance(item, dict):
        return None
    partitions = fw.node.partitions
    if list_name == "tasks":
        key = item.get("idempotency_key")
        if not isinstance(key, str):
            return None
        return partition_for_key(request[routes.TENANT], key, partitions)
    return _of_task(fw, item.get("task_id"))


def _of_task(fw: Forwarder, task_id: Any) -> int | None:
    try:
        return partition_of(task_id, fw.node.partitions) if isinstance(task_id, str) else None
    except ContractError:
        return None


def _of_schedule(fw: Forwarder, request: web.Request, body: Any) -> int | None:
    schedule_id = body.get("schedule_id") if isinstance(body, dict) else None
    if not isinstance(schedule_id, str):
        return None
    return partition_for_schedule(request[routes.TENANT], schedule_id, fw.node.partitions)


def _of_path(fw: Forwarder, request: web.Request) -> int | None:
    """The partition a path names (a task id, a schedule id), if any."""
    task_id = request.match_info.get("task_id")
    schedule_id = request.match_info.get("schedule_id")
    try:
        if task_id is not None:
            return partition_of(task_id, fw.node.partitions)
        if schedule_id is not None:
            return partition_for_schedule(request[routes.TENANT], schedule_id, fw.node.partitions)
    except ContractError:
        return None
    return None


# -- the middleware ------------------------------------------------------------------------------


@web.middleware
async def middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    fw = request.app[FORWARDER]
    if fw.owners is None or routes.TENANT not in request:
        return await handler(request)
    if request.method == "POST" and (request.path in _ITEMS or request.path in _LISTED):
        return await _items(fw, request, handler)
    if request.method == "GET" and request.path == GATHERED:
        return await _gathered(fw, request, handler)
    p = _of_path(fw, request)
    if request.method == "POST" and request.path == REGISTER_PATH:
        p = registry_partition(request[routes.TENANT], fw.node.partitions)  # rule 6
    if p is None and request.method == "POST" and request.path in _KEYED:
        body = await routes.read_body(request)
        p = _partition(fw, request, body, "tasks")
    elif p is None and request.method == "POST" and request.path == "/v1/schedules":
        p = _of_schedule(fw, request, await routes.read_body(request))
    if p is None or fw.here(p):
        return await handler(request)
    if FORWARDED in request.headers:
        return _not_owner(p)  # rule 2
    if fw.owner(p) is None:
        return await handler(request)  # rule 1: no owner known, the node's refusal answers
    reply = await _send(fw, request, [p], await request.read(), _timeout_s(request))
    return _response(reply)


async def _items(
    fw: Forwarder,
    request: web.Request,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """Rule 5."""
    listed = request.path in _LISTED
    list_name, reply_name = _LISTED[request.path] if listed else _ITEMS[request.path]
    body = await routes.read_body(request)
    items = body.get(list_name) if isinstance(body, dict) else None
    if not isinstance(items, list):
        return await handler(request)  # the handler says what is wrong with it
    parts = [_partition(fw, request, item, list_name) for item in items]
    if all(fw.here(p) for p in parts):
        return await handler(request)
    if FORWARDED in request.headers:
        return _not_owner(next(p for p in parts if not fw.here(p)))
    if list_name == "tasks":
        parse_batch(body)  # all or nothing: a bad item refuses the batch before any part goes
    elif listed:
        parse_retry(body)
    groups: dict[str | None, list[int]] = defaultdict(list)
    for i, p in enumerate(parts):
        groups[fw.owner(p)].append(i)
    if None in groups and len(groups) == 1:
        return await handler(request)

    async def part(url: str | None, ix: list[int]) -> _Reply:
        sub = dumps({**body, list_name: [items[i] for i in ix]}).encode()
        return await _send(fw, request, [parts[i] for i in ix], sub, _timeout_s(request), url)

    urls = list(groups)
    replies = await asyncio.gather(*(part(url, groups[url]) for url in urls))
    if listed:
        return _joined(items, replies, reply_name)
    merged: list[Any] = [None] * len(items)
    for url, reply in zip(urls, replies, strict=True):
        if reply.status >= 300:
            return _response(reply)
        got = json.loads(reply.body).get(reply_name, [])
        for i, entry in zip(groups[url], got, strict=True):
            merged[i] = entry
    status = 201 if any(r.status == 201 for r in replies) else 200
    return routes.reply({reply_name: merged}, status)


def _joined(items: list[Any], replies: Sequence[_Reply], reply_name: str) -> web.Response:
    """Rule 5 for a list of task ids: the parts' entries, in the order of the request."""
    order: dict[Any, int] = {}
    for i, task_id in enumerate(items):
        order.setdefault(task_id, i)
    joined: list[dict[str, Any]] = []
    for reply in replies:
        if reply.status >= 300:
            return _response(reply)
        joined += json.loads(reply.body).get(reply_name, [])
    joined.sort(key=lambda entry: order.get(entry.get("task_id"), len(items)))
    return routes.reply({reply_name: joined})


async def _gathered(
    fw: Forwarder,
    request: web.Request,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
) -> web.StreamResponse:
    """Rule 7: the schedules of the partitions led here, and those of every other owner."""
    own = await handler(request)
    if own.status != 200 or not isinstance(own, web.Response) or own.text is None:
        return own
    tenant = request[routes.TENANT]

    def led_here(row: dict[str, Any]) -> bool:
        return fw.here(partition_for_schedule(tenant, row["schedule_id"], fw.node.partitions))

    rows = {r["schedule_id"]: r for r in json.loads(own.text)["schedules"] if led_here(r)}
    if FORWARDED in request.headers:
        return routes.reply({"schedules": list(rows.values())})
    unled, replies = await gather(
        fw, lambda url: _send(fw, request, [], b"", FORWARD_TIMEOUT_S, url), whole=True
    )
    if unled:
        return _response(_unavailable(f"partition {unled[0]} has no leader now; try again"))
    for reply in replies:
        if reply.status != 200:
            return _response(reply)
        rows.update((r["schedule_id"], r) for r in json.loads(reply.body)["schedules"])
    return routes.reply({"schedules": [rows[k] for k in sorted(rows)]})


async def gather(
    fw: Forwarder, ask: Callable[[str], Awaitable[_Reply]], *, whole: bool
) -> tuple[list[int], list[_Reply]]:
    """Rule 7: the partitions no node leads now, and the replies of ``ask`` (concurrent) to
    each other node that leads partitions, in the order of their urls. ``whole``: an answer
    short of a partition is no answer, so a partition without a leader asks no node."""
    partitions = range(fw.node.partitions)
    unled = [p for p in partitions if not fw.here(p) and fw.owner(p) is None]
    if unled and whole:
        return unled, []
    urls = sorted({url for p in partitions if (url := fw.owner(p)) is not None})
    return unled, list(await asyncio.gather(*(ask(url) for url in urls)))


async def count_unfinished(
    fw: Forwarder, tenant: str, app: str, task_types: list[str]
) -> tuple[dict[str, int], set[int]]:
    """Rule 7 for a deploy's warning: the unfinished tasks of ``app`` of each of
    ``task_types`` in the partitions the other nodes lead, and the partitions counted. A
    node that does not answer counts nothing: its partitions are left out, not guessed."""
    body = dumps({"app": app, "task_types": task_types}).encode()
    _, replies = await gather(
        fw, lambda url: _call(fw, url, UNFINISHED_PATH, tenant, body), whole=False
    )
    counts = dict.fromkeys(task_types, 0)
    counted: set[int] = set()
    for reply in replies:
        if reply.status != 200:
            log.warning("a deploy's count: a node answered %s: %r", reply.status, reply.body[:300])
            continue
        got = json.loads(reply.body)
        fresh = set(got["partitions"]) - counted  # a partition moving: count it once
        if fresh != set(got["partitions"]):
            continue
        counted |= fresh
        for task_type, n in got["unfinished"].items():
            counts[task_type] += n
    return counts, counted


def _not_owner(p: int | None) -> web.Response:
    response = render(
        TransientError(
            f"partition {p} is not led by this node; send the request again (to any node)",
            retry_after_ms=RETRY_AFTER_MS,
        )
    )
    response.headers[NOT_OWNER] = "1"
    return response


def _timeout_s(request: web.Request) -> float:
    try:
        wait_ms = max(0, int(request.query.get("wait_ms", "0")))
    except ValueError:
        wait_ms = 0
    return FORWARD_TIMEOUT_S + wait_ms / 1000


# -- sending -------------------------------------------------------------------------------------


class _Reply:
    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int, body: bytes, headers: dict[str, str]) -> None:
        self.status, self.body, self.headers = status, body, headers


def _response(reply: _Reply) -> web.Response:
    return web.Response(status=reply.status, body=reply.body, headers=reply.headers)


def _unavailable(message: str) -> _Reply:
    response = render(TransientError(message, retry_after_ms=RETRY_AFTER_MS))
    assert isinstance(response.body, bytes)
    return _Reply(response.status, response.body, dict(response.headers))


async def _send(
    fw: Forwarder,
    request: web.Request,
    partitions: Sequence[int | None],
    body: bytes,
    timeout_s: float,
    url: str | None = None,
) -> _Reply:
    """Rules 2-4: to the owner of ``partitions`` (``url``: a part of a batch whose owner was
    looked up; None there: this node), once more after the directory changed."""
    first = next((p for p in partitions if p is not None), None)
    target = url if url is not None or not partitions else fw.owner(first)
    for again in (True, False):
        target = target or fw.url  # a part led here: through this node's own gateway
        try:
            reply = await _post(fw, request, target, body, timeout_s)
        except aiohttp.ClientConnectorError:
            why = f"the owner of partition {first} ({target}) cannot be reached"
        except (aiohttp.ClientError, TimeoutError):
            return _unavailable(
                f"the owner of partition {first} ({target}) did not answer in time; the "
                "request may have been applied: send it again (a keyed enqueue is applied "
                "once)"
            )
        else:
            if NOT_OWNER not in reply.headers:
                return reply
            why = f"{target} no longer leads partition {first}"
        if not again or fw.owners is None or first is None:
            return _unavailable(f"{why}; the cluster is moving partitions: send it again")
        log.info("forwarding: %s; waiting for the directory", why)
        await fw.owners.wait_owner_changed(first, target, REFRESH_S)
        target = fw.owner(first)
    raise AssertionError("unreachable")


async def _post(
    fw: Forwarder, request: web.Request, url: str, body: bytes, timeout_s: float
) -> _Reply:
    headers = {FORWARDED: fw.node.node_id}
    for name in ("Authorization", "Content-Type"):
        if name in request.headers:
            headers[name] = request.headers[name]
    async with fw.http().request(
        request.method,
        url + request.path_qs,
        data=body or None,
        headers=headers,
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    ) as response:
        got = await response.read()
        back = {k: response.headers[k] for k in _PASSED_BACK if k in response.headers}
        if NOT_OWNER in response.headers:
            back[NOT_OWNER] = response.headers[NOT_OWNER]
        return _Reply(response.status, got, back)


# -- the cluster's nodes, for agents -------------------------------------------------------------


async def nodes_route(request: web.Request) -> web.Response:
    """``GET /worker/nodes``: the nodes an agent polls (each leads partitions); a node of no
    cluster answers itself alone."""
    fw = request.app[FORWARDER]
    if fw.owners is None:
        own = {"node_id": fw.node.node_id, "url": "", "partitions": list(range(fw.node.partitions))}
        return routes.reply({"nodes": [own]})
    return routes.reply({"nodes": fw.owners.nodes()})


# -- calls between nodes (rule 9) ------------------------------------------------------------


def _call_mac(key: bytes, ts_ms: str, method: str, path: str, tenant: str, body: bytes) -> str:
    signed = "\n".join([ts_ms, method, path, tenant, hashlib.sha256(body).hexdigest()])
    return hmac.new(key, signed.encode(), hashlib.sha256).hexdigest()


async def node_grant(request: web.Request) -> Grant:
    """The grant of a call from another node of the cluster: its tenant's client grant, for
    ``_NODE_PATHS`` only; Unauthorized unless it checks. Called by the auth middleware in
    place of the key check when the call carries ``NODE_CALL``."""
    fw = request.app[FORWARDER]
    tenant = request.headers.get(NODE_TENANT, "")
    ts_ms, _, mac = request.headers.get(NODE_CALL, "").partition(".")
    body = await request.read()
    fresh = ts_ms.isdigit() and abs(int(time.time() * 1000) - int(ts_ms)) <= NODE_CALL_SKEW_MS
    ok = (
        fw.call_key is not None
        and fresh
        and bool(tenant)
        and request.path in _NODE_PATHS
        and hmac.compare_digest(
            mac, _call_mac(fw.call_key, ts_ms, request.method, request.path, tenant, body)
        )
    )
    if not ok:
        raise Unauthorized(
            f"{NODE_CALL}: not a call of a node of this cluster (a bad signature, a time more "
            f"than {NODE_CALL_SKEW_MS} ms off this node's clock, or another route than "
            f"{', '.join(sorted(_NODE_PATHS))}); the nodes of a cluster must share "
            "CONVEYOR_CLUSTER_SECRET"
        )
    request[NODE_CALLED] = True
    return client_grant(tenant)


async def submit_route(request: web.Request) -> web.Response:
    """``POST /internal/tasks:submit {kind, task_ids, reason}``: a part of another node's bulk
    operation, for partitions led here (rule 9)."""
    if not request.get(NODE_CALLED):
        raise Forbidden(f"{SUBMIT_PATH} is called by the nodes of a cluster only")
    fw, tenant = request.app[FORWARDER], request[routes.TENANT]
    body = json.loads(await request.read())
    ids = [str(t) for t in body["task_ids"]]
    away = [p for p in {fw.node.partition_of(t) for t in ids} if not fw.here(p)]
    if away:
        return _not_owner(away[0])
    if body["kind"] == "retry":
        replies = await fw.node.retry_failed(tenant, ids)
    else:
        replies = await fw.node.cancel_many(tenant, ids, str(body.get("reason") or ""))
    return routes.reply({"replies": [_reply_json(r) for r in replies]})


async def unfinished_route(request: web.Request) -> web.Response:
    """``POST /internal/tasks:unfinished {app, task_types}``: the unfinished tasks of each
    type in the partitions led here, and those partitions (rule 7)."""
    if not request.get(NODE_CALLED):
        raise Forbidden(f"{UNFINISHED_PATH} is called by the nodes of a cluster only")
    body = json.loads(await request.read())
    gw = request.app[routes.GATEWAY]
    counts, led = gw.unfinished(request[routes.TENANT], str(body["app"]), body["task_types"])
    return routes.reply({"unfinished": counts, "partitions": sorted(led)})


async def _call(fw: Forwarder, url: str, path: str, tenant: str, body: bytes) -> _Reply:
    """A call of rule 9 to the node at ``url``; a 503 when it cannot be made."""
    assert fw.call_key is not None  # set with the owners (``attach``)
    ts_ms = str(int(time.time() * 1000))
    mac = _call_mac(fw.call_key, ts_ms, "POST", path, tenant, body)
    headers = {
        NODE_CALL: f"{ts_ms}.{mac}",
        NODE_TENANT: tenant,
        FORWARDED: fw.node.node_id,
        "Content-Type": "application/json",
    }
    try:
        async with fw.http().post(
            url + path,
            data=body,
            headers=headers,
            timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT_S),
        ) as response:
            return _Reply(response.status, await response.read(), {})
    except (aiohttp.ClientError, TimeoutError) as exc:
        return _unavailable(f"the node at {url} did not answer ({exc!r})")


def _reply_json(r: Reply) -> dict[str, Any]:
    status = None if r.status is None else r.status.value
    return {"task_id": r.task_id, "ok": r.ok, "created": r.created, "status": status}


def _reply_of(item: dict[str, Any]) -> Reply:
    status = None if item["status"] is None else TaskStatus(item["status"])
    return Reply(
        offset=-1,
        index=0,
        ok=bool(item["ok"]),
        task_id=str(item["task_id"]),
        created=bool(item["created"]),
        status=status,
    )


class ClusterSubmitter:
    """A bulk operation's batches on a cluster (rule 9): the ids of partitions led here to
    the node, the others to their owners."""

    def __init__(self, fw: Forwarder) -> None:
        self.fw = fw

    async def retry_failed(self, tenant: str, task_ids: Sequence[str]) -> list[Reply]:
        return await self._submit(tenant, task_ids, {"kind": "retry"})

    async def cancel_many(self, tenant: str, task_ids: Sequence[str], reason: str) -> list[Reply]:
        return await self._submit(tenant, task_ids, {"kind": "cancel", "reason": reason})

    async def _submit(
        self, tenant: str, task_ids: Sequence[str], what: dict[str, Any]
    ) -> list[Reply]:
        fw = self.fw
        groups: dict[str | None, list[str]] = defaultdict(list)
        for task_id in task_ids:
            p = fw.node.partition_of(task_id)
            url = None if fw.here(p) else fw.owner(p)
            if url is None and not fw.here(p):
                raise TransientError(
                    f"partition {p} has no leader now; the batch is done again later",
                    retry_after_ms=RETRY_AFTER_MS,
                )
            groups[url].append(task_id)
        parts = [self._part(tenant, url, ids, what) for url, ids in groups.items()]
        return [r for replies in await asyncio.gather(*parts) for r in replies]

    async def _part(
        self, tenant: str, url: str | None, ids: list[str], what: dict[str, Any]
    ) -> list[Reply]:
        fw = self.fw
        if url is None:
            if what["kind"] == "retry":
                return await fw.node.retry_failed(tenant, ids)
            return await fw.node.cancel_many(tenant, ids, str(what["reason"]))
        body = dumps({**what, "task_ids": ids}).encode()
        reply = await _call(fw, url, SUBMIT_PATH, tenant, body)
        if reply.status != 200:
            raise TransientError(
                f"the owner at {url} did not take a batch (it answered {reply.status}: "
                f"{reply.body[:300]!r}); it is done again later",
                retry_after_ms=RETRY_AFTER_MS,
            )
        return [_reply_of(item) for item in json.loads(reply.body)["replies"]]


def join_cluster(app: web.Application, owners: Owners, url: str, call_key: bytes) -> None:
    """From now on ``app`` forwards by ``owners`` (rules 1-7), a deploy's warning counts the
    other nodes' partitions (rule 7), and its bulk operations send each batch's ids to their
    owners, signing the calls with ``call_key`` (rule 9)."""
    fw = app[FORWARDER]
    fw.attach(owners, url, call_key)
    gw = app[routes.GATEWAY]
    gw.unfinished_elsewhere = lambda tenant, app_, types: count_unfinished(fw, tenant, app_, types)
    operations = gw.operations
    if operations is not None:
        operations.submitter = ClusterSubmitter(fw)


def add_to(app: web.Application, node: Node) -> None:
    """Forwarding, ``GET /worker/nodes`` and the route of calls between nodes on ``app`` (the
    middleware is in ``build_app``)."""
    fw = Forwarder(node)
    app[FORWARDER] = fw
    app.router.add_get(NODES_PATH, nodes_route, allow_head=False)
    app.router.add_post(SUBMIT_PATH, submit_route)
    app.router.add_post(UNFINISHED_PATH, unfinished_route)

    async def close(_: web.Application) -> None:
        await fw.close()

    app.on_cleanup.append(close)
