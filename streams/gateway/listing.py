"""Listing tasks and finding dead letters, by scanning the partitions' RocksDB tables.

The fallback for a node run without the Postgres query snapshot (``--no-projection``); with
it, listing goes to ``snapshot.py``. A scan decodes every
task row of every partition, so one request examines at most ``SCAN_ROWS_MAX`` rows and then
returns what it found with a cursor: a page may hold fewer than ``limit`` tasks (even none);
clients continue while ``next_cursor`` is not null.

The cursor is opaque to clients: base64url of ``<partition>:<last task id>``.
"""

from __future__ import annotations

import base64
import binascii

from conveyor.errors import ContractError, InvariantError
from conveyor.frozen import frozen
from conveyor.schemas.types import Task
from conveyor.store import keys
from conveyor.streams.gateway.fields import check_task_id
from conveyor.streams.gateway.validation import TaskFilter
from conveyor.streams.node import Node

SCAN_ROWS_MAX = 10_000


@frozen
class Cursor:
    partition: int
    after: str  # the last task id returned or examined in that partition

    def encode(self) -> str:
        return base64.urlsafe_b64encode(f"{self.partition}:{self.after}".encode()).decode()

    @staticmethod
    def decode(text: str, partitions: int) -> Cursor:
        try:
            raw = base64.urlsafe_b64decode(text.encode("ascii")).decode("ascii")
            part, after = raw.split(":", 1)
            partition = int(part)
            check_task_id(after, "cursor")
        except (ValueError, UnicodeError, binascii.Error, ContractError):
            raise ContractError(
                "cursor: not a cursor this server issued; pass next_cursor back unchanged",
                field="cursor",
            ) from None
        if not 0 <= partition < partitions:
            raise ContractError("cursor: names no partition of this node", field="cursor")
        return Cursor(partition, after)


def matches(task: Task, tenant: str, flt: TaskFilter) -> bool:
    return (
        task.tenant == tenant
        and (not flt.statuses or task.status in flt.statuses)
        and (flt.queue is None or task.queue == flt.queue)
        and (flt.task_type is None or task.task_type == flt.task_type)
        and (flt.since_ms is None or task.created_ms >= flt.since_ms)
        and (flt.created_to_ms is None or task.created_ms < flt.created_to_ms)
        and (flt.error_class is None or task.error_class == flt.error_class)
        and _finished_in(task.finished_ms, flt)
        and _error_has(task.error_message, flt.error_text)
    )


def _finished_in(finished_ms: int | None, flt: TaskFilter) -> bool:
    if flt.finished_from_ms is None and flt.finished_to_ms is None:
        return True
    return (
        finished_ms is not None
        and (flt.finished_from_ms is None or finished_ms >= flt.finished_from_ms)
        and (flt.finished_to_ms is None or finished_ms < flt.finished_to_ms)
    )


def _error_has(message: str | None, text: str | None) -> bool:
    return not text or (message is not None and text.lower() in message.lower())


def list_tasks(
    node: Node, tenant: str, flt: TaskFilter, limit: int, cursor: str | None
) -> tuple[list[Task], str | None]:
    """One page of the tenant's tasks in (partition, task id) order, and the next cursor."""
    start = Cursor.decode(cursor, node.partitions) if cursor else Cursor(0, "")
    found: list[Task] = []
    scanned = 0
    for p in range(start.partition, node.partitions):
        after = start.after if p == start.partition else ""
        # Scans are inclusive of their start key: begin just past the last id returned.
        first = keys.task(after) + b"\x00" if after else None
        tables = node.tables(p)
        for key, _ in tables.scan(keys.TASKS, first):
            task = tables.task(key[len(keys.TASKS) :].decode())
            if task is None:
                raise InvariantError(f"task row {key!r} vanished during a scan")
            scanned += 1
            if matches(task, tenant, flt):
                found.append(task)
            if len(found) >= limit or scanned >= SCAN_ROWS_MAX:
                return found, Cursor(p, task.task_id).encode()
    return found, None
