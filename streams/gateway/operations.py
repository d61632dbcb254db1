"""Bulk operations: retry or cancel every task a list filter matches, in the background.

    POST /v1/tasks:retry  {"filter"} --+
    POST /v1/tasks:cancel {"filter"} --+--> operations row --> 202 {"operation_id", ...}
                                                 |
    runner (one asyncio task per operation):     v
      loop: next BATCH_TASKS keys from the snapshot (keyset, after the cursor)
            -> node.retry_failed / node.cancel_many (one record per partition, awaited)
            -> advance the cursor and counters in the row -> yield
    GET /v1/operations/{id} reads the row: matched, done, changed, state.

Rules, and why:

1. The request never does the work: it writes the row, starts the runner and answers 202, so
   a bulk retry of a million tasks costs the caller one insert.
2. One batch at a time, and the runner sleeps between batches, as long as it takes the node
   to do a batch or longer (``DUTY``): the processors apply one bounded record per partition
   per batch, and API requests and agents' records interleave with them, so the API stays
   responsive while a million-row operation runs (``conveyor bench bulk`` measures it).
3. Resumable: the cursor is in Postgres and advances only after a batch is applied; a node
   that starts resumes every running operation (``resume``). Redoing the last batch after a
   crash is harmless: the machine ignores a retry of a retried task and a cancel of a
   canceled one.
4. Tasks are selected from the snapshot, which trails the processors by the projection lag;
   the machine decides on the live state, so a task that stopped matching is left alone.
5. Tenant-scoped: the row carries the tenant; another tenant's id answers 404.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
from collections.abc import Sequence
from typing import Any, Protocol

import asyncpg
import msgspec

from conveyor.contract import replies as out
from conveyor.errors import FencedError, NotFound, TransientError
from conveyor.schemas.types import TERMINAL, TaskStatus
from conveyor.store.postgres import StoreUnavailable
from conveyor.store.postgres import operations as rows
from conveyor.store.postgres.operations import Operation
from conveyor.store.postgres.queries import TaskQuery, count_tasks, task_keys
from conveyor.streams.machine import Reply
from conveyor.streams.node import Node

log = logging.getLogger("conveyor.operations")

RETRY = "retry"
CANCEL = "cancel"
BATCH_TASKS = 500  # task ids per batch: about BATCH_TASKS / partitions per log record
# The share of the node's time the runner may take (rule 2): after a batch that took t, it
# sleeps t * (1 - DUTY) / DUTY. A batch's work goes on after it returns (the projector folds
# its events), so the node spends more than DUTY of its time on the operation.
DUTY = 0.3
PAUSE_MS_MIN = 5.0
STORE_RETRY_MS = 1_000.0  # after Postgres was unreachable
_ID = re.compile(r"^[0-9a-f]{32}$")
LIVE_STATUSES = tuple(sorted(s.value for s in TaskStatus if s not in TERMINAL))

_UNAVAILABLE = (OSError, asyncpg.PostgresConnectionError, asyncpg.InterfaceError)


def retry_query(q: TaskQuery) -> TaskQuery:
    """A bulk retry takes FAILED tasks only (the dead letters)."""
    return TaskQuery(**{**_fields(q), "statuses": (TaskStatus.FAILED.value,)})


def cancel_query(q: TaskQuery) -> TaskQuery:
    """A bulk cancel takes unfinished tasks only: the asked statuses, or every live one."""
    return TaskQuery(**{**_fields(q), "statuses": q.statuses or LIVE_STATUSES})


def _fields(q: TaskQuery) -> dict[str, Any]:
    return {name: getattr(q, name) for name in q.__dataclass_fields__}


def changed(kind: str, replies: list[Reply]) -> int:
    """Retry: new tasks made. Cancel: tasks now CANCELED or asked to stop (LEASED)."""
    if kind == RETRY:
        return sum(1 for r in replies if r.created)
    stopped = (TaskStatus.CANCELED, TaskStatus.LEASED)
    return sum(1 for r in replies if r.ok and r.status in stopped)


class Submitter(Protocol):
    """Where a batch goes: the node (``Node``), or on a cluster each id's partition's owner
    (``forward.ClusterSubmitter``)."""

    async def retry_failed(self, tenant: str, task_ids: Sequence[str]) -> list[Reply]: ...

    async def cancel_many(
        self, tenant: str, task_ids: Sequence[str], reason: str
    ) -> list[Reply]: ...


class BulkOperations:
    """Starts, runs, resumes and reports the bulk operations of one node."""

    def __init__(self, node: Node, pool: asyncpg.Pool) -> None:
        self.node = node
        self.pool = pool
        self.submitter: Submitter = node
        self._running: dict[str, asyncio.Task[None]] = {}

    async def start(
        self, kind: str, query: TaskQuery, *, reason: str | None, limit: int | None
    ) -> out.Operation:
        query = retry_query(query) if kind == RETRY else cancel_query(query)
        try:
            op = await rows.create(
                self.pool,
                operation_id=secrets.token_hex(16),
                kind=kind,
                query=query,
                reason=reason,
                limit_tasks=limit,
                now_ms=self.node.clock.now_ms(),
            )
        except _UNAVAILABLE as exc:
            raise StoreUnavailable(f"the query snapshot is unavailable: {exc}") from exc
        self._spawn(op)
        return reply(op)

    async def get(self, tenant: str, operation_id: str) -> out.Operation:
        op = None
        if _ID.match(operation_id):
            try:
                op = await rows.get(self.pool, tenant, operation_id)
            except _UNAVAILABLE as exc:
                raise StoreUnavailable(f"the query snapshot is unavailable: {exc}") from exc
        if op is None:
            raise NotFound(f"no operation {operation_id}", field="operation_id")
        return reply(op)

    async def resume(self) -> int:
        """Continue every operation a previous run left running; how many (rule 3)."""
        unfinished = await rows.running(self.pool)
        for op in unfinished:
            log.info("resuming %s operation %s after %d tasks", op.kind, op.operation_id, op.done)
            self._spawn(op)
        return len(unfinished)

    async def close(self) -> None:
        """Stop the runners; their operations stay running in Postgres, for ``resume``."""
        tasks = list(self._running.values())
        self._running.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _spawn(self, op: Operation) -> None:
        task = asyncio.create_task(self._supervise(op), name=f"operation-{op.operation_id}")
        self._running[op.operation_id] = task
        task.add_done_callback(lambda _: self._running.pop(op.operation_id, None))

    async def _supervise(self, op: Operation) -> None:
        clock = self.node.clock
        while True:
            try:
                await self._run(op)
                await rows.finish(self.pool, op.operation_id, rows.DONE, clock.now_ms())
                return
            except asyncio.CancelledError:
                raise
            except (*_UNAVAILABLE, TransientError, FencedError) as exc:
                # Postgres unreachable, or a log or leadership hiccup: the batch is redone.
                log.warning("operation %s paused, retrying: %s", op.operation_id, exc)
                await clock.sleep_ms(STORE_RETRY_MS)
                fresh = await _reload(self.pool, op)
                if fresh is None:
                    return
                op = fresh
            except Exception as exc:
                log.exception("operation %s failed", op.operation_id)
                with contextlib.suppress(*_UNAVAILABLE):
                    error = f"{type(exc).__name__}: {exc}"
                    await rows.finish(
                        self.pool, op.operation_id, rows.FAILED, clock.now_ms(), error
                    )
                return

    async def _run(self, op: Operation) -> None:
        clock = self.node.clock
        if op.matched is None:
            matched = await count_tasks(self.pool, op.query)
            if op.limit_tasks is not None:
                matched = min(matched, op.limit_tasks)
            await rows.set_matched(self.pool, op.operation_id, matched, clock.now_ms())
        cursor, done = op.cursor, op.done
        while op.limit_tasks is None or done < op.limit_tasks:
            started = clock.monotonic_ms()
            size = (
                BATCH_TASKS if op.limit_tasks is None else min(BATCH_TASKS, op.limit_tasks - done)
            )
            keys = await task_keys(self.pool, op.query, size, cursor)
            if not keys:
                return
            ids = [task_id for _, task_id in keys]
            if op.kind == RETRY:
                replies = await self.submitter.retry_failed(op.tenant, ids)
            else:
                replies = await self.submitter.cancel_many(op.tenant, ids, op.reason or "")
            cursor, done = keys[-1], done + len(ids)
            await rows.advance(
                self.pool,
                op.operation_id,
                cursor=cursor,
                done=len(ids),
                changed=changed(op.kind, replies),
                now_ms=clock.now_ms(),
            )
            took = clock.monotonic_ms() - started
            await clock.sleep_ms(max(PAUSE_MS_MIN, took * (1 - DUTY) / DUTY))


def reply(op: Operation) -> out.Operation:
    """The operation as ``GET /v1/operations/{id}`` answers it: the row's JSON, checked by its
    model (its ``filter`` is the stored query, a dict the model leaves free-form)."""
    return msgspec.convert(rows.as_json(op), out.Operation)


async def _reload(pool: asyncpg.Pool, op: Operation) -> Operation | None:
    """The operation as stored (its cursor may be ahead of ``op``'s); None once finished."""
    with contextlib.suppress(*_UNAVAILABLE):
        fresh = await rows.get(pool, op.tenant, op.operation_id)
        return fresh if fresh is not None and fresh.state == rows.RUNNING else None
    return op
