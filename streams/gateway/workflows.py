"""The workflow API: ``POST /v1/workflows``, ``GET /v1/workflows/{id}`` and its paged
``/history``.

Rule 1 (a workflow is a task): ``POST /v1/workflows`` takes the body of ``POST /v1/tasks`` and
enqueues it the same way. It does not refuse a task type registered with ``@app.task``: the
registry knows names, not which bodies orchestrate, and any task may use steps; a task that
never fanned out just shows no parallel steps.
Rule 2 (tenancy): another tenant's workflow, a missing one and a malformed id are the same 404.
Rule 3 (reads): from the partition's live state, except the step rows of a workflow that
ended: those were dropped with its terminal transition (``handlers/steps.py`` rule 5), and the
Postgres snapshot keeps them, so they are read there once the projection has folded the end
(without a snapshot, ``--no-projection``, an ended workflow shows no steps). ``GET`` shows the
workflow, its steps in
position order (keyed steps last) with their states, and each parallel step with its barrier
and children (the first ``CHILDREN_SHOWN_MAX`` listed, all counted by status; a child that
spilled to another partition, ``handlers/workflows.py`` rule 7, is read from that partition's
live state, so its status is as fresh as a local child's). ``history``
pages the step rows, values included, with a keyset cursor (the last identity of the page,
in identity order): each page is one seek, however many steps the workflow has.
A workflow WAITING in ``ctx.wait_for_event`` shows that wait from the partition's wait row:
``waiting_for_event`` {name, step, deadline_ms}, and a step of kind ``event`` in state WAITING
(a wait has no step row until it ends).
Rule 4 (events): ``POST /v1/workflows/{id}/events`` {name, payload} appends a SendEvents
record: it wakes the workflow if it waits for ``name`` (``ctx.wait_for_event``), else it is
kept for its next wait of that name. A finished workflow takes no events (409).
Rule 5 (listing): ``GET /v1/workflows`` lists the tasks that recorded a step, newest first,
from the Postgres snapshot (``store/postgres/workflows.py``: a page may be short, even
empty, while ``next_cursor`` is set), filtered by status, task type, created range and id
prefix, each with its step counts. A workflow that has not recorded its first step yet (a
claim counts) is not listed (nothing says it is one). Like task listing, it first waits
(briefly) for the snapshot to hold what the node had applied, and says ``may_trail`` when it
did not.
Rule 6 (times): each step of ``GET`` has ``started_ms`` (its first claim) and ``ended_ms`` (its
commit) from the snapshot, which keeps them (the partition's step rows carry no times): null
without a snapshot and until the projection has folded them. A parallel step starts when its
barrier was made (its row is first written when it fires). Each child listed has its
``created_ms``, ``started_ms`` (its last lease) and ``finished_ms`` from its task row.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import re
from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import asyncpg
import msgspec
from aiohttp import web

from conveyor.contract import replies as out
from conveyor.errors import ContractError
from conveyor.schemas import codec
from conveyor.schemas.steps import STEP_BYTES_MAX
from conveyor.schemas.types import TERMINAL, Barrier, StepRow, Task, TaskStatus
from conveyor.store import keys
from conveyor.store.postgres import StoreUnavailable, queries
from conveyor.store.postgres import workflows as snapshot_workflows
from conveyor.store.tables import Tables
from conveyor.streams.gateway import render, routes, snapshot, validation
from conveyor.streams.gateway.contract import decode
from conveyor.streams.gateway.contract.requests import WorkflowEvent
from conveyor.streams.gateway.fields import Fields, compact, invalid
from conveyor.streams.gateway.payloads import check_not_marker
from conveyor.streams.gateway.refusals import refused
from conveyor.streams.gateway.validation import (
    LIST_LIMIT_DEFAULT,
    LIST_LIMIT_MAX,
    ListQuery,
    _query_int,
)
from conveyor.streams.machine.handlers.workflows import child_id, spilled

if TYPE_CHECKING:
    from conveyor.streams.node import Node

CHILDREN_SHOWN_MAX = 1_000
EVENT_STEP_PREFIX = "event:"  # a wait is the step event:<name>#<n> (sdk/workflows.py rule 4)
EVENT_PAYLOAD_BYTES_MAX = STEP_BYTES_MAX - len('{"payload":}')
SNAPSHOT_WAIT_MS = 2_000  # how long a read of an ended workflow waits for the projection
SNAPSHOT_POLL_MS = 20
LIST_FIELDS = (
    "status",
    "task_type",
    "created_from_ms",
    "created_to_ms",
    "id_prefix",
    "limit",
    "cursor",
)


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/workflows", routes.enqueue)  # rule 1: the same request
    app.router.add_get("/v1/workflows", list_workflows, allow_head=False)
    app.router.add_get("/v1/workflows/{task_id}", get_workflow, allow_head=False)
    app.router.add_get("/v1/workflows/{task_id}/history", get_history, allow_head=False)
    app.router.add_post("/v1/workflows/{task_id}/events", send_event)


async def list_workflows(request: web.Request) -> web.Response:
    """Rule 5."""
    gw, tenant = routes.context(request)
    query, id_prefix = parse_list_query(request.query)
    if gw.snapshot is None:
        raise ContractError(
            "listing workflows needs the Postgres snapshot; run the node without "
            "--no-projection, or open a workflow by its id",
            field=None,
        )
    fresh = gw.progress is not None and await snapshot.wait_fresh(gw.node, gw.progress)
    after = snapshot.decode_cursor(query.cursor) if query.cursor else None
    q = snapshot_workflows.WorkflowQuery(
        tasks=snapshot.task_query(tenant, query.filter), id_prefix=id_prefix
    )
    try:
        rows, resume = await snapshot_workflows.list_workflows(gw.snapshot, q, query.limit, after)
    except (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError) as exc:
        raise StoreUnavailable(f"the query snapshot is unavailable: {exc}") from exc
    cursor = snapshot.encode_cursor(*resume) if resume is not None else None
    listed = [_listed(r) for r in rows]
    return routes.reply(out.Workflows(workflows=listed, next_cursor=cursor, may_trail=not fresh))


def parse_list_query(query: Mapping[str, str]) -> tuple[ListQuery, str | None]:
    """The filters of ``GET /v1/tasks`` that a workflow has (status, task_type, created
    range, limit, cursor) and ``id_prefix``: the start of a workflow id, in hex."""
    fields = dict(query)
    unknown = sorted(set(fields) - set(LIST_FIELDS))
    if unknown:
        raise invalid(unknown[0], f"is not a filter of workflows; use {', '.join(LIST_FIELDS)}")
    prefix = fields.pop("id_prefix", "").strip().lower() or None
    if prefix is not None and not re.fullmatch(r"[0-9a-f]{1,32}", prefix):
        raise invalid("id_prefix", "must be 1..32 hex digits: the start of a workflow id")
    return validation.parse_list_query(fields), prefix


def _listed(row: dict[str, Any]) -> out.WorkflowSummary:
    return out.WorkflowSummary(
        **msgspec.structs.asdict(snapshot.summary(row)),
        steps=int(row["steps"]),
        steps_committed=int(row["steps_committed"]),
        last_step_ms=row["last_step_ms"],
    )


def _workflow(request: web.Request) -> tuple[Task, Tables, int]:
    gw, tenant = routes.context(request)
    task_id = request.match_info["task_id"]
    task = gw.find(tenant, task_id)  # rule 2
    return task, gw.node.tables(gw.node.partition_of(task_id)), gw.node.clock.now_ms()


async def get_workflow(request: web.Request) -> web.Response:
    task, tables, now_ms = _workflow(request)
    pool = await _ended_snapshot(request, task)
    gw = request.app[routes.GATEWAY]
    rows = None if pool is None else await queries.step_rows(pool, task.tenant, task.task_id)
    body = workflow_json(task, tables, now_ms, rows, node=gw.node)
    times = {}  # rule 6
    if gw.snapshot is not None:
        times = await snapshot_workflows.step_times(gw.snapshot, task.tenant, task.task_id)
    fanned = {p["identity"]: p["created_ms"] for p in body["parallel"]}
    for step in body["steps"]:
        step["started_ms"], step["ended_ms"] = times.get(step["identity"], (None, None))
        if step["identity"] in fanned:  # its row is written when it fires: it began earlier
            step["started_ms"] = fanned[step["identity"]]
    # Built as dicts (the times above are set on them); converting checks them against the model.
    return routes.reply(msgspec.convert(body, out.Workflow))


async def get_history(request: web.Request) -> web.Response:
    task, tables, _ = _workflow(request)
    limit, after = parse_history_query(request.query)
    pool = await _ended_snapshot(request, task)
    if pool is None:
        return routes.reply(history_page(tables, task.task_id, limit, after))
    rows = await queries.step_rows(pool, task.tenant, task.task_id, after=after, limit=limit + 1)
    return routes.reply(_page(rows, limit))


async def _ended_snapshot(request: web.Request, task: Task) -> asyncpg.Pool | None:
    """The snapshot to read an ended workflow's steps from (rule 3), once it has folded the
    workflow's last event (waiting up to ``SNAPSHOT_WAIT_MS``); None: read the live state."""
    pool = request.app[routes.GATEWAY].snapshot
    if task.status not in TERMINAL or pool is None:
        return None
    for _ in range(SNAPSHOT_WAIT_MS // SNAPSHOT_POLL_MS):
        version = await queries.projected_version(pool, task.tenant, task.task_id)
        if version is not None and version >= task.version:
            break
        await asyncio.sleep(SNAPSHOT_POLL_MS / 1000)
    return pool


async def send_event(request: web.Request) -> web.Response:
    """Rule 4."""
    gw, tenant = routes.context(request)
    task_id = request.match_info["task_id"]
    gw.find(tenant, task_id)
    name, payload = parse_event(await routes.read_body(request))
    reply = await gw.node.send_event(tenant, task_id, name, payload)
    if not reply.ok or reply.status is None:
        raise refused(reply, "task_id")
    return routes.reply(out.EventSent(workflow_id=task_id, name=name, status=reply.status.value))


def parse_event(body: Any) -> tuple[str, bytes]:
    """``WorkflowEvent``; its payload is no blob marker and fits in a step."""
    m = decode.model(body, WorkflowEvent)
    check_not_marker(m.payload, "payload")
    payload = compact(m.payload)
    if len(payload) > EVENT_PAYLOAD_BYTES_MAX:
        raise invalid(
            "payload",
            f"{len(payload)} bytes of JSON; an event carries at most {EVENT_PAYLOAD_BYTES_MAX} "
            "(it is stored as a step): send a handle to bigger data",
        )
    return m.name, payload


# -- the workflow ---------------------------------------------------------------------------


def workflow_json(
    task: Task,
    tables: Tables,
    now_ms: int,
    rows: list[StepRow] | None = None,
    *,
    node: Node | None = None,
) -> dict[str, Any]:
    """``rows``: the step rows when they come from the snapshot (rule 3); ``node``: where
    spilled children are read (without it, every child is looked up in ``tables``)."""
    found = tables.steps(task.task_id) if rows is None else rows
    rows = sorted(found, key=lambda r: (r.position < 0, r.position, r.identity))
    barriers = {b.identity: b for b in tables.barriers(task.task_id)}
    steps = [_step_summary(row, task, barriers.get(row.identity), now_ms) for row in rows]
    seen = {row.identity for row in rows}
    wait = tables.event_wait(task.task_id) if task.status == TaskStatus.WAITING else None
    if wait is not None and wait.identity not in seen:  # a wait has no step row until it ends
        steps.append(
            {
                "identity": wait.identity,
                "position": wait.position,
                "kind": "event",
                "state": "WAITING",
                "claims": 0,
                "wake_at_ms": wait.deadline_ms,
            }
        )
    for barrier in barriers.values():  # a parallel step not committed yet has no step row
        if barrier.identity not in seen:
            steps.append(
                {
                    "identity": barrier.identity,
                    "position": barrier.position,
                    "kind": "parallel",
                    "state": "WAITING" if not barrier.fired else "ENDED",
                    "claims": 0,
                    "wake_at_ms": None,
                }
            )
    workflow = {**render.as_json(render.task_summary(task)), **render.version_json(task)}
    workflow.update(render.waiting_json(task, wait, [b for b in barriers.values() if not b.fired]))
    return {
        "workflow": workflow,
        "steps": steps,
        "parallel": [_parallel(tables, task.task_id, b, node) for b in barriers.values()],
    }


def _step_summary(row: StepRow, task: Task, barrier: Barrier | None, now_ms: int) -> dict[str, Any]:
    if row.value is None:
        state = "CLAIMED"  # its body started and has not committed
    elif row.wake_at_ms is not None and row.wake_at_ms > now_ms:
        state = "SLEEPING" if task.status == TaskStatus.SLEEPING else "COMMITTED"
    else:
        state = "COMMITTED"
    if barrier is not None:
        kind = "parallel"
    elif row.identity.startswith(EVENT_STEP_PREFIX):
        kind = "event"
    else:
        kind = "sleep" if row.wake_at_ms else "run"
    return {
        "identity": row.identity,
        "position": row.position,
        "kind": kind,
        "state": state,
        "claims": row.claims,
        "wake_at_ms": row.wake_at_ms,
    }


def _times(child: Task | None) -> dict[str, int | None]:
    """A child's times for the waterfall (rule 6)."""
    if child is None:
        return {"created_ms": None, "started_ms": None, "finished_ms": None}
    return {
        "created_ms": child.created_ms,
        "started_ms": child.leased_ms,
        "finished_ms": child.finished_ms,
    }


def _parallel(
    tables: Tables, parent_id: str, barrier: Barrier, node: Node | None
) -> dict[str, Any]:
    counts: Counter[str] = Counter()
    shown = []
    partitions = 1 if node is None else node.partitions
    for index in range(barrier.total):
        task_id = child_id(parent_id, barrier.identity, index, partitions)
        if node is not None and spilled(parent_id, task_id):
            child = node.processors[node.partition_of(task_id)].read_task(task_id)
        else:
            child = tables.task(task_id)
        status = child.status.value if child is not None else "UNKNOWN"
        counts[status] += 1
        if index < CHILDREN_SHOWN_MAX:
            shown.append({"index": index, "task_id": task_id, "status": status, **_times(child)})
    return {
        "identity": barrier.identity,
        "position": barrier.position,
        "mode": barrier.mode,
        "total": barrier.total,
        "fired": barrier.fired,
        "created_ms": barrier.created_ms,
        "counts": dict(sorted(counts.items())),
        "children": shown,
        "children_truncated": barrier.total > CHILDREN_SHOWN_MAX,
    }


# -- history --------------------------------------------------------------------------------


def parse_history_query(query: Mapping[str, str]) -> tuple[int, str | None]:
    """(limit, the identity after which the page starts)."""
    q = Fields(dict(query), "", {"limit", "cursor"})
    limit = _query_int(q, "limit", 1, LIST_LIMIT_MAX) or LIST_LIMIT_DEFAULT
    cursor = q.raw("cursor")
    if not cursor:
        return limit, None
    try:
        after = base64.b64decode(cursor.encode(), altchars=b"-_", validate=True).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        after = ""
    if not after:
        raise invalid("cursor", "is not a cursor this endpoint returned")
    return limit, after


def history_page(
    tables: Tables, task_id: str, limit: int, after: str | None
) -> out.WorkflowHistory:
    prefix = keys.steps_of(task_id) + b"/"
    start = None if after is None else keys.step(task_id, after) + b"\x00"
    rows: list[StepRow] = []
    for _, value in tables.scan(prefix, start):
        rows.append(codec.STEP_ROW.decode(value))
        if len(rows) > limit:  # one more than a page: another page follows
            break
    return _page(rows, limit)


def _page(rows: list[StepRow], limit: int) -> out.WorkflowHistory:
    """A page of at most ``limit`` rows; ``rows`` holds one more when another page follows."""
    page = rows[:limit]
    cursor = None
    if len(rows) > limit:
        cursor = base64.urlsafe_b64encode(page[-1].identity.encode()).decode()
    steps = [out.StepRow(**render.step_json(row)) for row in page]
    return out.WorkflowHistory(steps=steps, next_cursor=cursor)
