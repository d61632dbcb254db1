"""What applying one record produces: actions for the runtime, events for the stream."""

from __future__ import annotations

from dataclasses import dataclass, field

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
