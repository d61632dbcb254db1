"""The webhooks' durable state: registrations, deliveries and the deliverer's cursor, in one
SQLite file (``home/webhooks.sqlite3``, WAL).

Rules, and why:

1. One transaction per step that matters: a registration is committed before its id is
   answered; the deliveries made from a stretch of the events log are committed together with
   the cursor past that stretch. A kill -9 at any point leaves either both or neither, so on
   restart the deliverer re-reads from the cursor and no delivery is lost (at-least-once: a
   delivery sent but not yet marked is sent again, with the same ``webhook-id``).
   Registrations are fsync'd before they are answered (``synchronous=FULL`` for them); the
   rest is written with ``synchronous=NORMAL``, which a kill -9 cannot undo (the WAL is in
   the OS's cache) and a power cut can only roll back to an earlier commit: the cursor then
   goes back with the deliveries it made, they are made again from the events log, and an
   attempt's outcome that is lost means one more attempt. An fsync per attempt's outcome
   capped deliveries at ~100/s on a loaded machine.
2. A delivery is keyed by (webhook, event id): reading a stretch twice (a restart, a batch the
   outbox shipped twice) makes no second delivery.
3. Every call runs on one thread of its own (``Store.run``), so SQLite's fsyncs never stall the
   node's event loop, and calls are serialized.
4. The secret is stored here and returned once, by ``create``; listings never carry it.

Why here and not as records of the partitions' log (as schedules are): deliveries and the
cursor are this node's work on this node's events log, and must be written in the same
transaction as each other (rule 1), which the record log cannot do; registrations are few and
read on every event, so they live beside them. The cost: a registration belongs to the node
that took it. On a Kafka cluster each node keeps its own; moving webhooks with the partitions
would need them as records applied by the machine, with the cursor per partition in the
partition's store. That is not done.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from conveyor.frozen import frozen

FILE_NAME = "webhooks.sqlite3"
_T = TypeVar("_T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS webhooks (
  id TEXT PRIMARY KEY, tenant TEXT NOT NULL, url TEXT NOT NULL, events TEXT NOT NULL,
  task_types TEXT, secret TEXT NOT NULL, created_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS cursor (id INTEGER PRIMARY KEY CHECK (id = 0), value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS deliveries (
  webhook_id TEXT NOT NULL, event_id TEXT NOT NULL, event_type TEXT NOT NULL,
  body TEXT NOT NULL, status TEXT NOT NULL, attempts INTEGER NOT NULL,
  created_ms INTEGER NOT NULL, next_ms INTEGER NOT NULL, deadline_ms INTEGER NOT NULL,
  updated_ms INTEGER NOT NULL, last_status INTEGER, last_error TEXT,
  PRIMARY KEY (webhook_id, event_id));
CREATE INDEX IF NOT EXISTS deliveries_due ON deliveries (status, next_ms);
CREATE INDEX IF NOT EXISTS deliveries_recent ON deliveries (webhook_id, updated_ms);
"""

PENDING, SUCCEEDED, FAILED = "pending", "succeeded", "failed"


@frozen(kw_only=True)
class Webhook:
    id: str
    tenant: str
    url: str
    events: frozenset[str]
    task_types: frozenset[str] | None  # None: every task type
    secret: str
    created_ms: int

    def public(self) -> dict[str, Any]:
        """What a listing shows: everything but the secret (rule 4)."""
        return {
            "webhook_id": self.id,
            "url": self.url,
            "events": sorted(self.events),
            "task_types": None if self.task_types is None else sorted(self.task_types),
            "created_ms": self.created_ms,
        }


@frozen(kw_only=True)
class Delivery:
    webhook_id: str
    event_id: str
    event_type: str
    body: str
    status: str
    attempts: int
    created_ms: int
    next_ms: int
    deadline_ms: int
    updated_ms: int
    last_status: int | None
    last_error: str | None

    def public(self) -> dict[str, Any]:
        return {
            "delivery_id": self.event_id,
            "event_type": self.event_type,
            "status": self.status,
            "attempts": self.attempts,
            "created_ms": self.created_ms,
            "updated_ms": self.updated_ms,
            "next_attempt_ms": self.next_ms if self.status == PENDING else None,
            "last_status": self.last_status,
            "last_error": self.last_error,
        }


