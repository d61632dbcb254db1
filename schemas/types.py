"""Python shapes of the Avro schemas in this folder (records/, state/, events/).

One dataclass per Avro record; field names and order match the .avsc files exactly
(``tests/unit/test_codec.py`` keeps them in sync). Records and events are frozen; ``Task``
is the mutable live-state row the state machine edits and puts back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from conveyor.frozen import frozen

# --- log records (inputs, imperative) ---------------------------------------------------------


@frozen(kw_only=True)
class Envelope:
    kind: str
    epoch: int
    ts_ms: int
    key: str
    body: bytes


@frozen(kw_only=True)
class TaskSpec:
    task_id: str
    tenant: str
    app: str
    task_type: str
    queue: str = "default"
    priority: int = 0
    payload: bytes = b""
    run_at_ms: int | None = None
    attempts_max: int = 5
    backoff_base_ms: int = 1_000
    backoff_factor: float = 2.0
    backoff_cap_ms: int = 3_600_000
    non_retryable: list[str] = field(default_factory=list)
    schedule_to_start_ms: int | None = None
    start_to_close_ms: int | None = None
    schedule_to_close_ms: int | None = None
    cancel_grace_ms: int = 30_000
    idempotency_key: str | None = None
    idempotency_window_ms: int = 86_400_000
    run_key: str | None = None  # set by a dead-letter retry: the retried task's run key
    resume: str = "latest"  # RESUME_LATEST | RESUME_PINNED (TaskSpec v2: codec.SpecCodec)
    delay_ms: int | None = None  # as the client asked (run_at_ms = now + it); TaskSpec v3
    # The enqueue's W3C trace context, JSON ({"traceparent": ...}); TaskSpec v4. Kept in the
    # ``traces`` table and handed to every lease of the task (``conveyor.tracing``).
    trace_context: str | None = None
    # The payload's searchable fields, a JSON object of its top-level scalars (TaskSpec v5;
    # ``conveyor.streams.gateway.payload_fields``). On the TaskEnqueued, into the snapshot.
    payload_fields: str | None = None


@frozen(kw_only=True)
class EnqueueTasks:
    tasks: list[bytes]  # each an encoded TaskSpec: the processor stores it without re-encoding


@frozen(kw_only=True)
class CancelTasks:
    tenant: str
    task_ids: list[str]
    reason: str = "canceled by request"


@frozen(kw_only=True)
class RetryFailed:
    tenant: str
    task_ids: list[str]


@frozen(kw_only=True)
class LeaseRequest:
    request_id: str
    agent_id: str
    app: str
    tenants: list[str]
    queues: list[str]
    capacity: int
    lease_ms: int = 30_000
    # The app version the agent serves. ``app`` is the ready lane the request takes from: the
    # app itself, or a pinned lane ``ready_lane`` names (for an agent of that version only).
    app_version: str | None = None
    # The task types the agent serves that have ready work (``machine/handlers/dispatch.py``);
    # None: any type.
    task_types: list[str] | None = None


@frozen(kw_only=True)
class GrantLeases:
    requests: list[LeaseRequest]


class Outcome(StrEnum):
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"  # retryable per policy
    FATAL = "FATAL"  # straight to FAILED
    CANCELED = "CANCELED"  # the handler observed a cancel and stopped
    SLEEP = "SLEEP"  # a durable sleep ended the attempt; the retry budget is untouched
    FAN_OUT = "FAN_OUT"  # ctx.parallel: enqueue the children, wait in WAITING for them all
    WAIT_EVENT = "WAIT_EVENT"  # ctx.wait_for_event: wait in WAITING for the named event
    # Handed back before it started (its agent is stopping): ready again at once, the attempt
    # not counted. Only an agent reports it; a guest cannot.
    RELEASED = "RELEASED"


@frozen(kw_only=True)
class SleepStep:
    """The step a SLEEP outcome commits. The deadline is ``wake_at_ms`` if given, else the
    record's time plus ``sleep_ms``; a sleep committed before keeps its first deadline."""

    identity: str
    position: int
    sleep_ms: int | None = None
    wake_at_ms: int | None = None


