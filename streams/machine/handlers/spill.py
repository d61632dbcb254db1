"""The receiving end of a fan-out that spilled across partitions (workflows.py rules 7-8).

Rule 1 (EnqueueChildren): each child is enqueued on this partition with its link back to the
workflow's barrier slot, unless a task with its id exists already (a resent message): then
nothing changes. A child whose id is not the one ``child_id`` derives from (parent, identity,
index) for this node is skipped: the link must name the slot the id was derived for.
Rule 2 (LandChildren): each ChildDone is landed in its slot on this, the workflow's,
partition exactly like a local child's end (``workflows.land``); a filled slot, a gone
barrier or an item that is not a terminal status of a child of that step is a no-op.
Rule 3: both are answered with no reply; the shipper that appended them waits for none.
"""

from __future__ import annotations

from conveyor.schemas import codec
from conveyor.schemas.types import (
    TERMINAL,
    ChildLink,
    ChildResult,
    EnqueueChildren,
    LandChildren,
    TaskStatus,
)
from conveyor.store.tables import Tables
from conveyor.streams.machine.handlers.enqueue import enqueue_spec
from conveyor.streams.machine.handlers.workflows import child_id, land
from conveyor.streams.machine.lifecycle import spare_index
from conveyor.streams.machine.outcome import Meta, Outcome

_TERMINAL_VALUES = frozenset(status.value for status in TERMINAL)


def apply_enqueue_children(
    tables: Tables, record: EnqueueChildren, meta: Meta, out: Outcome
) -> None:
    """Rule 1."""
    for index, raw in zip(record.indexes, record.tasks, strict=False):
        try:
            spec = codec.TASK_SPEC.decode(raw)
        except Exception:  # fastavro raises many types on hostile input; never halt on it
            continue
        task_id = spec.task_id
        if task_id != child_id(record.parent_id, record.identity, index, meta.partitions):
            continue
        if tables.task(task_id) is not None:
            continue  # resent: this child exists (and may have ended) already
        link = ChildLink(parent_id=record.parent_id, identity=record.identity, index=index)
        tables.put_child_link(task_id, link)
        enqueue_spec(tables, spec, raw, meta, out, spare_index(out))


def apply_land_children(tables: Tables, record: LandChildren, meta: Meta, out: Outcome) -> None:
    """Rule 2."""
    for item in record.items:
        if item.status not in _TERMINAL_VALUES:
            continue
        if item.child_id != child_id(item.parent_id, item.identity, item.index, meta.partitions):
            continue
        succeeded = item.status == TaskStatus.SUCCEEDED
        row = ChildResult(
            task_id=item.child_id,
            status=item.status,
            result=item.result if succeeded else None,
            error_class=None if succeeded else item.error_class,
            error_message=None if succeeded else item.error_message,
        )
        land(tables, item.parent_id, item.identity, item.index, row, meta, out)
