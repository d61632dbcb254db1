"""PauseQueue: pause or resume dispatch from one queue of a tenant, on this partition.

Rule 1: a queue spans partitions, so the gateway appends the record to every partition; each
keeps the pause in its own state (``Tables.pause_queue``), replayed from its own log, so it
holds across restarts and a change of leader like any other state.
Rule 2: a paused queue's ready tasks stay ENQUEUED in their ready queues: the ready counts and
the pick (``Tables.ready_queues``) leave them out, so no slot is dealt for them and no lease
is granted. Enqueues, cancels and timers go on as ever; leases granted before the pause run
to their end.
Rule 3: pausing a paused queue, or resuming one that runs, changes nothing and is answered ok
(the client may send it again after a partition failed to answer).
"""

from __future__ import annotations

from conveyor.schemas.types import PauseQueue
from conveyor.store.tables import Tables
from conveyor.streams.machine.outcome import Meta, Outcome, Reply


def apply_pause_queue(tables: Tables, record: PauseQueue, meta: Meta, out: Outcome) -> None:
    if (record.queue in tables.paused_queues(record.tenant)) != record.paused:
        tables.pause_queue(record.tenant, record.queue, paused=record.paused)
    # Reply.task_id carries the queue: one reply shape for every client record.
    out.actions.append(Reply(offset=meta.offset, index=0, ok=True, task_id=record.queue))