class ParallelMode(StrEnum):
    """What a ``ctx.parallel`` does when a child ends FAILED, CANCELED or EXPIRED."""

    COLLECT = "COLLECT"  # wait for every child; errors come back in the results
    FAIL_FAST = "FAIL_FAST"  # the first such child fails the step and cancels the siblings


@frozen(kw_only=True)
class FanOut:
    """The parallel step a FAN_OUT outcome opens: its children, each an encoded TaskSpec
    whose id, tenant and idempotency key the machine sets (tenant and app are the parent's
    unless the spec names another app)."""

    identity: str
    position: int
    mode: ParallelMode
    children: list[bytes]


@frozen(kw_only=True)
class WaitStep:
    """The step a WAIT_EVENT outcome waits in: the first event ``name`` sent to the workflow
    (one kept from before counts) commits it; so does the timeout, as a timeout."""

    identity: str
    position: int
    name: str
    timeout_ms: int | None = None


@frozen(kw_only=True)
class Completion:
    task_id: str
    lease_id: int
    outcome: Outcome
    result: bytes | None = None
    error_class: str | None = None
    error_message: str | None = None
    error_stack: str | None = None
    retry_after_ms: int | None = None
    sleep: SleepStep | None = None  # with outcome SLEEP
    fan_out: FanOut | None = None  # with outcome FAN_OUT
    wait: WaitStep | None = None  # with outcome WAIT_EVENT


@frozen(kw_only=True)
class CompleteAttempts:
    items: list[Completion]


@frozen(kw_only=True)
class Checkpoint:
    task_id: str
    lease_id: int
    value: bytes


@frozen(kw_only=True)
class SaveCheckpoints:
    items: list[Checkpoint]


class StepOp(StrEnum):
    CLAIM = "CLAIM"  # a non-memoized step is about to run
    COMMIT = "COMMIT"  # its body returned this value


@frozen(kw_only=True)
class StepWrite:
    task_id: str
    lease_id: int
    op: StepOp
    identity: str  # "name#occurrence" or "name:key"
    position: int  # index among the attempt's unkeyed steps; -1 for a keyed step
    value: bytes | None = None


@frozen(kw_only=True)
class RecordSteps:
    items: list[StepWrite]


@frozen(kw_only=True)
class LeaseRef:
    task_id: str
    lease_id: int


@frozen(kw_only=True)
class ExpireLeases:
    items: list[LeaseRef]


class TimerKind(StrEnum):
    RUN = "RUN"  # delay or retry backoff over: back to ENQUEUED
    SCHEDULE_TO_START = "SCHEDULE_TO_START"
    SCHEDULE_TO_CLOSE = "SCHEDULE_TO_CLOSE"
    START_TO_CLOSE = "START_TO_CLOSE"
    CANCEL_GRACE = "CANCEL_GRACE"
    # Appended last: ``keys.timer`` stores a kind by its index, so existing keys keep meaning.
    SCHEDULE = "SCHEDULE"  # a cron occurrence; task_id is the schedule key, token its generation
    FORGET_KEY = "FORGET_KEY"  # the idempotency window of the task's key is over
    EVENT_TIMEOUT = "EVENT_TIMEOUT"  # a ctx.wait_for_event timed out; token: the attempt


@frozen(kw_only=True)
class TimerRef:
    fire_at_ms: int
    task_id: str
    kind: TimerKind
    token: int  # the lease id or attempt the timer was armed for; stale tokens do nothing


@frozen(kw_only=True)
class FireTimers:
    timers: list[TimerRef]


@frozen(kw_only=True)
class WorkflowEvent:
    task_id: str  # the workflow
    name: str
    payload: bytes  # compact JSON


@frozen(kw_only=True)
class SendEvents:
    """Events for workflows: each wakes a workflow waiting for its name, or is kept for the
    workflow's next wait of that name."""

    tenant: str
    items: list[WorkflowEvent]


@frozen(kw_only=True)
class AnnounceEpoch:
    leader_id: str


