"""Every route of the gateway, one row each: the table the OpenAPI document is made from.

A row names its operation (``operation_id``, unique: generated clients name their functions
after it), its tag, its request model (``body``), its query parameters (``query``: a model
whose fields are the parameters) and its reply model per success status. Path parameters are
read off the path and typed by ``PATH_PARAMETERS``. ``tests/unit/test_contract.py`` checks
that the application registers exactly these routes, so a route cannot be added without a row
(and a model). The schema registry's Confluent-shaped routes (``streams/registry/routes.py``)
are rows too, with ``tag="registry"``: they are served in their own document,
``/registry/openapi.json``, since their errors are Confluent's, not the gateway's.

What a request carries beyond its row, which OpenAPI has no word for (a document lists the
parameters an operation takes, never whether others are allowed):
Rule 1: a query parameter a row's ``query`` model does not name is a 400 naming it and the
known ones: a misspelt filter (``?staus=FAILED``) would otherwise widen a listing, or a bulk
operation, without a word. A row with no ``query`` reads no query string and ignores one:
health probes, cache-busting proxies and document viewers add parameters to ``/healthz`` and
the documents, and most HTTP APIs ignore what a route does not read. So an operation with no
input at all (public, no parameter, no body: ``/healthz`` and the two documents) has nothing
a request can get wrong, and a fuzzer's negative mode has nothing to generate for it.
Rule 2: a POST whose row has no ``body`` takes nothing, ``null`` or ``{}``; other content is a
400 (``routes.no_body``): a body is written on purpose, and one with fields on a route that
reads none means its sender expects options the route does not have. A row with a body model
refuses the fields it does not name, as every model does.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

from conveyor.contract import replies as out
from conveyor.contract.limits import LIST_LIMIT_MAX, WAIT_MS_MAX
from conveyor.contract.shapes import (
    INT_MAX,
    NAME_PATTERN,
    TASK_ID_PATTERN,
    NonNegative,
)
from conveyor.frozen import frozen
from conveyor.schemas.limits import POLL_CAPACITY_MAX  # noqa: F401  (the poll's reply bound)
from conveyor.streams.gateway.contract import requests as req
from conveyor.streams.webhooks.addresses import URL_CHARS_MAX
from conveyor.streams.webhooks.stream import EVENT_TYPES

JSON = "application/json"
REGISTRY_JSON = "application/vnd.schemaregistry.v1+json"


@frozen(kw_only=True)
class Operation:
    method: str
    path: str
    operation_id: str
    tag: str
    summary: str
    body: type[Any] | None = None
    query: type[Any] | None = None
    replies: dict[int, type[Any]]
    example: dict[str, Any] | None = None  # a request body
    content_type: str = JSON
    public: bool = False  # no API key
    body_optional: bool = False  # the body may be left out (every field has a default)


class Query(Struct, kw_only=True):
    """Query parameters: every field is optional."""


def _limit(hi: int) -> Any:
    return Annotated[int, Meta(ge=1, le=hi, description=f"at most {hi}")]


Statuses = req.AnyCaseStatusList  # the node reads them in capitals (validation.py)
PAYLOAD_SEARCH = (
    "payload[<field>]=<value>, or payload.<field>=<value>, one per field (at most 16): tasks "
    "whose payload has every such top-level field with that value, compared as a JSON scalar "
    '(3, true, null; other text is a string: quote it, "3", for the string 3). Hidden, '
    "codec-encoded and blob-stored payloads are not searchable"
)
PayloadField = Annotated[str, Meta(min_length=1, max_length=200, pattern=NAME_PATTERN)]
PayloadValue = Annotated[str, Meta(max_length=512, pattern="^[^\\x00]*$")]
Cursor = Annotated[
    str,
    Meta(
        max_length=1024,
        pattern="^[^\\x00-\\x1f\\x7f]*$",
        description="next_cursor of the previous page; empty: the first",
    ),
]
Filter = Annotated[str, Meta(min_length=1, max_length=200, pattern="^[^\\x00-\\x1f\\x7f]+$")]
Since = Annotated[int, Meta(ge=0, le=INT_MAX)]


class ListTasksQuery(Query):
    status: Statuses | None = None
    queue: Filter | None = None
    task_type: Filter | None = None
    since_ms: Annotated[Since, Meta(description="created at or after")] | None = None
    created_from_ms: Annotated[Since, Meta(description="created at or after")] | None = None
    created_to_ms: Annotated[Since, Meta(description="created before")] | None = None
    finished_from_ms: Annotated[Since, Meta(description="finished at or after")] | None = None
    finished_to_ms: Annotated[Since, Meta(description="finished before")] | None = None
    error_class: Filter | None = None
    error_text: (
        Annotated[str, Meta(max_length=256, description="in the error message, any case")] | None
    ) = None
    # A map in the query, payload[<field>]=<value> (gateway/payload_fields.py)
    payload: (
        Annotated[dict[PayloadField, PayloadValue], Meta(max_length=16, description=PAYLOAD_SEARCH)]
        | None
    ) = None
    limit: _limit(LIST_LIMIT_MAX) | None = None  # type: ignore[valid-type]
    cursor: Cursor | None = None
    count: Annotated[bool, Meta(description="also answer count and count_exact")] | None = None


class WaitQuery(Query):
    wait_ms: (
        Annotated[int, Meta(ge=0, le=WAIT_MS_MAX, description="long-poll for a terminal state")]
        | None
    ) = None


class PageQuery(Query):
    limit: _limit(LIST_LIMIT_MAX) | None = None  # type: ignore[valid-type]
    cursor: Cursor | None = None


Listed = Annotated[str, Meta(description="comma-separated, or the parameter repeated")]
_EVENT_TYPE = "(" + "|".join(re.escape(t) for t in sorted(EVENT_TYPES)) + ")"
EventTypes = Annotated[
    str,
    Meta(
        pattern=f"^ *{_EVENT_TYPE}( *, *{_EVENT_TYPE})* *$",
        description="comma-separated event types, or the parameter repeated",
    ),
]


class EventsQuery(Query):
    after: Annotated[str, Meta(description="a cursor, or start")] | None = None
    state: req.StatusList | None = None
    task_type: Listed | None = None
    queue: Listed | None = None
    type: EventTypes | None = None
    wait_ms: Annotated[int, Meta(ge=0, le=WAIT_MS_MAX)] | None = None
    limit: _limit(1_000) | None = None  # type: ignore[valid-type]


class DeliveriesQuery(Query):
    status: Literal["pending", "succeeded", "failed"] | None = None
    limit: _limit(1_000) | None = None  # type: ignore[valid-type]


class WorkflowsQuery(Query):
    status: Statuses | None = None
    task_type: Filter | None = None
    created_from_ms: NonNegative | None = None
    created_to_ms: NonNegative | None = None
    id_prefix: Annotated[str, Meta(pattern="^[0-9a-fA-F]{1,32}$")] | None = None
    limit: _limit(LIST_LIMIT_MAX) | None = None  # type: ignore[valid-type]
    cursor: Cursor | None = None


class HistoryQuery(Query):
    window: Literal["1h", "24h"] | None = None
    queue: Filter | None = None
    task_type: Filter | None = None


class PermanentQuery(Query):
    permanent: bool | None = None


class RegistryQuery(Query):
    defaultToGlobal: bool | None = None


EventType = Annotated[str, Meta(extra_json_schema={"enum": sorted(EVENT_TYPES)})]


HookType = Annotated[str, Meta(min_length=1, max_length=200)]


class WebhookRequest(req.Model):
    url: Annotated[
        str,
        Meta(
            max_length=URL_CHARS_MAX,
            pattern="^[Hh][Tt][Tt][Pp][Ss]?://[^/?#@\\s]+([/?][^#\\s]*)?$",
            extra_json_schema={"format": "uri"},
            description="an http or https URL; one to a loopback, link-local or private "
            "address, or whose host does not resolve, is refused unless the node allows them",
        ),
    ]
    events: Annotated[list[EventType], Meta(min_length=1, max_length=len(EVENT_TYPES))]
    task_types: (
        Annotated[
            list[Annotated[str, Meta(min_length=1, max_length=200)]],
            Meta(min_length=1, max_length=64),
        ]
        | None
    ) = None


class SchemaBody(Struct, kw_only=True):
    schema: str
    schemaType: Literal["AVRO"] | None = None
    references: list[Any] | None = None


class Compatibility(Struct, kw_only=True):
    compatibility: str


PATH_PARAMETERS: dict[str, dict[str, Any]] = {
    "task_id": {"type": "string", "pattern": TASK_ID_PATTERN},
    "lease_id": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    "schedule_id": {"type": "string", "pattern": NAME_PATTERN, "maxLength": 200},
    "queue": {"type": "string", "pattern": NAME_PATTERN, "maxLength": 200},
    "operation_id": {"type": "string"},
    "webhook_id": {"type": "string"},
    "delivery_id": {"type": "string"},
    "app": {"type": "string", "pattern": NAME_PATTERN},
    "task_type": {"type": "string", "pattern": NAME_PATTERN},
    "subject": {"type": "string"},
    "version": {"type": "string", "description": "a version number, or latest"},
    "id": {"type": "integer", "minimum": 1},
}

_TASK_EXAMPLE = {
    "task_type": "send_email",
    "app": "shop",
    "payload": {"to": "a@example.com"},
    "queue": "mail",
    "retry": {"attempts_max": 3, "backoff_factor": 2},
}


def _op(method: str, path: str, operation_id: str, tag: str, summary: str, **kw: Any) -> Operation:
    kw.setdefault("replies", {200: out.Loose})
    return Operation(
        method=method, path=path, operation_id=operation_id, tag=tag, summary=summary, **kw
    )


OPERATIONS: tuple[Operation, ...] = (
    # -- tasks
    _op(
        "post",
        "/v1/tasks",
        "enqueue_task",
        "tasks",
        "Enqueue a task: 201 created, 200 the same key's task, 409 key reused with another payload",
        body=req.TaskRequest,
        replies={200: out.EnqueueReply, 201: out.EnqueueReply},
        example=_TASK_EXAMPLE,
    ),
    _op(
        "post",
        "/v1/tasks:batch",
        "enqueue_tasks",
        "tasks",
        "Enqueue 1..1000 tasks; validation is all or nothing",
        body=req.TaskBatch,
        replies={200: out.EnqueueBatchReply, 201: out.EnqueueBatchReply},
        example={"tasks": [_TASK_EXAMPLE]},
    ),
    _op(
        "get",
        "/v1/tasks",
        "list_tasks",
        "tasks",
        "List tasks. A page may be short: continue while next_cursor is set",
        query=ListTasksQuery,
        replies={200: out.TaskPage},
    ),
    _op(
        "get",
        "/v1/tasks/{task_id}",
        "get_task",
        "tasks",
        "A task; wait_ms long-polls for a terminal state",
        query=WaitQuery,
        replies={200: out.Task},
    ),
    _op(
        "get",
        "/v1/tasks/{task_id}/logs/{lease_id}",
        "get_attempt_log",
        "tasks",
        "What one attempt printed (the tail the agent kept); the attempt's log_url",
        replies={200: out.AttemptLog},
    ),
    _op(
        "post",
        "/v1/tasks/{task_id}/cancel",
        "cancel_task",
        "tasks",
        "Cancel a task",
        body=req.CancelRequest,
        replies={200: out.Canceled},
        body_optional=True,
    ),
    _op(
        "post",
        "/v1/tasks/{task_id}/rerun",
        "rerun_task",
        "tasks",
        "Enqueue a finished task again as a new task (same type, payload and options, fresh "
        "attempts and steps); 409 while it runs",
        body=req.RunKey,
        replies={200: out.Rerun, 201: out.Rerun},
        body_optional=True,
    ),
    _op(
        "post",
        "/v1/tasks:retry",
        "retry_tasks",
        "operations",
        "Re-enqueue FAILED tasks as new tasks: task_ids now (200), or a filter as a bulk "
        "operation in the background (202)",
        body=req.RetryRequest,
        replies={200: out.RetriedList, 202: out.Operation},
    ),
    _op(
        "post",
        "/v1/tasks:cancel",
        "cancel_tasks",
        "operations",
        "Cancel every unfinished task a filter matches, as a bulk operation (202)",
        body=req.BulkCancelRequest,
        replies={202: out.Operation},
    ),
    _op(
        "get",
        "/v1/operations/{operation_id}",
        "get_operation",
        "operations",
        "A bulk operation's progress: matched, done, changed, state",
        replies={200: out.Operation},
    ),
    _op(
        "get",
        "/v1/queues",
        "list_queues",
        "queues",
        "Per queue: depth by status, age of the oldest ready task, throughput and error rate",
        replies={200: out.Queues},
    ),
    _op(
        "get",
        "/v1/stats/history",
        "get_queue_history",
        "queues",
        "A queue's history over the last hour (1-minute steps) or day (15-minute steps): "
        "throughput, error rate, retries, schedule-to-start and run p50/p99, depth; every "
        "queue and type unless filtered",
        query=HistoryQuery,
        replies={200: out.QueueHistory},
    ),
    _op(
        "get",
        "/v1/agents",
        "list_agents",
        "queues",
        "The agents polling this node for the tenant, with their running tasks when the "
        "snapshot can say",
        replies={200: out.Agents},
    ),
    _op(
        "post",
        "/v1/queues/{queue}/pause",
        "pause_queue",
        "queues",
        "Pause a queue on every partition: its tasks stay ENQUEUED and none is leased; "
        "enqueues are accepted. Durable (the partitions' state); sending it again is harmless",
        replies={200: out.QueuePaused},
    ),
    _op(
        "post",
        "/v1/queues/{queue}/resume",
        "resume_queue",
        "queues",
        "Resume a paused queue: its ready tasks are dealt to agents again at once",
        replies={200: out.QueuePaused},
    ),
    _op(
        "get",
        "/v1/tenants/me/usage",
        "get_usage",
        "queues",
        "The caller's tenant: tasks by status, running (LEASED) count, and its dispatch share "
        "over the last minutes (only with the Postgres snapshot)",
        replies={200: out.Usage},
    ),
    # -- schedules
    _op(
        "post",
        "/v1/schedules",
        "upsert_schedule",
        "schedules",
        "Create (201) or replace (200) a cron schedule; a bad cron or timezone is a 400",
        body=req.ScheduleRequest,
        replies={200: out.Schedule, 201: out.Schedule},
        example={
            "schedule_id": "nightly-report",
            "cron": "0 3 * * *",
            "timezone": "Europe/Paris",
            "task": {"task_type": "report", "app": "shop"},
        },
    ),
    _op(
        "get",
        "/v1/schedules",
        "list_schedules",
        "schedules",
        "The tenant's schedules",
        replies={200: out.Schedules},
    ),
    _op(
        "get",
        "/v1/schedules/{schedule_id}",
        "get_schedule",
        "schedules",
        "A schedule",
        replies={200: out.Schedule},
    ),
    _op(
        "delete",
        "/v1/schedules/{schedule_id}",
        "delete_schedule",
        "schedules",
        "Delete a schedule and disarm its next firing; tasks it enqueued are untouched",
        replies={200: out.ScheduleDeleted},
    ),
    _op(
        "post",
        "/v1/schedules/{schedule_id}/pause",
        "pause_schedule",
        "schedules",
        "Pause a schedule: it keeps its row and history, and fires no more until resumed",
        replies={200: out.Schedule},
    ),
    _op(
        "post",
        "/v1/schedules/{schedule_id}/resume",
        "resume_schedule",
        "schedules",
        "Resume a paused schedule from now; occurrences that passed while paused never fire",
        replies={200: out.Schedule},
    ),
    _op(
        "post",
        "/v1/schedules/{schedule_id}/run",
        "run_schedule",
        "schedules",
        "Run a schedule now: one firing of its task template, the schedule left as it is",
        body=req.RunKey,
        replies={200: out.ScheduleRun, 201: out.ScheduleRun},
        body_optional=True,
    ),
    # -- workflows
    _op(
        "post",
        "/v1/workflows",
        "enqueue_workflow",
        "workflows",
        "Enqueue a workflow: the body and replies of POST /v1/tasks (a workflow is a task)",
        body=req.TaskRequest,
        replies={200: out.EnqueueReply, 201: out.EnqueueReply},
    ),
    _op(
        "get",
        "/v1/workflows",
        "list_workflows",
        "workflows",
        "The tenant's workflows (tasks that recorded a step), newest first, from the snapshot; "
        "a page may be short while next_cursor is set",
        query=WorkflowsQuery,
        replies={200: out.Workflows},
    ),
    _op(
        "get",
        "/v1/workflows/{task_id}",
        "get_workflow",
        "workflows",
        "A workflow, its steps with their states, its parallel steps with their children",
        replies={200: out.Workflow},
    ),
    _op(
        "get",
        "/v1/workflows/{task_id}/history",
        "get_workflow_history",
        "workflows",
        "The workflow's step rows with their values, a page at a time (keyset cursor)",
        query=PageQuery,
        replies={200: out.WorkflowHistory},
    ),
    _op(
        "post",
        "/v1/workflows/{task_id}/events",
        "send_workflow_event",
        "workflows",
        "Send an event: it wakes the workflow waiting for its name (ctx.wait_for_event), or is "
        "kept for the next such wait; 409 once the workflow has finished",
        body=req.WorkflowEvent,
        replies={200: out.EventSent},
    ),
    # -- events and webhooks
    _op(
        "get",
        "/v1/events",
        "list_events",
        "events",
        "The tenant's task events from a cursor: with Accept: text/event-stream a Server-Sent "
        "Events stream (each event's id is the cursor after it; resume with Last-Event-ID), "
        "else a long poll answering {events, cursor}; a bad cursor is a 400",
        query=EventsQuery,
        replies={200: out.Events},
    ),
    _op(
        "post",
        "/v1/webhooks",
        "create_webhook",
        "events",
        "Register a webhook (201); the answer carries its signing secret, shown once. A URL "
        "to a loopback, link-local or private address, or one whose host does not resolve, is "
        "a 400 unless the node allows them",
        body=WebhookRequest,
        replies={201: out.NewWebhook},
    ),
    _op(
        "get",
        "/v1/webhooks",
        "list_webhooks",
        "events",
        "The tenant's webhooks, without secrets",
        replies={200: out.Webhooks},
    ),
    _op(
        "delete",
        "/v1/webhooks/{webhook_id}",
        "delete_webhook",
        "events",
        "Delete a webhook and drop its pending deliveries",
        replies={200: out.WebhookDeleted},
    ),
    _op(
        "get",
        "/v1/webhooks/{webhook_id}/deliveries",
        "list_deliveries",
        "events",
        "A webhook's deliveries, the most recently changed first",
        query=DeliveriesQuery,
        replies={200: out.Deliveries},
    ),
    _op(
        "post",
        "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}:redeliver",
        "redeliver",
        "events",
        "Send a delivery again, due now, with the same webhook-id",
        replies={200: out.Redelivered},
    ),
    # -- task types
    _op(
        "get",
        "/v1/task-types",
        "list_task_types",
        "types",
        "The task types registered for the tenant, with their definitions",
        replies={200: out.TaskTypes},
    ),
    _op(
        "get",
        "/v1/task-types/{app}/{task_type}",
        "get_task_type",
        "types",
        "A task type: its definition and which registration defined it",
        replies={200: out.TaskType},
    ),
    # -- worker API (agents)
    _op(
        "post",
        "/worker/register",
        "register_agent",
        "worker",
        "Declare an app's task types; a new version that drops some warns (they are removed)",
        body=req.Register,
        replies={200: out.Warnings},
    ),
    _op(
        "post",
        "/worker/poll",
        "poll",
        "worker",
        "Long-poll for leases (empty after wait_ms)",
        body=req.Poll,
        replies={200: out.Leases},
    ),
    _op(
        "post",
        "/worker/heartbeat",
        "heartbeat",
        "worker",
        "Keep leases alive; CONTINUE, CANCEL or LOST per lease",
        body=req.LeaseRefs,
        replies={200: out.HeartbeatActions},
    ),
    _op(
        "post",
        "/worker/signals",
        "wait_signals",
        "worker",
        "Long-poll for cancels of the leases this agent holds (answers [] after wait_ms)",
        body=req.SignalsRequest,
        replies={200: out.SignalList},
    ),
    _op(
        "post",
        "/worker/complete",
        "complete",
        "worker",
        "Report outcomes; a stale lease is ok: false, changes nothing",
        body=req.Completions,
        replies={200: out.ItemResults},
    ),
    _op(
        "post",
        "/worker/checkpoint",
        "checkpoint",
        "worker",
        "Save checkpoints",
        body=req.Checkpoints,
        replies={200: out.ItemResults},
    ),
    _op(
        "post",
        "/worker/steps",
        "record_steps",
        "worker",
        "Record durable step claims and commits, fenced by lease; answered once durable",
        body=req.Steps,
        replies={200: out.ItemResults},
    ),
    _op(
        "get",
        "/worker/nodes",
        "list_nodes",
        "worker",
        "The nodes an agent polls (each leads partitions); a node of no cluster answers itself",
    ),
    # -- the node
    _op(
        "get",
        "/healthz",
        "health",
        "node",
        "Liveness: 200 while every partition applies records, 503 naming the halted ones",
        replies={200: out.Health, 503: out.Health},
        public=True,
    ),
    _op(
        "get",
        "/openapi.json",
        "openapi",
        "node",
        "This document",
        replies={200: out.Document},
        public=True,
    ),
    _op(
        "get",
        "/registry/openapi.json",
        "registry_openapi",
        "node",
        "The schema registry's document",
        replies={200: out.Document},
        public=True,
    ),
    _op(
        "get",
        "/metrics",
        "metrics",
        "node",
        "Prometheus metrics, to bearers of the node's metrics key (not an API key)",
        content_type="text/plain",
        public=True,
    ),
)


def _registry(method: str, path: str, operation_id: str, summary: str, **kw: Any) -> Operation:
    return _op(
        method,
        "/registry" + path,
        operation_id,
        "registry",
        summary,
        content_type=REGISTRY_JSON,
        **kw,
    )


REGISTRY_OPERATIONS: tuple[Operation, ...] = (
    _registry(
        "post",
        "/subjects/{subject}/versions",
        "register_schema",
        "Register a schema under a subject: its id",
        body=SchemaBody,
    ),
    _registry(
        "post",
        "/subjects/{subject}",
        "lookup_schema",
        "Whether a subject has this schema: its version and id",
        body=SchemaBody,
    ),
    _registry("get", "/subjects", "list_subjects", "The tenant's subjects", query=PermanentQuery),
    _registry("get", "/subjects/{subject}/versions", "list_versions", "A subject's versions"),
    _registry("get", "/subjects/{subject}/versions/{version}", "get_version", "One version"),
    _registry(
        "get",
        "/subjects/{subject}/versions/{version}/schema",
        "get_version_schema",
        "One version's schema text",
    ),
    _registry("get", "/schemas/ids/{id}", "get_schema_by_id", "A schema by its id"),
    _registry("get", "/schemas/types", "list_schema_types", "The schema types served: AVRO"),
    _registry(
        "post",
        "/compatibility/subjects/{subject}/versions/{version}",
        "check_compatibility_with_version",
        "Whether a schema is compatible with a version",
        body=SchemaBody,
    ),
    _registry(
        "post",
        "/compatibility/subjects/{subject}/versions",
        "check_compatibility",
        "Whether a schema is compatible with the subject's versions",
        body=SchemaBody,
    ),
    _registry("get", "/config", "get_config", "The tenant's compatibility level"),
    _registry(
        "put", "/config", "put_config", "Set the tenant's compatibility level", body=Compatibility
    ),
    _registry(
        "get",
        "/config/{subject}",
        "get_subject_config",
        "A subject's compatibility level",
        query=RegistryQuery,
    ),
    _registry(
        "put",
        "/config/{subject}",
        "put_subject_config",
        "Set a subject's compatibility level",
        body=Compatibility,
    ),
    _registry(
        "delete",
        "/config/{subject}",
        "delete_subject_config",
        "Drop a subject's own level: the tenant's applies",
    ),
    _registry(
        "delete",
        "/subjects/{subject}",
        "delete_subject",
        "Delete a subject (soft; permanent=true after a soft delete)",
        query=PermanentQuery,
    ),
    _registry(
        "delete",
        "/subjects/{subject}/versions/{version}",
        "delete_version",
        "Delete a version (soft; permanent=true after a soft delete)",
        query=PermanentQuery,
    ),
)

# Served by the node but not operations of a document, each with why.
NOT_OPERATIONS = {
    "/ui": "the dashboard's files (HTML, scripts, styles)",
    "/ui/{path}": "the dashboard's files (HTML, scripts, styles)",
    "/registry/config/": "/registry/config with the slash some registry clients send",
    "/internal/tasks:submit": "node to node, signed with the cluster's key (forward.py rule 9)",
    "/internal/tasks:unfinished": "node to node, signed with the cluster's key (forward.py rule 9)",
}
