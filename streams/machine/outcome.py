"""What applying one record produces: actions for the runtime, events for the stream."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from conveyor.frozen import frozen
from conveyor.schemas.types import ScheduleEvent, StepEvent, TaskEvent, TaskStatus


@frozen(kw_only=True)
class Meta:
    """Where a record sits and who proposed it: the machine's only source of time."""

    partition: int
    offset: int
    epoch: int
    ts_ms: int
    partitions: int = 1  # of the node, fixed at creation: where spilled children go


class Refusal(StrEnum):
    """Why the machine refused an item of a client record (EnqueueTasks, CancelTasks,
    SendEvents, UpsertSchedule, DeleteSchedule, PauseSchedule): every reason it can give. A
    refused item changes nothing. The gateway maps each to an HTTP error
    (``gateway/refusals.py``); a reason without a mapping fails its test."""

    NOT_A_SPEC = "not_a_spec"  # an EnqueueTasks item that does not decode as a TaskSpec
    INVALID_SPEC = "invalid_spec"  # a spec the key encodings cannot store (enqueue.invalid)
    CONFLICT = "conflict"  # the idempotency key names a task with another spec
    UNKNOWN_TASK = "unknown_task"  # no such task of the record's tenant (cancel, event)
    FINISHED = "finished"  # an event for a workflow that has ended
    EVENTS_FULL = "events_full"  # EVENTS_KEPT_MAX events of that name are kept already
    INVALID_SCHEDULE = "invalid_schedule"  # a schedule the machine cannot arm or store
    UNKNOWN_SCHEDULE = "unknown_schedule"  # no such schedule of the record's tenant


@frozen(kw_only=True)
class Reply:
    """The answer to item ``index`` of the client or agent record at ``offset``."""

    offset: int
    index: int
    ok: bool
    task_id: str
    created: bool = False
    status: TaskStatus | None = None
    reason: str | None = None
    refusal: Refusal | None = None  # set with ``ok=False`` on an item of a client record
    # The twin an idempotency key named (Refusal.CONFLICT) and the spec fields that differ.
    twin_id: str | None = None
    differing: tuple[str, ...] = ()
    # Refused for now (its partition could not take it: halted, disk full): nothing of it was
    # applied; send it again after this long. Set by the node, never by the machine.
    retry_after_ms: int | None = None


@frozen(kw_only=True)
class Grant:
    task_id: str
    lease_id: int
    attempt: int
    lease_ms: int


@frozen(kw_only=True)
class Offer:
    """Leases granted for a waiting agent's request; the runtime hands them over."""

    request_id: str
    grants: list[Grant]


@frozen(kw_only=True)
class LeaseEnded:
    """Stop tracking heartbeats of this lease."""

    task_id: str
    lease_id: int


@frozen(kw_only=True)
class CancelLease:
    """Tell the lease holder to stop (answered on its next heartbeat)."""

    task_id: str
    lease_id: int


@frozen(kw_only=True)
class TaskFinished:
    """A task reached a terminal state: wake whoever waits for its result."""

    task_id: str
    status: TaskStatus


Action = Reply | Offer | LeaseEnded | CancelLease | TaskFinished


@dataclass(slots=True)
class Outcome:
    actions: list[Action] = field(default_factory=list)
    events: list[TaskEvent] = field(default_factory=list)
    steps: list[StepEvent] = field(default_factory=list)  # step rows claimed or committed
    schedules: list[ScheduleEvent] = field(default_factory=list)  # schedule rows changed
    ignored: str | None = None  # set when a valid record did not apply at all (stale epoch)
    spare_ready: int = 0  # ready indexes dealt by ``lifecycle.spare_index`` so far
    # Workflows that began compensating: their children and pending timers are canceled in the
    # same record (``handlers/workflows.settle``), as if they had ended.
    compensating: list[str] = field(default_factory=list)
    sent: int = 0  # message rows for other partitions written so far (``machine/messages.py``)
