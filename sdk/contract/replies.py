"""Reply bodies, as msgspec Structs: the document's response schemas. The node renders the task
replies (a task, a listing, an enqueue) through them (``msgspec.json.encode`` of the Struct), the
SDK decodes with them (``conveyor.wire``), and the fuzz tests check every reply a real node
sends against them.

A field the node always writes has no default (it is ``required`` in the document); ``null``
is written out as ``X | None``. Reply models accept fields they do not name, so a field added
to a reply is not a breaking change for a client generated from an older document.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct, field

from conveyor.contract.shapes import (
    Count,
    EpochMs,
    Json,
    TaskId,
)

Status = Literal[
    "ENQUEUED",
    "LEASED",
    "RETRY_WAIT",
    "SUCCEEDED",
    "FAILED",
    "CANCELED",
    "EXPIRED",
    "SLEEPING",
    "WAITING",
]
Overlap = Literal["allow", "skip", "cancel_previous"]
CatchUpMode = Literal["once", "none"]
OperationId = Annotated[str, Meta(pattern="^[0-9a-f]{32}$")]


class Reply(Struct, kw_only=True):
    """A reply body."""


class Error(Reply):
    class_: str | None = field(default=None, name="class")
    message: str | None = None
    stack: str | None = None


class EnqueueReply(Reply):
    task_id: TaskId
    created: bool
    status: Status


class EnqueueBatchReply(Reply):
    results: list[EnqueueReply]


class TaskSummary(Reply):
    """A listing row. One read from the Postgres snapshot has no priority or run_at (null)."""

    task_id: TaskId
    app: str
    task_type: str
    queue: str
    priority: int | None
    status: Status
    attempt: Count
    created_ms: EpochMs
    updated_ms: EpochMs
    run_at_ms: int | None
    finished_ms: int | None
    error: Error | None
    cancel_requested: bool


class AttemptRow(Reply):
    attempt: Count
    worker: str | None
    started_ms: int | None
    finished_ms: int | None
    outcome: str | None
    error: Error | None
    log_url: Annotated[str | None, Meta(description="where its captured output is")]


class EventWaiting(Reply):
    """The event a workflow waits for in ``ctx.wait_for_event``."""

    name: str
    step: Annotated[str, Meta(description="the identity of the wait's step")]
    deadline_ms: Annotated[int | None, Meta(description="its timeout; null: none")]


class Task(TaskSummary):
    payload: Json
    result: Json
    checkpoint: Json
    attempts: list[AttemptRow]
    resume: Literal["latest", "pinned"]
    app_version: Annotated[str | None, Meta(description="of the agent the first lease went to")] = (
        None
    )
    waiting_for: Annotated[
        str | None, Meta(description="why a ready or waiting task is not dealt")
    ] = None
    compensating: Annotated[
        bool, Meta(description="canceled: running its compensations before it ends")
    ] = False
    waiting_for_event: Annotated[
        EventWaiting | None, Meta(description="a WAITING workflow's event; null otherwise")
    ] = None
    unavailable: Annotated[
        dict[str, str] | None,
        Meta(description="payload, result or checkpoint whose blob could not be read, and why"),
    ] = None


class TaskPage(Reply):
    tasks: list[TaskSummary]
    next_cursor: Annotated[str | None, Meta(description="continue while set")] = None
    count: (
        Annotated[
            int, Meta(ge=0, description="null: not asked for, or counting needs the snapshot")
        ]
        | None
    ) = None
    count_exact: Annotated[bool, Meta(description="false: the planner's estimate")] = True
    may_trail: Annotated[
        bool, Meta(description="true: the snapshot may trail the node's latest writes")
    ] = False


class AttemptLog(Reply):
    task_id: TaskId
    lease_id: Annotated[int, Meta(ge=1)]
    log: str


class Window(Reply):
    finished_per_s: float
    error_rate: float


class QueueStats(Reply):
    queue: str
    depth: dict[str, Count]
    oldest_ready_age_ms: int | None = None
    delayed: Annotated[int, Meta(ge=0, description="ENQUEUED with a delay, not due yet")] = 0
    next_due_in_ms: Annotated[int, Meta(ge=0, description="the next delayed one")] | None = None
    paused: bool = False
    paused_partitions: Annotated[int, Meta(ge=0, description="partitions paused on")] = 0
    windows: dict[str, Window] = {}


class Breaker(Reply):
    app: str
    task_type: str
    agents: Annotated[int, Meta(ge=1)]


class Queues(Reply):
    queues: list[QueueStats]
    breakers: list[Breaker]


class Canceled(Reply):
    task_id: TaskId
    status: Status


class Retried(Reply):
    task_id: TaskId
    new_task_id: TaskId


class Rerun(Reply):
    task_id: TaskId
    new_task_id: TaskId
    created: bool


class RetriedList(Reply):
    retried: list[Retried]


class Operation(Reply):
    operation_id: OperationId
    kind: Literal["retry", "cancel"]
    state: Literal["running", "done", "failed"]
    matched: (
        Annotated[
            int,
            Meta(
                ge=0,
                description="tasks matched at start (once done, at least those done: the "
                "snapshot lags the node a little); null: counting",
            ),
        ]
        | None
    ) = None
    done: Annotated[int, Meta(ge=0, description="tasks processed")] = 0
    changed: Annotated[int, Meta(ge=0, description="re-enqueued, or canceled / asked to stop")] = 0
    limit: int | None = None
    filter: dict[str, Any] = {}
    created_ms: EpochMs = 0
    updated_ms: EpochMs = 0
    error: str | None = None


class ScheduledTask(Reply):
    task_type: str
    app: str
    queue: str
    priority: int
    payload: Json


class Schedule(Reply):
    schedule_id: str
    cron: str
    timezone: str
    overlap: Overlap
    catch_up: CatchUpMode
    task: ScheduledTask
    next_fire_ms: int | None
    last_fire_ms: int | None
    last_task_id: TaskId | None
    fired: Count
    skipped: Count
    paused: bool
    created_ms: EpochMs
    updated_ms: EpochMs


class ScheduleRun(Reply):
    schedule_id: str
    task_id: TaskId
    created: bool


class Schedules(Reply):
    schedules: list[Schedule]


class ScheduleDeleted(Reply):
    schedule_id: str
    deleted: bool


class Warnings(Reply):
    warnings: list[str]


class StepRow(Reply):
    identity: str | None
    position: Annotated[int, Meta(ge=-1)]
    claims: Count
    committed: bool
    value: Json
    wake_at_ms: int | None = None


class Lease(Reply):
    task_id: TaskId
    lease_id: Count
    attempt: Annotated[int, Meta(ge=1)]
    task_type: str
    queue: str
    payload: Json
    checkpoint: Json
    lease_ms: int
    start_to_close_ms: int | None
    steps: list[StepRow]
    started_ms: Count
    run_key: str | None = None
    compensating: Annotated[
        bool, Meta(description="a canceled workflow: run its compensations, then stop")
    ] = False
    trace_context: Annotated[
        dict[str, str] | None,
        Meta(description="the W3C trace context of the enqueue, if it sent one"),
    ] = None


class Leases(Reply):
    leases: list[Lease]


class HeartbeatAction(Reply):
    task_id: TaskId
    action: Literal["CONTINUE", "CANCEL", "LOST"]


class HeartbeatActions(Reply):
    actions: list[HeartbeatAction]


class Signal(Reply):
    task_id: TaskId
    lease_id: Count
    action: Literal["CANCEL"]


class SignalList(Reply):
    signals: list[Signal]


class ItemResult(Reply):
    task_id: str
    ok: bool
    reason: str | None = None
    retry_after_ms: (
        Annotated[
            int,
            Meta(
                ge=0,
                description="refused for now (its partition could not take it): send it again "
                "after this long",
            ),
        ]
        | None
    ) = None


class ItemResults(Reply):
    results: list[ItemResult]


class ErrorDetail(Reply):
    code: str
    message: str
    field: Annotated[str, Meta(description="the JSON path of the field at fault")] | None = None


class ErrorReply(Reply):
    """Every 4xx and 5xx: what was wrong and what to do, and the field at fault if one was."""

    error: ErrorDetail


class Leading(Reply):
    """A partition this node leads."""

    epoch: Count
    lag_records: Annotated[int, Meta(ge=0, description="records its log holds not applied yet")]
    lag_s: float
    caught_up: bool


class Health(Reply, omit_defaults=True):
    """``halted`` is left out while every partition applies records."""

    ok: bool
    partitions: Annotated[int, Meta(ge=1)]
    node: str
    leading: Annotated[dict[str, Leading], Meta(description="by partition")]
    halted: Annotated[dict[str, str], Meta(description="by partition: why it stopped")] = {}


class Document(Reply):
    """The OpenAPI document."""

    openapi: str
    paths: dict[str, Any]


class WorkflowStep(Reply):
    identity: str
    position: Annotated[int, Meta(ge=-1)]
    kind: Literal["run", "sleep", "parallel", "event"]
    state: Literal["CLAIMED", "COMMITTED", "SLEEPING", "WAITING", "ENDED"]
    claims: Count
    wake_at_ms: int | None = None
    started_ms: Annotated[int | None, Meta(description="its first claim; null: not known")] = None
    ended_ms: Annotated[int | None, Meta(description="its commit; null: not known")] = None


class ParallelChild(Reply):
    index: Count
    task_id: TaskId
    status: Annotated[str, Meta(description="a task status, or UNKNOWN")]
    created_ms: int | None = None
    started_ms: Annotated[int | None, Meta(description="its last lease")] = None
    finished_ms: int | None = None


class ParallelStep(Reply):
    identity: str
    position: Annotated[int, Meta(ge=-1)]
    mode: Literal["COLLECT", "FAIL_FAST"]
    total: Annotated[int, Meta(ge=1)]
    fired: bool
    created_ms: EpochMs
    counts: dict[str, Count]
    children: list[ParallelChild]
    children_truncated: bool


class WorkflowTask(TaskSummary):
    """The workflow's task, as a listing shows it, with how it resumes and what it waits for."""

    resume: Literal["latest", "pinned"]
    app_version: str | None = None
    waiting_for: str | None = None
    compensating: bool = False
    waiting_for_event: EventWaiting | None = None