@frozen(kw_only=True)
class NewDelivery:
    webhook_id: str
    event_id: str
    event_type: str
    body: str


@frozen(kw_only=True)
class Outcome:
    """How one attempt of ``delivery`` ended."""

    delivery: Delivery
    status: str
    now_ms: int
    next_ms: int
    http_status: int | None
    error: str | None


_DELIVERY_COLUMNS = (
    "webhook_id, event_id, event_type, body, status, attempts, created_ms, next_ms, "
    "deadline_ms, updated_ms, last_status, last_error"
)


@contextlib.contextmanager
def _synced(db: sqlite3.Connection) -> Iterator[None]:
    """Commits inside are fsync'd before they return (rule 1: registrations)."""
    db.execute("PRAGMA synchronous=FULL")
    try:
        yield
    finally:
        db.execute("PRAGMA synchronous=NORMAL")


def _key(d: Delivery) -> tuple[str, str]:
    return d.webhook_id, d.event_id


def _webhook(row: Sequence[Any]) -> Webhook:
    return Webhook(
        id=row[0],
        tenant=row[1],
        url=row[2],
        events=frozenset(json.loads(row[3])),
        task_types=None if row[4] is None else frozenset(json.loads(row[4])),
        secret=row[5],
        created_ms=row[6],
    )


def _delivery(row: Sequence[Any]) -> Delivery:
    return Delivery(
        webhook_id=row[0],
        event_id=row[1],
        event_type=row[2],
        body=row[3],
        status=row[4],
        attempts=row[5],
        created_ms=row[6],
        next_ms=row[7],
        deadline_ms=row[8],
        updated_ms=row[9],
        last_status=row[10],
        last_error=row[11],
    )


