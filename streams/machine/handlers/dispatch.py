"""GrantLeases: pick ready tasks fairly for waiting agents and lease them.

Fairness rule: within a partition, capacity is dealt one task at a time, round-robin over the
tenants with ready work, starting after the tenant served last (the cursor is state, so the
order is a function of the log). Within a tenant, higher priority first, then oldest first,
across the requested queues. A tenant's backlog therefore costs that tenant latency only.

Version rule: a request takes from one ready lane (``store/lanes.py``): its app's, or the pinned
lane of the version its agent serves. A task's first lease records the app version of the agent
it went to (``Task.app_version``); from then on a pinned workflow becomes ready in that
version's lane only, so a later attempt (after a sleep, fan-in, event or retry) runs on an
agent of that version and no other.

Type rule: a request that names ``task_types`` takes only tasks of those types (the types its
agent serves; None: any). Ready queues are kept per task type (``store/tables.py``), so the
pick merges the heads of the named types' queues only: a task of a type the agent does not
serve is never dealt to it (it would fail there as an unknown type) and never stands in front
of the tasks it can take. A task no waiting agent serves stays ENQUEUED until one polls.
"""

from __future__ import annotations

from conveyor.errors import InvariantError
from conveyor.schemas.types import EventKind, GrantLeases, LeaseRequest, TaskStatus
from conveyor.store import keys
from conveyor.store.tables import Tables
from conveyor.streams.machine.lifecycle import emit, start_to_close_timer, touch
from conveyor.streams.machine.outcome import Grant, Meta, Offer, Outcome
from conveyor.streams.machine.transitions import move


def apply_grant(tables: Tables, record: GrantLeases, meta: Meta, out: Outcome) -> None:
    for request in record.requests:
        grants = [_lease(tables, task_id, request, meta, out) for task_id in _pick(tables, request)]
        out.actions.append(Offer(request_id=request.request_id, grants=grants))


def _pick(tables: Tables, request: LeaseRequest) -> list[str]:
    tenants = tables.ready_tenants(request.app)
    if request.tenants:
        allowed = set(request.tenants)
        tenants = [t for t in tenants if t in allowed]
    if not tenants or request.capacity <= 0:
        return []
    last = tables.meta_str(keys.cursor(request.app))
    start = next((i for i, t in enumerate(tenants) if last is not None and t > last), 0)
    order = tenants[start:] + tenants[:start]
    share = -(-request.capacity // len(order))  # ceil: enough heads for an even deal
    heads = {
        t: tables.ready_heads(request.app, t, request.queues, share, request.task_types)
        for t in order
    }
    picked: list[str] = []
    served = last
    while len(picked) < request.capacity and any(heads.values()):
        for tenant in order:
            if len(picked) >= request.capacity:
                break
            if not heads[tenant]:
                continue
            picked.append(heads[tenant].pop(0)[1])
            served = tenant
            if not heads[tenant]:
                # This tenant may have more than one even share: fetch its next heads.
                heads[tenant] = _more(tables, request, tenant, picked)
    if served is not None:
        tables.put_meta_str(keys.cursor(request.app), served)
    return picked


def _more(
    tables: Tables, request: LeaseRequest, tenant: str, picked: list[str]
) -> list[tuple[bytes, str]]:
    taken = set(picked)
    want = request.capacity - len(picked)
    if want <= 0:
        return []
    rows = tables.ready_heads(
        request.app, tenant, request.queues, want + len(taken), request.task_types
    )
    return [row for row in rows if row[1] not in taken][:want]


def _lease(tables: Tables, task_id: str, request: LeaseRequest, meta: Meta, out: Outcome) -> Grant:
    task = tables.task(task_id)
    if task is None or task.status != TaskStatus.ENQUEUED:
        raise InvariantError(f"ready task {task_id} is not ENQUEUED: {task}")
    tables.remove_ready(task, taken=True)
    task.ready_seq = 0
    move(task, TaskStatus.LEASED)
    task.lease_id += 1
    task.agent_id = request.agent_id
    task.leased_ms = meta.ts_ms
    if task.app_version is None:
        task.app_version = request.app_version
    touch(task, meta)
    tables.set_leased(task_id, task.lease_id, request.lease_ms)
    timer = start_to_close_timer(task)
    if timer is not None:
        tables.add_timer(timer)
    tables.put_task(task)
    emit(out, EventKind.TaskLeased, task, meta)
    return Grant(
        task_id=task_id, lease_id=task.lease_id, attempt=task.attempt, lease_ms=request.lease_ms
    )