class WorkflowSummary(TaskSummary):
    """A row of ``GET /v1/workflows``: the task's row and its step counts."""

    steps: Count
    steps_committed: Count
    last_step_ms: int | None


class Workflows(Reply):
    workflows: list[WorkflowSummary]
    next_cursor: Annotated[str | None, Meta(description="continue while set")]
    may_trail: Annotated[
        bool, Meta(description="true: the snapshot may trail the node's latest writes")
    ]


class Workflow(Reply):
    workflow: WorkflowTask
    steps: list[WorkflowStep]
    parallel: list[ParallelStep]


class WorkflowHistory(Reply):
    steps: list[StepRow]
    next_cursor: str | None


class EventSent(Reply):
    workflow_id: TaskId
    name: str
    status: str


class Usage(Reply, omit_defaults=True):
    """``dispatch`` is left out where the node keeps no metrics."""

    tenant: str
    source: Literal["snapshot", "scan"]
    complete: bool
    tasks: dict[str, Count]
    total: Count
    running: Count
    dispatch: dict[str, Any] | None = None


class Event(Reply, omit_defaults=True):
    """``agent_id`` and ``error`` are left out when the event has none."""

    id: Annotated[str, Meta(description="the event's id, stable across re-reads")]
    type: str
    task_id: TaskId
    app: str
    task_type: str
    queue: str
    status: Status
    attempt: Count
    ts_ms: EpochMs
    agent_id: str | None = None
    error: dict[str, Any] | None = None