class OverlapPolicy(StrEnum):
    """What a firing does while the schedule's previous task has not finished."""

    ALLOW = "ALLOW"  # enqueue anyway
    SKIP = "SKIP"  # drop this firing
    CANCEL_PREVIOUS = "CANCEL_PREVIOUS"  # cancel the previous task, then enqueue


class CatchUp(StrEnum):
    """What a firing does when its occurrence was missed (the node was down)."""

    ONCE = "ONCE"  # one task for the whole missed window, at its latest occurrence
    NONE = "NONE"  # nothing for the missed window; wait for the next occurrence


@frozen(kw_only=True)
class UpsertSchedule:
    tenant: str
    schedule_id: str
    cron: str
    timezone: str
    template: bytes  # an encoded TaskSpec; id, run_at and key are set per firing
    overlap: OverlapPolicy
    catch_up: CatchUp


@frozen(kw_only=True)
class DeleteSchedule:
    tenant: str
    schedule_id: str


@frozen(kw_only=True)
class PauseSchedule:
    tenant: str
    schedule_id: str
    paused: bool  # False resumes


@frozen(kw_only=True)
class PauseQueue:
    """Appended to every partition: a paused queue of a tenant is not dispatched from."""

    tenant: str
    queue: str
    paused: bool  # False resumes


@frozen(kw_only=True)
class EnqueueChildren:
    """Children of a fan-out that spilled to this partition (a cross-partition message the
    workflow's partition wrote and shipped): each is enqueued with its link back to the
    workflow's barrier slot, unless its id exists already."""

    parent_id: str
    identity: str
    indexes: list[int]
    tasks: list[bytes]  # encoded TaskSpecs, item for item with indexes


@frozen(kw_only=True)
class ChildDone:
    """A spilled child reached a terminal state: what its slot in the barrier holds."""

    child_id: str
    parent_id: str
    identity: str
    index: int
    status: str  # a TaskStatus value
    result: bytes | None = None
    error_class: str | None = None
    error_message: str | None = None


@frozen(kw_only=True)
class LandChildren:
    """Spilled children that ended, shipped to their workflow's partition."""

    items: list[ChildDone]


@frozen(kw_only=True)
class TypeDefinition:
    """One task type as its app declares it; an option left None is the server's default."""

    task_type: str
    queue: str | None = None
    priority: int | None = None
    attempts_max: int | None = None
    backoff_base_ms: int | None = None
    backoff_factor: float | None = None
    backoff_cap_ms: int | None = None
    non_retryable: list[str] | None = None
    schedule_to_start_ms: int | None = None
    start_to_close_ms: int | None = None
    schedule_to_close_ms: int | None = None
    cancel_grace_ms: int | None = None
    resume: str | None = None
    payload_schema_id: int | None = None
    result_schema_id: int | None = None


@frozen(kw_only=True)
class RegisterTypes:
    """An agent's registration: its app's task types (``machine/handlers/types.py``)."""

    tenant: str
    app: str
    version: str | None = None
    deploy: int | None = None
    pinned: list[str] | None = None
    types: list[TypeDefinition] = field(default_factory=list)


@frozen(kw_only=True)
class RegisterSchema:
    tenant: str
    subject: str
    schema: str  # canonical JSON
    expect_latest: int  # the latest live version the compatibility check saw; 0: none


@frozen(kw_only=True)
class DeleteSchemas:
    tenant: str
    subject: str
    version: int | None = None  # None: every version
    permanent: bool = False


@frozen(kw_only=True)
class SetCompatibility:
    tenant: str
    subject: str | None = None  # None: the tenant's default
    level: str | None = None  # None: remove the subject's own level


Record = (
    EnqueueTasks
    | CancelTasks
    | RetryFailed
    | GrantLeases
    | CompleteAttempts
    | SaveCheckpoints
    | RecordSteps
    | ExpireLeases
    | FireTimers
    | AnnounceEpoch
    | UpsertSchedule
    | DeleteSchedule
    | PauseSchedule
    | PauseQueue
    | SendEvents
    | EnqueueChildren
    | LandChildren
    | RegisterTypes
    | RegisterSchema
    | DeleteSchemas
    | SetCompatibility
)

