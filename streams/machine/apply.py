"""apply(tables, record, meta) -> Outcome: the whole state machine behind one function.

Rule 1: pure. No clock (time is ``meta.ts_ms``), no randomness (jitter and derived ids are
hashes of ids and offsets), no I/O beyond the ``Tables`` handed in. A test bans the imports.
Rule 2: a valid record that does not apply (stale lease, stale epoch, unknown task) is answered
with a rejection in the outcome, never an exception.
Rule 3: records only the leader proposes are ignored when their epoch is older than the last
epoch announced through the log, so a deposed leader's writes are harmless even where the log
cannot refuse them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import assert_never

from conveyor.schemas.types import (
    LEADER_RECORDS,
    AnnounceEpoch,
    CancelTasks,
    CompleteAttempts,
    DeleteSchedule,
    DeleteSchemas,
    EnqueueChildren,
    EnqueueTasks,
    ExpireLeases,
    FireTimers,
    GrantLeases,
    LandChildren,
    PauseQueue,
    PauseSchedule,
    Record,
    RecordSteps,
    RegisterSchema,
    RegisterTypes,
    RetryFailed,
    SaveCheckpoints,
    SendEvents,
    SetCompatibility,
    TaskSpec,
    UpsertSchedule,
)
from conveyor.store import keys
from conveyor.store.tables import Tables
from conveyor.streams.machine.handlers.cancel import apply_cancel, apply_retry_failed
from conveyor.streams.machine.handlers.complete import (
    apply_checkpoints,
    apply_complete,
    apply_expire,
)
from conveyor.streams.machine.handlers.dispatch import apply_grant
from conveyor.streams.machine.handlers.enqueue import apply_enqueue
from conveyor.streams.machine.handlers.events import apply_send_events
from conveyor.streams.machine.handlers.queues import apply_pause_queue
from conveyor.streams.machine.handlers.schedules import (
    apply_delete_schedule,
    apply_pause_schedule,
    apply_upsert_schedule,
)
from conveyor.streams.machine.handlers.spill import apply_enqueue_children, apply_land_children
from conveyor.streams.machine.handlers.steps import apply_steps
from conveyor.streams.machine.handlers.timers import apply_timers
from conveyor.streams.machine.handlers.types import (
    apply_delete_schemas,
    apply_register_schema,
    apply_register_types,
    apply_set_compatibility,
)
from conveyor.streams.machine.handlers.workflows import settle
from conveyor.streams.machine.outcome import Meta, Outcome


def current_epoch(tables: Tables) -> int:
    return tables.meta_int(keys.META_EPOCH) or 0


def accepts(record_epoch: int, announced_epoch: int) -> bool:
    """Fencing, the machine's half (rule 3): a leader record older than the announced epoch
    is ignored. ``processor/leadership.py`` holds the other verbs."""
    return record_epoch >= announced_epoch


def apply(
    tables: Tables, record: Record, meta: Meta, *, specs: Sequence[TaskSpec] | None = None
) -> Outcome:
    """``specs``: of an EnqueueTasks, its items decoded, when the caller has them (the
    runtime keeps what it encoded); the same outcome as without, minus the decoding."""
    out = Outcome()
    if isinstance(record, LEADER_RECORDS):
        epoch = current_epoch(tables)
        if not accepts(meta.epoch, epoch):
            out.ignored = f"epoch {meta.epoch} is older than the announced epoch {epoch}"
            return out
    match record:
        case EnqueueTasks():
            apply_enqueue(tables, record, meta, out, specs)
        case CancelTasks():
            apply_cancel(tables, record, meta, out)
        case RetryFailed():
            apply_retry_failed(tables, record, meta, out)
        case GrantLeases():
            apply_grant(tables, record, meta, out)
        case CompleteAttempts():
            apply_complete(tables, record, meta, out)
        case SaveCheckpoints():
            apply_checkpoints(tables, record, meta, out)
        case RecordSteps():
            apply_steps(tables, record, meta, out)
        case ExpireLeases():
            apply_expire(tables, record, meta, out)
        case FireTimers():
            apply_timers(tables, record, meta, out)
        case AnnounceEpoch():
            tables.put_meta_int(keys.META_EPOCH, meta.epoch)
        case UpsertSchedule():
            apply_upsert_schedule(tables, record, meta, out)
        case DeleteSchedule():
            apply_delete_schedule(tables, record, meta, out)
        case PauseSchedule():
            apply_pause_schedule(tables, record, meta, out)
        case PauseQueue():
            apply_pause_queue(tables, record, meta, out)
        case SendEvents():
            apply_send_events(tables, record, meta, out)
        case EnqueueChildren():
            apply_enqueue_children(tables, record, meta, out)
        case LandChildren():
            apply_land_children(tables, record, meta, out)
        case RegisterTypes():
            apply_register_types(tables, record, meta, out)
        case RegisterSchema():
            apply_register_schema(tables, record, meta, out)
        case DeleteSchemas():
            apply_delete_schemas(tables, record, meta, out)
        case SetCompatibility():
            apply_set_compatibility(tables, record, meta, out)
        case _:
            assert_never(record)
    settle(tables, meta, out)  # the fan-in of whatever this record finished
    return out