class Store:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhooks-db")
        self._db = self._thread.submit(self._connect).result()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")  # rule 1
        db.executescript(_SCHEMA)
        return db

    async def run(self, fn: Callable[[sqlite3.Connection], _T]) -> _T:
        """``fn(db)`` on the store's thread (rule 3)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, self._db)

    def close(self) -> None:
        self._thread.submit(self._db.close).result()
        self._thread.shutdown()

    # -- registrations -------------------------------------------------------------------------

    async def add_webhook(self, hook: Webhook) -> None:
        task_types = None if hook.task_types is None else json.dumps(sorted(hook.task_types))
        row = (hook.id, hook.tenant, hook.url, json.dumps(sorted(hook.events)), task_types)

        def add(db: sqlite3.Connection) -> None:
            with _synced(db):
                db.execute(
                    "INSERT INTO webhooks VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (*row, hook.secret, hook.created_ms),
                )

        await self.run(add)

    async def webhooks(self) -> list[Webhook]:
        def rows(db: sqlite3.Connection) -> list[Any]:
            return db.execute("SELECT * FROM webhooks ORDER BY created_ms, id").fetchall()

        return [_webhook(row) for row in await self.run(rows)]

    async def delete_webhook(self, tenant: str, webhook_id: str) -> bool:
        """Drop the webhook and its deliveries (pending ones are never sent)."""

        def delete(db: sqlite3.Connection) -> bool:
            with _synced(db):
                return _delete(db)

        def _delete(db: sqlite3.Connection) -> bool:
            db.execute("BEGIN IMMEDIATE")
            try:
                gone = db.execute(
                    "DELETE FROM webhooks WHERE id = ? AND tenant = ?", (webhook_id, tenant)
                ).rowcount
                if gone:
                    db.execute("DELETE FROM deliveries WHERE webhook_id = ?", (webhook_id,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return bool(gone)

        return await self.run(delete)

    # -- the cursor and new deliveries (rule 1) ---------------------------------------------------

    async def cursor(self) -> str | None:
        def read(db: sqlite3.Connection) -> str | None:
            row = db.execute("SELECT value FROM cursor WHERE id = 0").fetchone()
            return None if row is None else str(row[0])

        return await self.run(read)

    async def commit(
        self, cursor: str, new: Sequence[NewDelivery], now_ms: int, deadline_ms: int
    ) -> int:
        """Insert ``new`` (those already there stay as they are, rule 2) and move the cursor,
        in one transaction; how many were inserted."""

        def commit(db: sqlite3.Connection) -> int:
            times = (now_ms, now_ms, deadline_ms, now_ms)
            db.execute("BEGIN IMMEDIATE")
            try:
                before = db.total_changes
                db.executemany(
                    f"INSERT OR IGNORE INTO deliveries ({_DELIVERY_COLUMNS}) "
                    "VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, ?, NULL, NULL)",
                    [
                        (d.webhook_id, d.event_id, d.event_type, d.body, PENDING, *times)
                        for d in new
                    ],
                )
                inserted = db.total_changes - before
                db.execute("INSERT OR REPLACE INTO cursor VALUES (0, ?)", (cursor,))
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
            return inserted

        return await self.run(commit)

    # -- attempts ----------------------------------------------------------------------------------

    async def due(self, now_ms: int, limit: int, busy: set[tuple[str, str]]) -> list[Delivery]:
        """Pending deliveries due by ``now_ms``, oldest first, not among ``busy``."""

        def rows(db: sqlite3.Connection) -> list[Any]:
            return db.execute(
                f"SELECT {_DELIVERY_COLUMNS} FROM deliveries WHERE status = ? AND next_ms <= ? "
                "ORDER BY next_ms LIMIT ?",
                (PENDING, now_ms, limit + len(busy)),
            ).fetchall()

        found = [_delivery(row) for row in await self.run(rows)]
        return [d for d in found if (d.webhook_id, d.event_id) not in busy][:limit]

    async def next_due_ms(self, after_ms: int) -> int | None:
        """When the first pending delivery not yet due at ``after_ms`` is due."""

        def first(db: sqlite3.Connection) -> int | None:
            row = db.execute(
                "SELECT MIN(next_ms) FROM deliveries WHERE status = ? AND next_ms > ?",
                (PENDING, after_ms),
            ).fetchone()
            return None if row is None or row[0] is None else int(row[0])

        return await self.run(first)

    async def record(self, outcomes: Sequence[Outcome]) -> None:
        """The outcomes of attempts, in one transaction."""
        rows = [
            (o.status, o.next_ms, o.now_ms, o.http_status, o.error, *_key(o.delivery))
            for o in outcomes
        ]

        def update(db: sqlite3.Connection) -> None:
            db.execute("BEGIN IMMEDIATE")
            try:
                db.executemany(
                    "UPDATE deliveries SET status = ?, attempts = attempts + 1, next_ms = ?, "
                    "updated_ms = ?, last_status = ?, last_error = ? "
                    "WHERE webhook_id = ? AND event_id = ?",
                    rows,
                )
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise

        await self.run(update)

    async def redeliver(
        self, webhook_id: str, event_id: str, now_ms: int, deadline_ms: int
    ) -> bool:
        """Make a delivery pending again, due now; False if there is no such delivery."""

        def update(db: sqlite3.Connection) -> bool:
            return bool(
                db.execute(
                    "UPDATE deliveries SET status = ?, next_ms = ?, deadline_ms = ?, "
                    "updated_ms = ? WHERE webhook_id = ? AND event_id = ?",
                    (PENDING, now_ms, deadline_ms, now_ms, webhook_id, event_id),
                ).rowcount
            )

        return await self.run(update)

    async def deliveries(self, webhook_id: str, status: str | None, limit: int) -> list[Delivery]:
        """A webhook's deliveries, the most recently changed first."""

        def rows(db: sqlite3.Connection) -> list[Any]:
            where, args = "webhook_id = ?", [webhook_id]
            if status is not None:
                where, args = where + " AND status = ?", [*args, status]
            return db.execute(
                f"SELECT {_DELIVERY_COLUMNS} FROM deliveries WHERE {where} "
                "ORDER BY updated_ms DESC, event_id LIMIT ?",
                (*args, limit),
            ).fetchall()

        return [_delivery(row) for row in await self.run(rows)]

    async def prune(self, succeeded_before_ms: int) -> int:
        """Forget succeeded deliveries last changed before ``succeeded_before_ms``, and those
        of webhooks that are gone."""

        def delete(db: sqlite3.Connection) -> int:
            # Also those of a webhook deleted while the feed was making them.
            return int(
                db.execute(
                    "DELETE FROM deliveries WHERE (status = ? AND updated_ms < ?) "
                    "OR webhook_id NOT IN (SELECT id FROM webhooks)",
                    (SUCCEEDED, succeeded_before_ms),
                ).rowcount
            )

        return await self.run(delete)