# Records only the partition leader proposes; the machine ignores them from a stale epoch.
LEADER_RECORDS = (GrantLeases, ExpireLeases, FireTimers, AnnounceEpoch)

# --- live state ---------------------------------------------------------------------------


class TaskStatus(StrEnum):
    ENQUEUED = "ENQUEUED"
    LEASED = "LEASED"
    RETRY_WAIT = "RETRY_WAIT"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELED = "CANCELED"
    EXPIRED = "EXPIRED"
    SLEEPING = "SLEEPING"  # a durable sleep: back to ENQUEUED at its deadline
    WAITING = "WAITING"  # a workflow waits for its children (ctx.parallel): no lease, no timer


TERMINAL = frozenset(
    {TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELED, TaskStatus.EXPIRED}
)


@dataclass(slots=True, kw_only=True)
class Task:
    task_id: str
    tenant: str
    app: str
    task_type: str
    queue: str
    priority: int
    status: TaskStatus
    attempt: int
    budget_base: int  # attempts used before the last dead-letter retry
    lease_id: int  # the newest lease ever granted; 0 before the first
    created_ms: int
    run_at_ms: int
    updated_ms: int
    ready_seq: int  # position in the ready queue; 0 when not ready
    version: int  # log offset of the last change
    cancel_grace_ms: int
    start_to_close_ms: int | None = None
    start_by_ms: int | None = None  # schedule_to_start deadline (absolute)
    close_by_ms: int | None = None  # schedule_to_close deadline (absolute)
    grace_until_ms: int | None = None  # end of the cancel grace of a pending cancel
    agent_id: str | None = None
    leased_ms: int | None = None
    cancel_cause: str | None = None  # CancelCause while a cancel of a LEASED task is pending
    cancel_reason: str | None = None
    checkpoint: bytes | None = None
    result: bytes | None = None
    error_class: str | None = None
    error_message: str | None = None
    error_stack: str | None = None
    finished_ms: int | None = None
    run_key: str | None = None  # None: the task id (see ``run_key_of``)
    resume: str = "latest"  # RESUME_LATEST | RESUME_PINNED, from the spec
    app_version: str | None = None  # of the agent the first lease went to (dispatch.py)
    compensable: bool = False  # a compensation was registered (a @compensate: marker step)
    compensating: bool = False  # canceled: its attempts now run the compensations
    # Not stored: the TaskDetail last written for this row, so unchanged details are skipped.
    detail_written: tuple[object, ...] | None = field(default=None, compare=False, repr=False)


class CancelCause(StrEnum):
    """Why a LEASED task was asked to stop; decides where it goes when the grace ends."""

    CANCEL = "CANCEL"  # -> CANCELED
    START_TO_CLOSE = "START_TO_CLOSE"  # -> the attempt failed; retry per policy
    SCHEDULE_TO_CLOSE = "SCHEDULE_TO_CLOSE"  # -> EXPIRED


@frozen(kw_only=True)
class Attempt:
    task_id: str
    attempt: int
    lease_id: int
    agent_id: str
    started_ms: int
    finished_ms: int
    outcome: str
    error_class: str | None = None
    error_message: str | None = None
    error_stack: str | None = None


@frozen(kw_only=True)
class StepRow:
    identity: str
    position: int
    claims: int
    value: bytes | None = None
    wake_at_ms: int | None = None


@frozen(kw_only=True)
class StepTotals:
    count: int
    bytes: int


@frozen(kw_only=True)
class Schedule:
    """A cron schedule row. Only ``next_fire_ms`` is armed, as one SCHEDULE timer."""

    tenant: str
    schedule_id: str
    cron: str
    timezone: str
    template: bytes
    overlap: str  # an OverlapPolicy value
    catch_up: str  # a CatchUp value
    generation: int
    created_ms: int
    updated_ms: int
    next_fire_ms: int | None = None
    last_fire_ms: int | None = None
    last_task_id: str | None = None
    fired: int = 0
    skipped: int = 0
    paused: bool = False  # no armed timer while paused