class Events(Reply):
    events: list[Event]
    cursor: str


class Webhook(Reply):
    webhook_id: str
    url: str
    events: list[str]
    task_types: list[str] | None
    created_ms: EpochMs


class NewWebhook(Webhook):
    secret: Annotated[str, Meta(description="the signing secret, shown this once")]


class Webhooks(Reply):
    webhooks: list[Webhook]


class WebhookDeleted(Reply):
    webhook_id: str
    deleted: bool


class Delivery(Reply):
    delivery_id: Annotated[str, Meta(description="the event's id (webhook-id)")]
    event_type: str
    status: Literal["pending", "succeeded", "failed"]
    attempts: Count
    created_ms: EpochMs = 0
    updated_ms: EpochMs = 0
    next_attempt_ms: int | None = None
    last_status: int | None = None
    last_error: str | None = None


class Deliveries(Reply):
    webhook_id: str
    deliveries: list[Delivery]


class Redelivered(Reply):
    delivery_id: str
    status: Literal["pending"]


class Loose(Reply):
    """A reply documented in prose (a Confluent-shaped registry body, the node list)."""


class HistoryPoint(Reply):
    at_ms: Annotated[int, Meta(ge=0, description="start of the step")]
    enqueued: Count
    started: Count
    succeeded: Count
    failed: Count
    canceled: Count
    expired: Count
    retried: Count
    finished: Count
    finished_per_s: float
    error_rate: Annotated[float, Meta(description="finished not SUCCEEDED / finished")]
    wait_p50_ms: int | None
    wait_p99_ms: int | None
    run_p50_ms: int | None
    run_p99_ms: int | None
    depth: Annotated[int, Meta(ge=0, description="unfinished tasks at the end of the step")]


