"""What each endpoint does with the node, after validation and before rendering.

Rule 1 (tenancy): every read and write is scoped to the caller's tenant. A task of another
tenant, a missing task and a malformed id all answer exactly the same (404 for clients,
``unknown task`` / ``LOST`` for agents), so ids leak nothing.
Rule 1b (apps): an agent key bound to an app (auth.py) registers and polls that app only, and
reports only on that app's tasks: a heartbeat, completion, checkpoint or step of a task of
its tenant but of another app refuses the whole request with a 403 before anything is
written (such a task is not unknown to the tenant, so saying ``unknown task`` would be a lie
that hides a misconfigured agent).
Rule 2 (idempotency): a keyed enqueue whose key already names a task answers that task, unless
it asks for another task (payload, type, options): that is a 409. The partition decides it, as
it applies the record (``machine/handlers/enqueue.py`` rule 2), so no gateway reads another
partition's state; the gateway only compares the items of one batch before appending it. Any
item the machine refuses is an error (``refusals.py``), never a reply naming no task.
Rule 3 (sticky partitions): a task without an idempotency key may live on any partition, and
``STICKY_TASKS`` of them in a row go to the same one before the next takes over (Kafka's
sticky partitioner, KIP-480). Each partition has its own log, group commit, apply loop and
events stream, and their costs are per record and per batch: single enqueues dealt one per
partition in turn left each batch a record or two. Sticky, concurrent single enqueues share
them: 16 clients against 8 partitions made ~2x the enqueues per second, at ~0.45x the
node's CPU per enqueue. A 1,000-task batch still spreads over four partitions, and over time
every partition gets an equal share.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections import defaultdict
from collections.abc import Awaitable, Callable, Collection
from typing import Any

import asyncpg
import msgspec

from conveyor.contract import replies as out
from conveyor.errors import Conflict, ContractError, Forbidden, NotFound, TransientError
from conveyor.schemas import codec
from conveyor.schemas.types import (
    Checkpoint,
    Completion,
    FanOut,
    LeaseRef,
    Outcome,
    StepOp,
    StepWrite,
    Task,
    TaskSpec,
    TaskStatus,
)
from conveyor.store.attempt_logs import AttemptLogs
from conveyor.store.postgres import queries
from conveyor.streams import failpoints
from conveyor.streams.gateway import listing, render, snapshot
from conveyor.streams.gateway.admission import Admission
from conveyor.streams.gateway.auth import Grant, KeyStore
from conveyor.streams.gateway.breakers import OpenBreakers
from conveyor.streams.gateway.fields import compact
from conveyor.streams.gateway.operations import CANCEL, RETRY, BulkOperations
from conveyor.streams.gateway.payloads import Payloads, PayloadUnavailable
from conveyor.streams.gateway.refusals import field_of, refused
from conveyor.streams.gateway.registry import Registry
from conveyor.streams.gateway.schedules import ScheduleRequest, schedule_json, to_record
from conveyor.streams.gateway.seen_agents import SeenAgents
from conveyor.streams.gateway.tenants import HIDDEN
from conveyor.streams.gateway.validation import (
    BulkCancelRequest,
    EnqueueRequest,
    ListQuery,
    TaskFilter,
    parse_task,
    to_spec,
)
from conveyor.streams.gateway.worker_requests import (
    CheckpointRequest,
    CompletionRequest,
    FanOutRequest,
    Poll,
    Register,
    Signals,
    StepRequest,
    bad_fan_out,
)
from conveyor.streams.machine import Reply
from conveyor.streams.machine.handlers.cancel import retry_id
from conveyor.streams.machine.handlers.enqueue import differing_fields
from conveyor.streams.machine.lifecycle import holder
from conveyor.streams.node import Node
from conveyor.streams.processor.pool import Lease
from conveyor.streams.registry.definitions import parse_definitions
from conveyor.streams.registry.service import SchemaRegistry
from conveyor.streams.routing import mint_task_id, partition_for_key
from conveyor.streams.sinks.projector import Progress

log = logging.getLogger("conveyor.gateway")

UNKNOWN_TASK = "unknown task"
# (tenant, app, task types) -> the unfinished tasks of each type in the partitions other nodes
# lead, and the partitions counted
CountElsewhere = Callable[[str, str, list[str]], Awaitable[tuple[dict[str, int], set[int]]]]
STICKY_TASKS = 256  # unkeyed enqueues in a row that go to one partition (rule 3)


class Gateway:
    def __init__(
        self,
        node: Node,
        keys: KeyStore,
        registry: Registry,
        payloads: Payloads,
        *,
        snapshot: asyncpg.Pool | None = None,
        progress: Progress | None = None,
        logs: AttemptLogs | None = None,
    ) -> None:
        self.node = node
        self.logs = logs  # what attempts printed; None: not kept
        self.admission = Admission()
        self.keys = keys
        self.registry = registry
        registry.bind(node)  # its rows are in this node's log (``registry.py``)
        self.payloads = payloads
        self.snapshot = snapshot  # the Postgres query snapshot; None: list by RocksDB scans
        # How far the snapshot's projector has come; None: unknown, a listing may trail.
        self.progress = progress
        # Bulk operations by filter select from the snapshot and keep their cursor there.
        self.operations = BulkOperations(node, snapshot) if snapshot is not None else None
        self.breakers = OpenBreakers()  # what the agents' polls say their breakers hold back
        self.agents = SeenAgents()  # the agents that poll this node, for operators
        self._round_robin = itertools.count()
        # The unfinished tasks of the partitions other nodes lead, for a deploy's warning;
        # None: one node, every partition is here (set by ``forward.join_cluster``).
        self.unfinished_elsewhere: CountElsewhere | None = None

    # -- lookups ------------------------------------------------------------------------------

    def find(self, tenant: str, task_id: str) -> Task:
        try:
            return self.node.get(tenant, task_id)
        except NotFound:
            raise
        except ContractError:  # malformed id or a partition this node does not have
            raise NotFound(f"no task {task_id}", field="task_id") from None

    def owns(self, tenant: str, task_id: str) -> bool:
        try:
            self.find(tenant, task_id)
        except NotFound:
            return False
        return True

    # -- client API ---------------------------------------------------------------------------

    async def enqueue(self, tenant: str, reqs: list[EnqueueRequest]) -> list[Reply]:
        await self.registry.ready(tenant)
        reqs = [self.registry.resolve(tenant, req) for req in reqs]  # its defaults (rule 4)
        self.admission.admit(tenant, self.keys.settings(tenant), len(reqs))  # valid ones only
        now_ms = self.node.clock.now_ms()
        searchable = self.keys.settings(tenant).show_payloads  # payload_fields.py rule 1
        specs: list[TaskSpec] = []
        for req in reqs:
            payload = await self.payloads.pack(tenant, req.payload, req.field("payload"))
            task_id = mint_task_id(self._partition(tenant, req.idempotency_key))
            specs.append(
                to_spec(
                    req,
                    task_id=task_id,
                    tenant=tenant,
                    payload=payload,
                    now_ms=now_ms,
                    resume=self.registry.resume_of(tenant, req.app, req.task_type),
                    searchable=searchable,
                )
            )
        _check_batch_keys(reqs, specs)
        replies = await self.node.enqueue(specs)
        for req, reply in zip(reqs, replies, strict=True):
            if not reply.ok:
                raise refused(reply, field_of(reply.refusal, req.path))
        return replies

    async def enqueue_spec(self, tenant: str, spec: TaskSpec) -> Reply:
        """Enqueue a spec built here from a stored one (a re-run, a schedule's run:
        ``reruns.py``), its id minted on its partition: its type must still be registered,
        and it is admitted like a client's enqueue."""
        await self.registry.ready(tenant)
        self.registry.require(tenant, spec.app, spec.task_type, "task_type")
        self.admission.admit(tenant, self.keys.settings(tenant), 1)
        (reply,) = await self.node.enqueue([spec])
        if not reply.ok:
            raise refused(reply, field_of(reply.refusal, ""))
        return reply

    def _partition(self, tenant: str, key: str | None) -> int:
        if key is not None:
            return partition_for_key(tenant, key, self.node.partitions)
        return self.node.partition_for_unkeyed(next(self._round_robin) // STICKY_TASKS)

    async def task(self, tenant: str, task_id: str, wait_ms: int) -> out.Task:
        task = self.find(tenant, task_id)
        if wait_ms > 0 and task.finished_ms is None:
            task = await self.node.wait_finished(tenant, task_id, wait_ms)
        tables = self.node.tables(self.node.partition_of(task_id))
        unavailable: dict[str, str] = {}
        body = render.task_detail(
            task,
            tables.attempts(task_id),
            payload=await self._shown(tenant, tables.payload(task_id), "payload", unavailable),
            result=await self._shown(tenant, task.result, "result", unavailable, hide=False),
            checkpoint=await self._shown(tenant, task.checkpoint, "checkpoint", unavailable),
            logged=self.logs.leases(task_id) if self.logs is not None else set(),
        )
        if unavailable:
            body.unavailable = unavailable
        if task.status == TaskStatus.ENQUEUED and body.waiting_for is None:
            body.waiting_for = self.registry.unserved(tenant, task.app, task.task_type)
        if task.status == TaskStatus.WAITING:  # the wait rows are read for it only
            wait = tables.event_wait(task_id)
            open_fans = [b for b in tables.barriers(task_id) if not b.fired]
            why, body.waiting_for_event = render.waiting(task, wait, open_fans)
            if why is not None:
                body.waiting_for = why
        return body

    def attempt_log(self, tenant: str, task_id: str, lease_id: int) -> str:
        self.find(tenant, task_id)
        text = self.logs.get(task_id, lease_id) if self.logs is not None else None
        if text is None:
            raise NotFound(f"no log of lease {lease_id} of task {task_id}", field="lease_id")
        return text

    async def _visible(self, tenant: str, stored: bytes | None) -> Any:
        """A payload as the client API shows it: ``HIDDEN`` when the tenant's settings say
        ``show_payloads: false`` (tenants.py), the value otherwise."""
        if stored and not self.keys.settings(tenant).show_payloads:
            return HIDDEN
        return await self.payloads.value(tenant, stored)

    async def _shown(
        self,
        tenant: str,
        stored: bytes | None,
        name: str,
        unavailable: dict[str, str],
        *,
        hide: bool = True,
    ) -> Any:
        """A value of a task detail (``hide``: as ``_visible`` shows it); null, and why in
        ``unavailable[name]``, when its blob cannot be read: one missing blob must not hide
        the task's status (payloads rule 3)."""
        try:
            if hide:
                return await self._visible(tenant, stored)
            return await self.payloads.value(tenant, stored)
        except PayloadUnavailable as exc:
            unavailable[name] = str(exc)
            return None

    async def list_tasks(self, tenant: str, query: ListQuery) -> out.TaskPage:
        if query.filter.payload_fields is not None:
            self._check_payload_search(tenant)
        if self.snapshot is not None:
            fresh = self.progress is not None and await snapshot.wait_fresh(
                self.node, self.progress
            )
            page = await snapshot.list_tasks(self.snapshot, tenant, query)
            page.may_trail = not fresh
            return page
        tasks, cursor = listing.list_tasks(
            self.node, tenant, query.filter, query.limit, query.cursor
        )
        # may_trail: false, the processors' own state; count: null, counting needs the
        # snapshot (a scan cannot afford it)
        return out.TaskPage(tasks=[render.task_summary(t) for t in tasks], next_cursor=cursor)

    def _check_payload_search(self, tenant: str) -> None:
        """A payload search needs the snapshot (only it keeps the fields), and is refused for
        a tenant that hides its payloads: matches would tell what the payloads hold."""
        if self.snapshot is None:
            raise ContractError(
                "payload.<field>: a payload search needs the Postgres snapshot; run the node "
                "without --no-projection",
                field="payload",
            )
        if not self.keys.settings(tenant).show_payloads:
            raise ContractError(
                "payload.<field>: payloads are hidden for this tenant (show_payloads: false), "
                "so they cannot be searched",
                field="payload",
            )

    async def queues(self, tenant: str) -> out.Queues:
        if self.snapshot is None:
            raise ContractError(
                "queue statistics need the Postgres snapshot; run the node without --no-projection",
                field=None,
            )
        listed = await queries.queues(self.snapshot, tenant, self.node.clock.now_ms())
        # The snapshot's rows are dicts; converting checks them against the model.
        body = {
            "queues": queries.with_paused(listed, self.node.paused_queues(tenant)),
            "breakers": self.breakers.of_tenant(tenant, self.node.clock.monotonic_ms()),
        }
        return msgspec.convert(body, out.Queues)

    async def cancel(self, tenant: str, task_id: str, reason: str) -> out.Canceled:
        self.find(tenant, task_id)
        reply = await self.node.cancel(tenant, task_id, reason)
        if not reply.ok or reply.status is None:
            raise refused(reply, "task_id")
        return out.Canceled(task_id=task_id, status=render.STATUS[reply.status])

    async def retry(self, tenant: str, task_ids: list[str]) -> list[out.Retried]:
        """Retry the listed tasks now (at most ``BATCH_MAX``); a filter is a bulk operation."""
        ids = [i for i in dict.fromkeys(task_ids) if self.owns(tenant, i)]
        by_prefix: dict[str, list[str]] = defaultdict(list)
        for task_id in ids:
            by_prefix[task_id[:4]].append(task_id)
        retried = []
        for reply in await self.node.retry_failed(tenant, ids):
            if not reply.created:
                continue
            # The machine derives the new id from (old id, offset): find which old id it was.
            for old in by_prefix[reply.task_id[:4]]:
                if retry_id(old, reply.offset) == reply.task_id:
                    retried.append(out.Retried(task_id=old, new_task_id=reply.task_id))
                    break
        return retried

    # -- bulk operations (operations.py) ------------------------------------------------------

    def _bulk(self) -> BulkOperations:
        if self.operations is None:
            raise ContractError(
                "operations by filter need the Postgres snapshot; run the node without "
                "--no-projection, or send task_ids",
                field="filter",
            )
        return self.operations

    async def bulk_retry(self, tenant: str, flt: TaskFilter, limit: int | None) -> out.Operation:
        query = snapshot.task_query(tenant, flt)
        return await self._bulk().start(RETRY, query, reason=None, limit=limit)

    async def bulk_cancel(self, tenant: str, req: BulkCancelRequest) -> out.Operation:
        query = snapshot.task_query(tenant, req.filter)
        return await self._bulk().start(CANCEL, query, reason=req.reason, limit=req.limit)

    async def operation(self, tenant: str, operation_id: str) -> out.Operation:
        if self.operations is None:
            raise NotFound(f"no operation {operation_id}", field="operation_id")
        return await self.operations.get(tenant, operation_id)

    # -- schedules ----------------------------------------------------------------------------

    async def upsert_schedule(self, tenant: str, req: ScheduleRequest) -> tuple[bool, out.Schedule]:
        """Create or replace a schedule; (created, the schedule as stored)."""
        await self.registry.ready(tenant)
        task = self.registry.resolve(tenant, req.task)
        payload = await self.payloads.pack(tenant, task.payload, task.field("payload"))
        # The firing sets id, time and key; the template keeps everything else of the body.
        resume = self.registry.resume_of(tenant, task.app, task.task_type)
        searchable = self.keys.settings(tenant).show_payloads
        spec = to_spec(
            task,
            task_id="",
            tenant=tenant,
            payload=payload,
            now_ms=0,
            resume=resume,
            searchable=searchable,
        )
        record = to_record(req, tenant=tenant, template=codec.TASK_SPEC.encode(spec))
        reply = await self.node.upsert_schedule(record)
        if not reply.ok:  # validated above: only a record changed underneath us gets here
            raise refused(reply, "cron")
        return reply.created, await self.schedule(tenant, req.schedule_id)

    async def schedule(self, tenant: str, schedule_id: str) -> out.Schedule:
        row = self.node.get_schedule(tenant, schedule_id)
        payload = await self._visible(tenant, codec.TASK_SPEC.decode(row.template).payload)
        return schedule_json(row, payload=payload)

    async def schedules(self, tenant: str) -> out.Schedules:
        listed = []
        for row in self.node.list_schedules(tenant):
            payload = await self._visible(tenant, codec.TASK_SPEC.decode(row.template).payload)
            listed.append(schedule_json(row, payload=payload))
        return out.Schedules(schedules=listed)

    async def delete_schedule(self, tenant: str, schedule_id: str) -> out.ScheduleDeleted:
        reply = await self.node.delete_schedule(tenant, schedule_id)
        if not reply.ok:
            raise refused(reply, "schedule_id")
        return out.ScheduleDeleted(schedule_id=schedule_id, deleted=True)

    async def pause_schedule(self, tenant: str, schedule_id: str, *, paused: bool) -> out.Schedule:
        """Pause or resume; the schedule as stored after it."""
        reply = await self.node.pause_schedule(tenant, schedule_id, paused=paused)
        if not reply.ok:
            raise refused(reply, "schedule_id")
        return await self.schedule(tenant, schedule_id)

    # -- worker API ---------------------------------------------------------------------------

    def _reported(self, key: Grant, task_id: str) -> bool:
        """Whether ``task_id`` is a task of the key's tenant; Forbidden if it is one of
        another app than the key's (rule 1b)."""
        try:
            task = self.find(key.tenant, task_id)
        except NotFound:
            return False
        if not key.serves(task.app):
            raise Forbidden(
                f"task {task_id} is not a task of app {key.app!r}, the app this agent key is "
                "bound to: it reports only on leases of its app's tasks; nothing was changed",
                field="task_id",
            )
        return True

    def _fenced(self, key: Grant, task_id: str, lease_id: int) -> str | None:
        """Why an agent's record under ``lease_id`` can never be accepted, or None. Checked
        against applied state before anything is appended, so a zombie's or a replayed report
        costs no log record. A refusal here is final: lease ids only grow, and an agent holds
        a lease only once its grant was applied. What passes is checked again by the machine.
        """
        if not self._reported(key, task_id):
            return UNKNOWN_TASK
        # The processor's reader: its decoded-row cache holds the leased tasks (a plain
        # ``Tables`` would decode three rows per report, the node's largest cost per task).
        reader = self.node.processors[self.node.partition_of(task_id)].reader()
        held = holder(reader, task_id, lease_id)
        return held if isinstance(held, str) else None

    async def register(self, key: Grant, req: Register) -> list[str]:
        """Record the agent's app; the warnings of a deploy that removed handlers."""
        key.check_app(req.app, req.version)
        tenant = key.tenant
        await self.registry.ready(tenant)
        schemas = SchemaRegistry(self.registry.catalogs)
        definitions = await parse_definitions(
            req.definitions, tenant=tenant, app=req.app, schemas=schemas
        )
        removed = await self.registry.register(
            tenant,
            req.app,
            req.task_types,
            req.version,
            req.pinned,
            deploy=req.deploy,
            definitions=definitions,
        )
        if not removed:
            return []
        counts, counted = self.unfinished(tenant, req.app, removed)
        if self.unfinished_elsewhere is not None:
            more, also = await self.unfinished_elsewhere(tenant, req.app, removed)
            if not also & counted:  # else a partition moved meanwhile: not counted twice
                for task_type, n in more.items():
                    counts[task_type] += n
                counted |= also
        missing = sorted(set(range(self.node.partitions)) - counted)
        short = (
            ""
            if not missing
            else f" on the partitions counted (partition(s) {', '.join(map(str, missing))} "
            "have no leader now or their node did not answer: their tasks are not counted)"
        )
        return [
            f"deploy {req.deploy} (version {req.version!r}) of app {req.app!r} removes the "
            f"handler of task type {task_type!r}, referenced by {counts[task_type]} "
            f"unfinished task(s){short}: they stay queued, dealt to no agent of this deploy "
            "(an agent of an older one still running takes them); deploy a version with the "
            "handler, or cancel them"
            for task_type in removed
        ]

    def unfinished(
        self, tenant: str, app: str, task_types: Collection[str]
    ) -> tuple[dict[str, int], set[int]]:
        """How many of the tenant's tasks of ``app`` and each of ``task_types`` are not
        finished in the partitions led here, and those partitions (on a cluster, the others
        are counted by their leaders: ``unfinished_elsewhere``). From the partitions' state:
        the snapshot trails it, and a deploy's warning must count the tasks enqueued a moment
        ago. A scan of the partitions' tasks, run only when a deploy removes a type."""
        counts = dict.fromkeys(task_types, 0)
        led = {p for p in range(self.node.partitions) if self.node.is_open(p)}
        for p in sorted(led):
            for t in self.node.tables(p).tasks():
                if (
                    t.tenant == tenant
                    and t.app == app
                    and t.task_type in counts
                    and t.finished_ms is None
                ):
                    counts[t.task_type] += 1
        return counts, led

    async def poll(self, key: Grant, req: Poll) -> list[dict[str, Any]]:
        key.check_app(req.app, req.version)
        tenant = key.tenant
        self.breakers.report(
            tenant,
            req.app,
            req.agent_id,
            req.open_breakers,
            now_ms=self.node.clock.monotonic_ms(),
            wait_ms=req.wait_ms,
        )
        self.agents.polled(
            tenant,
            req.agent_id,
            app=req.app,
            version=req.version,
            queues=req.queues,
            task_types=req.task_types,
            capacity=req.capacity,
            wait_ms=req.wait_ms,
            now_ms=self.node.clock.now_ms(),
        )
        leases = await self.node.poll(
            agent_id=req.agent_id,
            app=req.app,
            tenants=[tenant],
            queues=req.queues,
            capacity=req.capacity,
            lease_ms=req.lease_ms,
            wait_ms=req.wait_ms,
            app_version=req.version,
            task_types=req.task_types,
        )
        if leases:
            failpoints.hit("lease-granted")  # durable grants, not yet delivered
        return await self._deliver(tenant, leases)

    async def _deliver(self, tenant: str, leases: list[Lease]) -> list[dict[str, Any]]:
        """The leases with their payloads and checkpoints. A lease whose value cannot be
        loaded (payloads rule 3) is not handed over but ended at once, so that it fails alone
        and the poll still delivers the others: FATAL ``PayloadUnavailable`` when the blob is
        gone or damaged (a dead letter: restore the blob, then retry it), a retryable failure
        of the same class when the blob store could not be reached (the task's retry policy
        tries again later)."""
        delivered: list[dict[str, Any]] = []
        ended: list[Completion] = []
        for lease in leases:
            try:
                payload = await self.payloads.value(tenant, lease.payload)
                checkpoint = await self.payloads.value(tenant, lease.checkpoint)
            except PayloadUnavailable as exc:
                ended.append(_unavailable(lease, exc))
                continue
            delivered.append(render.lease_json(lease, payload=payload, checkpoint=checkpoint))
        if ended:
            try:
                await self.node.complete(ended)
            except TransientError:  # its partition cannot take it now: the lease lapses
                log.warning("could not end %d lease(s) whose payload is unavailable", len(ended))
        return delivered

    async def signals(self, key: Grant, req: Signals) -> list[dict[str, Any]]:
        """The cancels of leases ``req.agent_id`` holds, pushed as they come
        (``processor/signals.py``): [] when none came within ``req.wait_ms``."""
        if not key.serves(req.app):
            key.check_app(req.app, key.version)  # raises: the key serves another app
        got = await self.node.signals.wait(key.tenant, req.app, req.agent_id, req.wait_ms)
        return [{"task_id": t, "lease_id": lease, "action": "CANCEL"} for t, lease in got]

    def heartbeat(self, key: Grant, refs: list[LeaseRef]) -> list[dict[str, str]]:
        known = [self._reported(key, ref.task_id) for ref in refs]  # all checked first
        return [
            {
                "task_id": ref.task_id,
                "action": self.node.heartbeat(ref.task_id, ref.lease_id) if mine else "LOST",
            }
            for ref, mine in zip(refs, known, strict=True)
        ]

    async def complete(self, key: Grant, items: list[CompletionRequest]) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = [_rejected(i.task_id) for i in items]
        mine: list[int] = []
        batch: list[Completion] = []
        for i, item in enumerate(items):
            if (why := self._fenced(key, item.task_id, item.lease_id)) is not None:
                results[i] = _rejected(item.task_id, why)
                continue
            result = None
            if item.result is not None:
                result = await self.payloads.pack(
                    key.tenant, compact(item.result), f"{item.path}.result"
                )
            mine.append(i)
            completion = _completion(item, result)
            if item.fan_out is not None and item.outcome == Outcome.FAN_OUT:
                completion = await self._fan_out(key.tenant, item, item.fan_out, completion)
            batch.append(completion)
        # The node answers one reply per item, in order.
        for i, reply in zip(mine, await self.node.complete(batch) if batch else [], strict=True):
            results[i] = _result(reply)
            item = items[i]
            if reply.ok and item.log and self.logs is not None:
                self.logs.put(item.task_id, item.lease_id, item.log)  # fenced: after the ok
        return results

    async def _fan_out(
        self, tenant: str, item: CompletionRequest, fan: FanOutRequest, completion: Completion
    ) -> Completion:
        """The children as enqueue specs (in the workflow's app unless they name one; ids and
        keys are the machine's to derive); a child that cannot be enqueued fails the workflow."""
        app = self.find(tenant, item.task_id).app
        await self.registry.ready(tenant)
        now_ms = self.node.clock.now_ms()
        children = []
        try:
            for index, body in enumerate(fan.children):
                path = f"{item.path}.fan_out.children[{index}]"
                if isinstance(body, dict):
                    body = {"app": app, **body, "idempotency_key": None}
                req = self.registry.resolve(tenant, parse_task(body, path))
                payload = await self.payloads.pack(tenant, req.payload, req.field("payload"))
                resume = self.registry.resume_of(tenant, req.app, req.task_type)
                spec = to_spec(
                    req,
                    task_id="",
                    tenant=tenant,
                    payload=payload,
                    now_ms=now_ms,
                    resume=resume,
                    searchable=self.keys.settings(tenant).show_payloads,
                )
                children.append(codec.TASK_SPEC.encode(spec))
        except ContractError as exc:
            return bad_fan_out(completion, str(exc))
        step = FanOut(
            identity=fan.identity, position=fan.position, mode=fan.mode, children=children
        )
        return dataclasses.replace(completion, fan_out=step)

    async def steps(self, key: Grant, items: list[StepRequest]) -> list[dict[str, Any]]:
        """Step claims and commits; values are stored as compact JSON (the step cap is the
        inline cap, so they never go to the blob store)."""
        results: list[dict[str, Any]] = [_rejected(i.task_id) for i in items]
        mine: list[int] = []
        batch: list[StepWrite] = []
        for i, item in enumerate(items):
            if (why := self._fenced(key, item.task_id, item.lease_id)) is not None:
                results[i] = _rejected(item.task_id, why)
                continue
            value = compact(item.value) if item.op == StepOp.COMMIT else None
            mine.append(i)
            batch.append(
                StepWrite(
                    task_id=item.task_id,
                    lease_id=item.lease_id,
                    op=item.op,
                    identity=item.identity,
                    position=item.position,
                    value=value,
                )
            )
        for i, reply in zip(mine, await self.node.steps(batch) if batch else [], strict=True):
            results[i] = _result(reply)
        return results

    async def checkpoint(self, key: Grant, items: list[CheckpointRequest]) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = [_rejected(i.task_id) for i in items]
        mine: list[int] = []
        batch: list[Checkpoint] = []
        for i, item in enumerate(items):
            if (why := self._fenced(key, item.task_id, item.lease_id)) is not None:
                results[i] = _rejected(item.task_id, why)
                continue
            value = await self.payloads.pack(key.tenant, compact(item.value), f"{item.path}.value")
            mine.append(i)
            batch.append(Checkpoint(task_id=item.task_id, lease_id=item.lease_id, value=value))
        for i, reply in zip(mine, await self.node.checkpoint(batch) if batch else [], strict=True):
            results[i] = _result(reply)
        return results


def _check_batch_keys(reqs: list[EnqueueRequest], specs: list[TaskSpec]) -> None:
    """Two items of one batch with one key must ask for the same task (rule 2): checked
    before the batch is appended, so a batch that holds a conflict writes nothing."""
    first: dict[tuple[str, str], tuple[EnqueueRequest, TaskSpec]] = {}
    for req, spec in zip(reqs, specs, strict=True):
        if req.idempotency_key is None:
            continue
        seen, seen_spec = first.setdefault((req.app, req.idempotency_key), (req, spec))
        differing = differing_fields(seen_spec, spec)
        if differing:
            field = req.field("idempotency_key")
            raise Conflict(
                f"{field}: idempotency key {req.idempotency_key!r} already names {seen.path}, "
                f"which differs in {', '.join(differing)}; use a new key for a different task",
                field=field,
            )


def _unavailable(lease: Lease, exc: PayloadUnavailable) -> Completion:
    """The completion that ends a lease whose payload or checkpoint cannot be loaded."""
    if exc.permanent:
        todo = "restore the blob, or enqueue the task again, then retry this task"
    else:
        todo = "the blob store could not be reached; the task is retried by its retry policy"
    return Completion(
        task_id=lease.task_id,
        lease_id=lease.lease_id,
        outcome=Outcome.FATAL if exc.permanent else Outcome.FAILED,
        error_class="PayloadUnavailable",
        error_message=f"the task's payload or checkpoint cannot be loaded: {exc}; {todo}",
    )


def _rejected(task_id: str, reason: str = UNKNOWN_TASK) -> dict[str, Any]:
    return {"task_id": task_id, "ok": False, "reason": reason}


def _result(reply: Reply) -> dict[str, Any]:
    result = {"task_id": reply.task_id, "ok": reply.ok, "reason": reply.reason}
    if reply.retry_after_ms is not None:
        result["retry_after_ms"] = reply.retry_after_ms
    return result


def _completion(item: CompletionRequest, result: bytes | None) -> Completion:
    return Completion(
        task_id=item.task_id,
        lease_id=item.lease_id,
        outcome=item.outcome,
        result=result,
        error_class=item.error_class,
        error_message=item.error_message,
        error_stack=item.error_stack,
        retry_after_ms=item.retry_after_ms,
        sleep=item.sleep,
        wait=item.wait,
    )