@frozen(kw_only=True)
class Barrier:
    """The fan-in of one ``ctx.parallel`` (table ``barriers``). Its children count down
    striped counters; only a stripe reaching zero touches this row."""

    identity: str
    position: int
    mode: str  # a ParallelMode value
    total: int  # children
    stripes_open: int  # stripes whose children have not all landed
    fired: bool = False  # the step is committed (or failed fast) and the parent woken
    created_ms: int = 0


@frozen(kw_only=True)
class EventWait:
    """The ``ctx.wait_for_event`` a WAITING workflow is in (table ``waits``)."""

    identity: str
    position: int
    name: str
    deadline_ms: int | None = None  # its timeout, armed as an EVENT_TIMEOUT timer
    token: int = 0  # the workflow's attempt the timer was armed for


@frozen(kw_only=True)
class ChildLink:
    """Which barrier slot a child task fills when it ends (table ``children``)."""

    parent_id: str
    identity: str
    index: int


@frozen(kw_only=True)
class ChildResult:
    """How one child ended, in its barrier slot."""

    task_id: str
    status: str
    result: bytes | None = None
    error_class: str | None = None
    error_message: str | None = None


@frozen(kw_only=True)
class IdempotencyEntry:
    task_id: str
    expires_ms: int


# --- events (outputs, past tense) -----------------------------------------------------------


class EventKind(StrEnum):
    TaskEnqueued = "TaskEnqueued"
    TaskLeased = "TaskLeased"
    TaskSucceeded = "TaskSucceeded"
    AttemptFailed = "AttemptFailed"
    TaskRetryScheduled = "TaskRetryScheduled"
    TaskFailed = "TaskFailed"
    TaskCanceled = "TaskCanceled"
    TaskExpired = "TaskExpired"
    CancelRequested = "CancelRequested"
    CheckpointSaved = "CheckpointSaved"
    LeaseExpired = "LeaseExpired"
    TaskRequeued = "TaskRequeued"
    TaskSleeping = "TaskSleeping"
    TaskWaiting = "TaskWaiting"


# The error class of the TaskRequeued of an attempt handed back before it started (Outcome
# RELEASED): that attempt did not happen.
RELEASED_CLASS = "Released"
# The error class of the TaskRequeued that begins a canceled workflow's compensations: it ends
# the attempt under way, if there was one (the machine counted the next).
COMPENSATING_CLASS = "Compensating"


@frozen(kw_only=True)
class TaskEvent:
    kind: EventKind
    task_id: str
    tenant: str
    app: str
    task_type: str
    queue: str
    status: str
    attempt: int
    ts_ms: int
    version: int
    agent_id: str | None = None
    error_class: str | None = None
    error_message: str | None = None
    # On the TaskEnqueued of a task not due yet: when it will be (a TaskRequeued follows then).
    run_at_ms: int | None = None
    # On a TaskEnqueued: the spec's ``payload_fields`` (the snapshot indexes them).
    payload_fields: str | None = None


@frozen(kw_only=True)
class StepEvent:
    """A step row changed (claimed or committed); ``version`` is the log offset."""

    task_id: str
    tenant: str
    identity: str
    position: int
    state: str  # CLAIMED | COMMITTED
    claims: int
    value: bytes | None = None
    wake_at_ms: int | None = None
    ts_ms: int
    version: int


@frozen(kw_only=True)
class ScheduleEvent:
    """A schedule row as it stands after a change, or its deletion (``deleted``)."""

    tenant: str
    schedule_id: str
    cron: str
    timezone: str
    app: str
    task_type: str
    queue: str
    overlap: str
    catch_up: str
    paused: bool
    deleted: bool
    next_fire_ms: int | None = None
    last_fire_ms: int | None = None
    last_task_id: str | None = None
    fired: int
    skipped: int
    created_ms: int
    updated_ms: int
    version: int


@frozen(kw_only=True)
class EventExtras:
    """The trailer of an ``EventBatch`` that has step or schedule events."""

    steps: list[StepEvent]
    schedules: list[ScheduleEvent]


@frozen(kw_only=True)
class EventBatch:
    partition: int
    offset: int
    events: list[TaskEvent]
    steps: list[StepEvent] = field(default_factory=list)
    schedules: list[ScheduleEvent] = field(default_factory=list)