class QueueHistory(Reply):
    """A queue's history over the last hour (1-minute steps) or day (15-minute steps)."""

    window: Literal["1h", "24h"]
    step_ms: Annotated[int, Meta(ge=1)]
    from_ms: Count
    to_ms: Count
    queue: str | None
    task_type: str | None
    task_types: list[str]
    depth: Annotated[int, Meta(ge=0, description="unfinished tasks now")]
    points: list[HistoryPoint]


class QueuePaused(Reply):
    queue: str
    paused: bool


class RunningTask(Reply):
    """A task an agent holds a lease on, from the snapshot."""

    task_id: TaskId
    app: str
    task_type: str
    queue: str
    attempt: Count
    leased_ms: int | None


class Agent(Reply):
    agent_id: str
    app: str
    version: str | None
    queues: list[str]
    task_types: Annotated[list[str] | None, Meta(description="null: every type of its app")]
    connected: Annotated[bool, Meta(description="polled within its wait and a grace")]
    last_poll_ms: Annotated[int | None, Meta(description="null: it never polled this node")]
    last_poll_age_ms: int | None
    polls: Count
    slots_asked: Annotated[int | None, Meta(description="free slots its last poll asked for")]
    slots_used: Annotated[int | None, Meta(description="its running tasks; null: not known")]
    running: Annotated[
        list[RunningTask] | None,
        Meta(description="longest running first; null: no snapshot to say"),
    ]


class Agents(Reply):
    agents: list[Agent]
    now_ms: EpochMs


class TypeOrigin(Reply):
    """The registration that last defined a task type."""

    version: str | None = None
    deploy: int | None = None
    registered_ms: int | None = None


class TaskType(Reply):
    app: str
    task_type: str
    defaults: Annotated[
        dict[str, Any], Meta(description="the task options its registration declared")
    ]
    payload_schema_id: int | None
    result_schema_id: int | None
    removed_by: Annotated[str | None, Meta(description="the version whose deploy dropped it")]
    origin: TypeOrigin | None
    app_version: str | None
    deploy: Annotated[int | None, Meta(description="the deploy that registered its app")]


class TaskTypes(Reply):
    task_types: list[TaskType]
