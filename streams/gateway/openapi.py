"""The OpenAPI 3.1 document of the gateway, served at ``/openapi.json``.

Hand-written next to the validators it describes, from their limits; ``ENDPOINTS`` is one row
per route, and ``tests/integration/test_gateway.py`` checks that every route has a path here.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from conveyor.schemas.limits import ATTEMPT_LOG_BYTES_MAX, POLL_CAPACITY_MAX, WORKER_ITEMS_MAX
from conveyor.schemas.resume import RESUME_POLICIES
from conveyor.schemas.steps import PARALLEL_CHILDREN_MAX
from conveyor.schemas.types import Outcome, TaskStatus
from conveyor.store.postgres import history
from conveyor.streams.gateway import fields, payloads, validation, worker_requests
from conveyor.streams.gateway.errors import ERRORS
from conveyor.streams.processor.signals import PENDING_MAX

Schema = dict[str, Any]


def ref(name: str) -> Schema:
    return {"$ref": f"#/components/schemas/{name}"}


def integer(lo: int | None = None, hi: int | None = None, **extra: Any) -> Schema:
    out: Schema = {"type": "integer", **extra}
    if lo is not None:
        out["minimum"] = lo
    if hi is not None:
        out["maximum"] = hi
    return out


def nullable(schema: Schema) -> Schema:
    return {"oneOf": [schema, {"type": "null"}]}


def obj(props: Schema, *required: str) -> Schema:
    return {
        "type": "object",
        "properties": props,
        "required": list(required),
        "additionalProperties": False,
    }


def array(item: Schema, lo: int = 0, hi: int = validation.BATCH_MAX) -> Schema:
    return {"type": "array", "items": item, "minItems": lo, "maxItems": hi}


NAME: Schema = {"type": "string", "minLength": 1, "description": "1..200 bytes, no controls"}
TEXT: Schema = nullable({"type": "string"})
MS = integer(0, validation.DURATION_MS_MAX)
TASK_ID: Schema = {"type": "string", "pattern": "^[0-9a-f]{32}$"}
ANY: Schema = {"description": "any JSON value"}
ERROR = nullable(obj({"class": TEXT, "message": TEXT, "stack": TEXT}))
LEASE_REF = {"task_id": TASK_ID, "lease_id": integer(0)}


def _task_request() -> Schema:
    retry = obj(
        {
            "attempts_max": integer(1, validation.RETRY_ATTEMPTS_MAX),
            "backoff_base_ms": MS,
            "backoff_factor": {"type": "number", "minimum": 1},
            "backoff_cap_ms": {**MS, "description": "at least backoff_base_ms"},
            "non_retryable": array(NAME, 0, validation.NON_RETRYABLE_MAX),
        }
    )
    timeouts = obj(
        {
            name: nullable(integer(1, validation.DURATION_MS_MAX))
            for name in ("schedule_to_start_ms", "start_to_close_ms", "schedule_to_close_ms")
        }
    )
    big = payloads.INLINE_BYTES_MAX
    schema = obj(
        {
            "task_type": NAME,
            "app": NAME,
            "payload": {**ANY, "description": f"over {big} bytes it goes to the blob store"},
            "queue": NAME,
            "priority": integer(0, validation.PRIORITY_MAX, description="higher first"),
            "delay_ms": MS,
            "run_at": {"type": "string", "format": "date-time"},
            "idempotency_key": {"type": "string", "description": "1..256 bytes of UTF-8"},
            "retry": retry,
            "timeouts": timeouts,
            "cancel_grace_ms": MS,
            "resume": {
                "enum": list(RESUME_POLICIES),
                "description": "a workflow's later attempts run on any agent of its app "
                "(latest) or only on agents serving the app version its first attempt was "
                "dealt to (pinned); absent: the policy its agents registered for the type",
            },
        },
        "task_type",
        "app",
    )
    schema["description"] = "delay_ms and run_at are exclusive; null means absent"
    return schema


def _task_shapes() -> dict[str, Schema]:
    statuses = {"enum": [s.value for s in TaskStatus]}
    summary = {
        "task_id": TASK_ID,
        "app": NAME,
        "task_type": NAME,
        "queue": NAME,
        "priority": integer(0, 9),
        "status": statuses,
        "attempt": integer(1),
        "created_ms": integer(),
        "updated_ms": integer(),
        "run_at_ms": integer(),
        "finished_ms": nullable(integer()),
        "error": ERROR,
        "cancel_requested": {"type": "boolean"},
    }
    attempt = obj(
        {
            "attempt": integer(1),
            "worker": TEXT,
            "started_ms": nullable(integer()),
            "finished_ms": nullable(integer()),
            "outcome": TEXT,
            "error": ERROR,
            "log_url": nullable({"type": "string", "description": "its captured output"}),
        }
    )
    codes = sorted({code for _, _, code in ERRORS} | {"internal"})
    error = obj(
        {
            "code": {"enum": codes},
            "message": {"type": "string"},
            "field": {"type": "string", "description": "JSON path of the bad field"},
        },
        "code",
        "message",
    )
    versions = {  # render.version_json
        "resume": {"enum": list(RESUME_POLICIES)},
        "app_version": nullable(
            {"type": "string", "description": "of the agent the first lease went to"}
        ),
        "waiting_for": nullable(
            {"type": "string", "description": "why a ready or WAITING task does not run"}
        ),
        "waiting_for_event": nullable(  # render.waiting_json
            obj(
                {
                    "name": NAME,
                    "step": {"type": "string", "description": "the wait's step identity"},
                    "deadline_ms": nullable(integer(description="its timeout; null: none")),
                }
            )
        ),
        "compensating": {
            "type": "boolean",
            "description": "canceled: running its compensations before it ends",
        },
    }
    return {
        "TaskRequest": _task_request(),
        "EnqueueReply": obj(
            {"task_id": TASK_ID, "created": {"type": "boolean"}, "status": statuses}
        ),
        # A listing read from the Postgres snapshot has no priority or run_at (null there).
        "TaskSummary": obj(
            {
                **summary,
                "priority": nullable(summary["priority"]),
                "run_at_ms": nullable(summary["run_at_ms"]),
            }
        ),
        "Task": obj(
            {
                **summary,
                "payload": ANY,
                "result": ANY,
                "checkpoint": ANY,
                "attempts": array(attempt),
                **versions,
            }
        ),
        # GET /v1/workflows/{id}: the live summary, with the version facts of ``Task``.
        "WorkflowTask": obj({**summary, **versions}),
        "Error": obj({"error": error}, "error"),
    }


def _worker_shapes() -> dict[str, Schema]:
    w = worker_requests
    return {
        "Register": obj(
            {
                "agent_id": NAME,
                "app": NAME,
                "version": NAME,
                "task_types": array(NAME, 0, w.TASK_TYPES_MAX),
                "pinned": {
                    **array(NAME, 0, w.TASK_TYPES_MAX),
                    "description": "workflow types whose resume policy is pinned",
                },
                "deploy": {
                    **integer(0),
                    "description": "the deploy number: only a higher one than any before "
                    "removes the task types it does not serve",
                },
            },
            "agent_id",
            "app",
            "task_types",
        ),
        "Poll": obj(
            {
                "agent_id": NAME,
                "app": NAME,
                "version": {**NAME, "description": "the app version served: pinned lanes"},
                "queues": array(NAME, 0, w.QUEUES_MAX),
                "capacity": integer(1, POLL_CAPACITY_MAX),
                "wait_ms": integer(0, validation.WAIT_MS_MAX),
                "lease_ms": integer(w.LEASE_MS_MIN, w.LEASE_MS_MAX),
                "task_types": {
                    **array(NAME, 0, w.TASK_TYPES_MAX),
                    "description": "the task types taken now (absent: any)",
                },
                "open_breakers": {
                    **array(NAME, 0, w.TASK_TYPES_MAX),
                    "description": "task types the agent's circuit breaker holds back",
                },
            },
            "agent_id",
            "app",
        ),
        "Lease": obj(
            {
                **LEASE_REF,
                "attempt": integer(1),
                "task_type": NAME,
                "queue": NAME,
                "payload": ANY,
                "checkpoint": ANY,
                "lease_ms": integer(),
                "start_to_close_ms": nullable(integer()),
                "steps": {"type": "array", "items": ref("StepRow")},
                "started_ms": MS,
                "run_key": TEXT,
                "compensating": {
                    "type": "boolean",
                    "description": "a canceled workflow: run its compensations, then stop",
                },
            }
        ),
        "StepRow": obj(
            {
                "identity": TEXT,
                "position": integer(-1),
                "claims": integer(),
                "committed": {"type": "boolean"},
                "value": ANY,
                "wake_at_ms": nullable(MS),
            }
        ),
        "StepItem": obj(
            {
                **LEASE_REF,
                "op": {"enum": ["CLAIM", "COMMIT"]},
                "identity": TEXT,
                "position": integer(-1),
                "value": ANY,
            },
            "task_id",
            "lease_id",
            "op",
            "identity",
            "position",
        ),
        "LeaseRef": obj(LEASE_REF, "task_id", "lease_id"),
        "Completion": obj(
            {
                **LEASE_REF,
                "outcome": {"enum": [o.value for o in Outcome]},
                "result": ANY,
                "error": ERROR,
                "retry_after_ms": nullable(MS),
                "sleep": nullable(
                    obj(
                        {
                            "identity": TEXT,
                            "position": integer(-1),
                            "sleep_ms": nullable(MS),
                            "wake_at_ms": nullable(MS),
                        },
                        "identity",
                        "position",
                    )
                ),
                "log": nullable(
                    {
                        "type": "string",
                        "maxLength": ATTEMPT_LOG_BYTES_MAX,
                        "description": "the tail of what the attempt printed",
                    }
                ),
                "fan_out": nullable(
                    obj(
                        {
                            "identity": TEXT,
                            "position": integer(-1),
                            "mode": {"enum": ["COLLECT", "FAIL_FAST"]},
                            "children": array(ref("TaskRequest"), 1, PARALLEL_CHILDREN_MAX),
                        },
                        "identity",
                        "position",
                        "mode",
                        "children",
                    )
                ),
                "wait": nullable(
                    obj(
                        {
                            "identity": TEXT,
                            "position": integer(-1),
                            "name": TEXT,
                            "timeout_ms": nullable(MS),
                        },
                        "identity",
                        "position",
                        "name",
                    )
                ),
            },
            "task_id",
            "lease_id",
            "outcome",
        ),
        "CheckpointItem": obj({**LEASE_REF, "value": ANY}, "task_id", "lease_id"),
        "ItemResult": obj({"task_id": TASK_ID, "ok": {"type": "boolean"}, "reason": TEXT}),
        "SignalsRequest": obj(
            {
                "agent_id": NAME,
                "app": NAME,
                "wait_ms": integer(0, w.SIGNALS_WAIT_MS_MAX),
            },
            "agent_id",
            "app",
        ),
        "Signal": obj(
            {**LEASE_REF, "action": {"enum": ["CANCEL"]}}, "task_id", "lease_id", "action"
        ),
        "HeartbeatAction": obj(
            {"task_id": TASK_ID, "action": {"enum": ["CONTINUE", "CANCEL", "LOST"]}}
        ),
    }


def _schedule_shapes() -> dict[str, Schema]:
    template = {
        k: v
        for k, v in _task_request()["properties"].items()
        if k not in ("delay_ms", "run_at", "idempotency_key")
    }
    common = {
        "schedule_id": NAME,
        "cron": {
            "type": "string",
            "description": "five fields (minute hour day-of-month month day-of-week) or @daily"
            " etc.; minute resolution, so at most one firing a minute",
        },
        "timezone": {"type": "string", "description": "IANA zone name; default UTC"},
        "overlap": {"enum": ["allow", "skip", "cancel_previous"]},
        "catch_up": {"enum": ["once", "none"]},
    }
    shown = {"task_type": NAME, "app": NAME, "queue": NAME, "priority": integer(0), "payload": ANY}
    return {
        "ScheduleRequest": obj(
            {**common, "task": obj(template, "task_type", "app")}, "schedule_id", "cron", "task"
        ),
        "Schedule": obj(
            {
                **common,
                "task": obj(shown),
                "next_fire_ms": nullable(integer()),
                "last_fire_ms": nullable(integer()),
                "last_task_id": nullable(TASK_ID),
                "fired": integer(0),
                "skipped": integer(0),
                "paused": {"type": "boolean"},
                "created_ms": integer(),
                "updated_ms": integer(),
            }
        ),
    }


def _param(name: str, schema: Schema, where: str = "query") -> Schema:
    return {"name": name, "in": where, "required": where == "path", "schema": schema}


def _wrap(name: str, item: Schema, lo: int = 1, hi: int = validation.BATCH_MAX) -> Schema:
    return obj({name: array(item, lo, hi)}, name)


_ID = _param("task_id", TASK_ID, "path")
_SCHEDULE_ID = _param("schedule_id", NAME, "path")
_LIST = [
    _param("status", {"type": "string", "description": "comma-separated statuses"}),
    _param("queue", NAME),
    _param("task_type", NAME),
    _param("since_ms", integer(0, description="created at or after")),
    _param("created_from_ms", integer(0, description="created at or after")),
    _param("created_to_ms", integer(0, description="created before")),
    _param("finished_from_ms", integer(0, description="finished at or after")),
    _param("finished_to_ms", integer(0, description="finished before")),
    _param("error_class", NAME),
    _param("error_text", {"type": "string", "description": "in the error message, any case"}),
    _param(
        "payload.<field>",
        {
            "type": "string",
            "description": "repeatable, one per field: tasks whose payload has this top-level "
            "field with this value, compared as a JSON scalar (3, true, null; other text is a "
            'string: quote it, "3", for the string 3); <field> is 1..200 of A-Z a-z 0-9 _ . : -. '
            "Hidden, codec-encoded and blob-stored payloads are not searchable",
        },
    ),
    _param("limit", integer(1, validation.LIST_LIMIT_MAX)),
    _param("cursor", {"type": "string", "description": "next_cursor of the previous page"}),
    _param("count", {"type": "boolean", "description": "also answer count and count_exact"}),
]
# A bulk operation's filter: the list API's filters as a JSON object.
_FILTER = obj(
    {
        "status": {
            "oneOf": [
                array({"enum": [s.value for s in TaskStatus]}, 0, len(TaskStatus)),
                {"type": "string", "description": "comma-separated statuses"},
            ]
        },
        "queue": NAME,
        "task_type": NAME,
        "since_ms": integer(0, description="created at or after"),
        "created_from_ms": integer(0, description="created at or after"),
        "created_to_ms": integer(0, description="created before"),
        "finished_from_ms": integer(0, description="finished at or after"),
        "finished_to_ms": integer(0, description="finished before"),
        "error_class": NAME,
        "error_text": {"type": "string", "description": "in the error message, any case"},
    }
)
_BULK_LIMIT = integer(1, fields.INT_MAX, description="stop after this many tasks")
_RETRY = obj(
    {
        "task_ids": array(TASK_ID, 1),
        "filter": _FILTER,
        "limit": _BULK_LIMIT,
    }
)
_BULK_CANCEL = obj(
    {"filter": _FILTER, "reason": {"type": "string"}, "limit": _BULK_LIMIT}, "filter"
)
_OPERATION = obj(
    {
        "operation_id": {"type": "string", "pattern": "^[0-9a-f]{32}$"},
        "kind": {"enum": ["retry", "cancel"]},
        "state": {"enum": ["running", "done", "failed"]},
        "matched": nullable(
            integer(
                0,
                description="tasks matched at start (once done, at least those done: the "
                "snapshot lags the node a little); null: counting",
            )
        ),
        "done": integer(0, description="tasks processed"),
        "changed": integer(0, description="re-enqueued, or canceled / asked to stop"),
        "limit": nullable(integer(1)),
        "filter": {"type": "object"},
        "created_ms": integer(0),
        "updated_ms": integer(0),
        "error": TEXT,
    }
)
_WINDOW = obj({"finished_per_s": {"type": "number"}, "error_rate": {"type": "number"}})
_QUEUE = obj(
    {
        "queue": NAME,
        "depth": {"type": "object", "additionalProperties": integer(0)},
        "oldest_ready_age_ms": nullable(
            integer(0, description="age of the oldest ENQUEUED task that is due; null: none")
        ),
        "delayed": integer(0, description="ENQUEUED tasks enqueued with a delay, not due yet"),
        "next_due_in_ms": nullable(
            integer(0, description="when the next delayed task is due; null: none delayed")
        ),
        "paused": {"type": "boolean", "description": "not dispatched from (POST .../pause)"},
        "paused_partitions": integer(0, description="partitions it is paused on"),
        "windows": {"type": "object", "additionalProperties": _WINDOW},
    }
)

# The tenant's circuit breakers that agents report open, per (app, task type).
_BREAKER = obj({"app": NAME, "task_type": NAME, "agents": integer(1)}, "app", "task_type", "agents")
_QUEUES = obj({"queues": array(_QUEUE, 0), "breakers": array(_BREAKER, 0)}, "queues", "breakers")

_PAGE = obj(
    {
        "tasks": array(ref("TaskSummary")),
        "next_cursor": nullable({"type": "string"}),
        "count": nullable(integer(0, description="null: counting needs the snapshot")),
        "count_exact": {"type": "boolean", "description": "false: the planner's estimate"},
        "may_trail": {
            "type": "boolean",
            "description": "true: the snapshot had not caught up with the node within 2 s; "
            "a task acknowledged just now may be missing",
        },
    }
)
_RETRIED = _wrap("retried", obj({"task_id": TASK_ID, "new_task_id": TASK_ID}), 0)

# (method, path, summary, request body, reply, parameters)
ENDPOINTS: list[tuple[str, str, str, Schema | None, Schema, list[Schema]]] = [
    (
        "post",
        "/v1/tasks",
        "Enqueue a task: 201 created, 200 the same key's task, 409 key reused with another payload",
        ref("TaskRequest"),
        ref("EnqueueReply"),
        [],
    ),
    (
        "get",
        "/v1/tasks",
        "List tasks. A page may be short: continue while next_cursor is set",
        None,
        _PAGE,
        _LIST,
    ),
    (
        "post",
        "/v1/tasks:batch",
        "Enqueue 1..1000 tasks; validation is all or nothing",
        _wrap("tasks", ref("TaskRequest")),
        _wrap("results", ref("EnqueueReply")),
        [],
    ),
    (
        "get",
        "/v1/tasks/{task_id}",
        "A task; wait_ms long-polls for a terminal state",
        None,
        ref("Task"),
        [_ID, _param("wait_ms", integer(0, validation.WAIT_MS_MAX))],
    ),
    (
        "get",
        "/v1/tasks/{task_id}/logs/{lease_id}",
        "What one attempt printed (the tail the agent kept); the attempt's log_url",
        None,
        obj({"task_id": TASK_ID, "lease_id": integer(1), "log": {"type": "string"}}),
        [_ID, _param("lease_id", integer(1), "path")],
    ),
    (
        "get",
        "/v1/queues",
        "Per queue: depth by status, age of the oldest ready task, throughput and error rate",
        None,
        _QUEUES,
        [],
    ),
    (
        "post",
        "/v1/tasks/{task_id}/cancel",
        "Cancel a task",
        None,
        obj({"task_id": TASK_ID, "status": {"type": "string"}}),
        [_ID],
    ),
    (
        "post",
        "/v1/tasks:retry",
        "Re-enqueue FAILED tasks as new tasks: task_ids now (200), or a filter as a bulk "
        "operation in the background (202)",
        _RETRY,
        _RETRIED,
        [],
    ),
    (
        "post",
        "/v1/tasks:cancel",
        "Cancel every unfinished task a filter matches, as a bulk operation (202)",
        _BULK_CANCEL,
        _OPERATION,
        [],
    ),
    (
        "get",
        "/v1/operations/{operation_id}",
        "A bulk operation's progress: matched, done, changed, state",
        None,
        _OPERATION,
        [_param("operation_id", {"type": "string"}, "path")],
    ),
    (
        "post",
        "/v1/schedules",
        "Create (201) or replace (200) a cron schedule; a bad cron or timezone is a 400",
        ref("ScheduleRequest"),
        ref("Schedule"),
        [],
    ),
    (
        "get",
        "/v1/schedules",
        "The tenant's schedules",
        None,
        _wrap("schedules", ref("Schedule"), 0),
        [],
    ),
    ("get", "/v1/schedules/{schedule_id}", "A schedule", None, ref("Schedule"), [_SCHEDULE_ID]),
    (
        "delete",
        "/v1/schedules/{schedule_id}",
        "Delete a schedule and disarm its next firing; tasks it enqueued are untouched",
        None,
        obj({"schedule_id": NAME, "deleted": {"type": "boolean"}}),
        [_SCHEDULE_ID],
    ),
    (
        "post",
        "/v1/schedules/{schedule_id}/pause",
        "Pause a schedule: it keeps its row and history, and fires no more until resumed",
        None,
        ref("Schedule"),
        [_SCHEDULE_ID],
    ),
    (
        "post",
        "/v1/schedules/{schedule_id}/resume",
        "Resume a paused schedule from now; occurrences that passed while paused never fire",
        None,
        ref("Schedule"),
        [_SCHEDULE_ID],
    ),
    (
        "post",
        "/worker/register",
        "Declare an app's task types; a new version that drops some warns (they are removed)",
        ref("Register"),
        obj({"warnings": array({"type": "string"}, 0)}),
        [],
    ),
    (
        "post",
        "/worker/poll",
        "Long-poll for leases (empty after wait_ms)",
        ref("Poll"),
        _wrap("leases", ref("Lease"), 0, POLL_CAPACITY_MAX),
        [],
    ),
    (
        "post",
        "/worker/heartbeat",
        "Keep leases alive; CONTINUE, CANCEL or LOST per lease",
        _wrap("leases", ref("LeaseRef"), 1, WORKER_ITEMS_MAX),
        _wrap("actions", ref("HeartbeatAction")),
        [],
    ),
    (
        "post",
        "/worker/signals",
        "Long-poll for cancels of the leases this agent holds (answers [] after wait_ms)",
        ref("SignalsRequest"),
        _wrap("signals", ref("Signal"), 0, PENDING_MAX),
        [],
    ),
    (
        "post",
        "/worker/complete",
        "Report outcomes; a stale lease is ok: false, changes nothing",
        _wrap("completions", ref("Completion"), 1, WORKER_ITEMS_MAX),
        _wrap("results", ref("ItemResult")),
        [],
    ),
    (
        "post",
        "/worker/checkpoint",
        "Save checkpoints",
        _wrap("checkpoints", ref("CheckpointItem"), 1, WORKER_ITEMS_MAX),
        _wrap("results", ref("ItemResult")),
        [],
    ),
    (
        "post",
        "/worker/steps",
        "Record durable step claims and commits, fenced by lease; answered once durable",
        _wrap("steps", ref("StepItem"), 1, WORKER_ITEMS_MAX),
        _wrap("results", ref("ItemResult")),
        [],
    ),
    ("get", "/openapi.json", "This document (no auth)", None, {"type": "object"}, []),
    (
        "get",
        "/healthz",
        "Liveness (no auth)",
        None,
        obj(
            {
                "ok": {"type": "boolean"},
                "partitions": integer(1),
                "node": {"type": "string"},
                "leading": {"type": "object"},  # partition -> epoch, lag, caught_up
                "halted": {"type": "object"},
            }
        ),
        [],
    ),
]


def _json_of(schema: Schema) -> Schema:
    return {"application/json": {"schema": schema}}


# Operations that answer 201 when they create something (200 when it already existed).
CREATES = frozenset({("post", "/v1/tasks"), ("post", "/v1/tasks:batch"), ("post", "/v1/schedules")})
# Operations that start a bulk operation and answer 202 with it.
ACCEPTS = frozenset({("post", "/v1/tasks:retry"), ("post", "/v1/tasks:cancel")})


def _operation(
    summary: str,
    body: Schema | None,
    reply: Schema,
    params: list[Schema],
    *,
    creates: bool,
    accepts: bool = False,
) -> Schema:
    responses: Schema = {"200": {"description": "ok", "content": _json_of(reply)}}
    if creates:
        responses["201"] = {"description": "created", "content": _json_of(reply)}
    if accepts:
        responses["202"] = {"description": "operation started", "content": _json_of(_OPERATION)}
    for status in sorted({s for _, s, _ in ERRORS}):
        codes = ", ".join(sorted({c for _, s, c in ERRORS if s == status}))
        responses[str(status)] = {"description": codes, "content": _json_of(ref("Error"))}
    op: Schema = {"summary": summary, "responses": responses}
    if body is not None:
        op["requestBody"] = {"required": True, "content": _json_of(body)}
    if params:
        op["parameters"] = params
    return op


@cache
def document() -> Schema:
    paths: Schema = {}
    for method, path, summary, body, reply, params in ENDPOINTS:
        paths.setdefault(path, {})[method] = _operation(
            summary,
            body,
            reply,
            params,
            creates=(method, path) in CREATES,
            accepts=(method, path) in ACCEPTS,
        )
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Conveyor gateway",
            "version": "1",
            "description": "Durable background jobs. Authorization: Bearer <api key>. "
            f"Request bodies up to {fields.BODY_BYTES_MAX} bytes.",
        },
        "components": {
            "schemas": {**_task_shapes(), **_schedule_shapes(), **_worker_shapes()},
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"apiKey": []}],
        "paths": paths,
    }


# -- tenant usage ----------------------------------------------------------------

_COUNT = integer(0)
_USAGE = obj(
    {
        "tenant": {"type": "string"},
        "source": {
            "enum": ["snapshot", "scan"],
            "description": "the Postgres snapshot, or RocksDB scans (--no-projection)",
        },
        "complete": {"type": "boolean", "description": "false: a bounded scan stopped early"},
        "tasks": obj({s.value: _COUNT for s in TaskStatus}, *(s.value for s in TaskStatus)),
        "total": _COUNT,
        "running": integer(0, description="LEASED tasks"),
        "dispatch": obj(
            {
                "window_s": integer(1),
                "dispatched": _COUNT,
                "dispatched_all_tenants": _COUNT,
                "share": nullable({"type": "number", "minimum": 0, "maximum": 1}),
            },
            "window_s",
            "dispatched",
            "dispatched_all_tenants",
            "share",
        ),
    },
    "tenant",
    "source",
    "complete",
    "tasks",
    "total",
    "running",
)
ENDPOINTS.append(
    (
        "get",
        "/v1/tenants/me/usage",
        "The caller's tenant: tasks by status, running (LEASED) count, and its dispatch share "
        "over the last minutes (only with the Postgres snapshot)",
        None,
        _USAGE,
        [],
    )
)


# -- workflows -------------------------------------------------------------------


def _list(item: Schema) -> Schema:
    return {"type": "array", "items": item}


_STEP_STATES = {"enum": ["CLAIMED", "COMMITTED", "SLEEPING", "WAITING", "ENDED"]}
_WORKFLOW = obj(
    {
        "workflow": ref("WorkflowTask"),
        "steps": _list(
            obj(
                {
                    "identity": {"type": "string"},
                    "position": integer(-1),
                    "kind": {"enum": ["run", "sleep", "parallel", "event"]},
                    "state": _STEP_STATES,
                    "claims": integer(0),
                    "wake_at_ms": nullable(integer()),
                    "started_ms": nullable(integer(description="its first claim (snapshot)")),
                    "ended_ms": nullable(integer(description="its commit (snapshot)")),
                }
            ),
        ),
        "parallel": _list(
            obj(
                {
                    "identity": {"type": "string"},
                    "position": integer(-1),
                    "mode": {"enum": ["COLLECT", "FAIL_FAST"]},
                    "total": integer(1),
                    "fired": {"type": "boolean"},
                    "created_ms": integer(),
                    "counts": {"type": "object", "additionalProperties": integer(0)},
                    "children": _list(
                        obj(
                            {
                                "index": integer(0),
                                "task_id": TASK_ID,
                                "status": {"type": "string"},
                                "created_ms": nullable(integer()),
                                "started_ms": nullable(integer()),
                                "finished_ms": nullable(integer()),
                            }
                        )
                    ),
                    "children_truncated": {"type": "boolean"},
                }
            ),
        ),
    },
    "workflow",
    "steps",
    "parallel",
)
_HISTORY = obj(
    {"steps": array(ref("StepRow"), 0, validation.LIST_LIMIT_MAX), "next_cursor": TEXT},
    "steps",
    "next_cursor",
)
ENDPOINTS.extend(
    [
        (
            "post",
            "/v1/workflows",
            "Enqueue a workflow: the body and replies of POST /v1/tasks (a workflow is a task)",
            ref("TaskRequest"),
            ref("EnqueueReply"),
            [],
        ),
        (
            "get",
            "/v1/workflows",
            "The tenant's workflows (tasks that recorded a step), newest first, from the "
            "snapshot; a page may be short while next_cursor is set",
            None,
            obj(
                {
                    "workflows": array(
                        obj(
                            {
                                **_task_shapes()["TaskSummary"]["properties"],
                                "steps": integer(0),
                                "steps_committed": integer(0),
                                "last_step_ms": nullable(integer()),
                            }
                        )
                    ),
                    "next_cursor": TEXT,
                }
            ),
            [
                _param("status", {"type": "string", "description": "comma-separated statuses"}),
                _param("task_type", {"type": "string"}),
                _param("created_from_ms", integer(0)),
                _param("created_to_ms", integer(0)),
                _param("id_prefix", {"type": "string", "pattern": "^[0-9a-fA-F]{1,32}$"}),
                _param("limit", integer(1, validation.LIST_LIMIT_MAX)),
                _param("cursor", {"type": "string"}),
            ],
        ),
        (
            "get",
            "/v1/workflows/{task_id}",
            "A workflow, its steps with their states, its parallel steps with their children",
            None,
            _WORKFLOW,
            [_ID],
        ),
        (
            "get",
            "/v1/workflows/{task_id}/history",
            "The workflow's step rows with their values, a page at a time (keyset cursor)",
            None,
            _HISTORY,
            [
                _ID,
                _param("limit", integer(1, validation.LIST_LIMIT_MAX)),
                _param("cursor", {"type": "string"}),
            ],
        ),
        (
            "post",
            "/v1/workflows/{task_id}/events",
            "Send an event: it wakes the workflow waiting for its name (ctx.wait_for_event), "
            "or is kept for the next such wait; 409 once the workflow has finished",
            obj({"name": NAME, "payload": ANY}, "name"),
            obj({"workflow_id": TASK_ID, "name": NAME, "status": {"type": "string"}}),
            [_ID],
        ),
    ]
)
CREATES = CREATES | {("post", "/v1/workflows")}


# -- re-runs and schedule runs (reruns.py) ---------------------------------------

_RUN_KEY = obj(
    {
        "idempotency_key": {
            "type": "string",
            "description": "a resent request with the same key answers the first one's task",
        }
    }
)
ENDPOINTS.extend(
    [
        (
            "post",
            "/v1/tasks/{task_id}/rerun",
            "Enqueue a finished task again as a new task (same type, payload and options, "
            "fresh attempts and steps); 409 while it runs",
            _RUN_KEY,
            obj({"task_id": TASK_ID, "new_task_id": TASK_ID, "created": {"type": "boolean"}}),
            [_ID],
        ),
        (
            "post",
            "/v1/schedules/{schedule_id}/run",
            "Run a schedule now: one firing of its task template, the schedule left as it is",
            _RUN_KEY,
            obj({"schedule_id": NAME, "task_id": TASK_ID, "created": {"type": "boolean"}}),
            [_SCHEDULE_ID],
        ),
    ]
)
CREATES = CREATES | {
    ("post", "/v1/tasks/{task_id}/rerun"),
    ("post", "/v1/schedules/{schedule_id}/run"),
}


# -- the events stream and webhooks (events.py, streams/webhooks/) -----------------


def _events_section() -> None:
    from conveyor.streams.gateway import events
    from conveyor.streams.webhooks import api as webhooks
    from conveyor.streams.webhooks.stream import EVENT_TYPES

    global CREATES
    event_type: Schema = {"enum": sorted(EVENT_TYPES)}
    event = obj(
        {
            "id": {"type": "string", "description": "the event's id, stable across re-reads"},
            "type": event_type,
            "task_id": TASK_ID,
            "app": {"type": "string"},
            "task_type": {"type": "string"},
            "queue": {"type": "string"},
            "status": {"enum": [s.value for s in TaskStatus]},
            "attempt": integer(0),
            "ts_ms": integer(),
            "agent_id": {"type": "string"},
            "error": obj({"class": TEXT, "message": TEXT}),
        },
        *("id", "type", "task_id", "app", "task_type", "queue", "status", "attempt", "ts_ms"),
    )
    listed = {"type": "string", "description": "comma-separated, or the parameter repeated"}
    webhook = obj(
        {
            "webhook_id": {"type": "string"},
            "url": {"type": "string"},
            "events": array(event_type, 1, len(EVENT_TYPES)),
            "task_types": nullable(array(NAME, 1, webhooks.TASK_TYPES_MAX)),
            "created_ms": integer(),
        },
        "webhook_id",
        "url",
        "events",
        "task_types",
        "created_ms",
    )
    delivery = obj(
        {
            "delivery_id": {"type": "string", "description": "the event's id (webhook-id)"},
            "event_type": event_type,
            "status": {"enum": ["pending", "succeeded", "failed"]},
            "attempts": integer(0),
            "created_ms": integer(),
            "updated_ms": integer(),
            "next_attempt_ms": nullable(integer()),
            "last_status": nullable(integer()),
            "last_error": TEXT,
        },
        "delivery_id",
        "event_type",
        "status",
        "attempts",
    )
    hook_id = _param("webhook_id", {"type": "string"}, "path")
    ENDPOINTS.extend(
        [
            (
                "get",
                "/v1/events",
                "The tenant's task events from a cursor: with Accept: text/event-stream a "
                "Server-Sent Events stream (each event's id is the cursor after it; resume with "
                "Last-Event-ID), else a long poll answering {events, cursor}; a bad cursor is "
                "a 400",
                None,
                obj({"events": _list(event), "cursor": {"type": "string"}}, "events", "cursor"),
                [
                    _param("after", {"type": "string", "description": "a cursor, or start"}),
                    _param("state", listed),
                    _param("task_type", listed),
                    _param("queue", listed),
                    _param("type", listed),
                    _param("wait_ms", integer(0, validation.WAIT_MS_MAX)),
                    _param("limit", integer(1, events.LIMIT_MAX)),
                ],
            ),
            (
                "post",
                "/v1/webhooks",
                "Register a webhook (201); the answer carries its signing secret, shown once. "
                "A URL to a loopback, link-local or private address is a 400 unless the node "
                "allows them",
                obj(
                    {
                        "url": {"type": "string", "format": "uri"},
                        "events": array(event_type, 1, len(EVENT_TYPES)),
                        "task_types": nullable(array(NAME, 1, webhooks.TASK_TYPES_MAX)),
                    },
                    "url",
                    "events",
                ),
                {**webhook, "properties": {**webhook["properties"], "secret": {"type": "string"}}},
                [],
            ),
            (
                "get",
                "/v1/webhooks",
                "The tenant's webhooks, without secrets",
                None,
                obj({"webhooks": _list(webhook)}, "webhooks"),
                [],
            ),
            (
                "delete",
                "/v1/webhooks/{webhook_id}",
                "Delete a webhook and drop its pending deliveries",
                None,
                obj({"webhook_id": {"type": "string"}, "deleted": {"type": "boolean"}}),
                [hook_id],
            ),
            (
                "get",
                "/v1/webhooks/{webhook_id}/deliveries",
                "A webhook's deliveries, the most recently changed first",
                None,
                obj({"webhook_id": {"type": "string"}, "deliveries": _list(delivery)}),
                [
                    hook_id,
                    _param("status", {"enum": ["pending", "succeeded", "failed"]}),
                    _param("limit", integer(1, webhooks.DELIVERIES_LIMIT_MAX)),
                ],
            ),
            (
                "post",
                "/v1/webhooks/{webhook_id}/deliveries/{delivery_id}:redeliver",
                "Send a delivery again, due now, with the same webhook-id",
                None,
                obj({"delivery_id": {"type": "string"}, "status": {"enum": ["pending"]}}),
                [hook_id, _param("delivery_id", {"type": "string"}, "path")],
            ),
        ]
    )
    CREATES = CREATES | {("post", "/v1/webhooks")}


_events_section()


def _operators_section() -> None:
    """The operator's endpoints (operators.py): a queue's history, its pause, the agents."""
    ms = nullable(integer(0))
    point = obj(
        {
            "at_ms": integer(0, description="start of the step"),
            **{name: integer(0) for name in history.COUNTS},
            "finished": integer(0),
            "finished_per_s": {"type": "number"},
            "error_rate": {"type": "number", "description": "finished not SUCCEEDED / finished"},
            "wait_p50_ms": ms,
            "wait_p99_ms": ms,
            "run_p50_ms": ms,
            "run_p99_ms": ms,
            "depth": integer(0, description="unfinished tasks at the end of the step"),
        }
    )
    ENDPOINTS.append(
        (
            "get",
            "/v1/stats/history",
            "A queue's history over the last hour (1-minute steps) or day (15-minute steps): "
            "throughput, error rate, retries, schedule-to-start and run p50/p99, depth; "
            "every queue and type unless filtered",
            None,
            obj(
                {
                    "window": {"enum": list(history.WINDOWS_MS)},
                    "step_ms": integer(1),
                    "from_ms": integer(0),
                    "to_ms": integer(0),
                    "queue": nullable(NAME),
                    "task_type": nullable(NAME),
                    "task_types": _list(NAME),
                    "depth": integer(0, description="unfinished tasks now"),
                    "points": _list(point),
                }
            ),
            [
                _param("window", {"enum": list(history.WINDOWS_MS)}),
                _param("queue", NAME),
                _param("task_type", NAME),
            ],
        )
    )

    task = obj(
        {
            "task_id": TASK_ID,
            "app": NAME,
            "task_type": NAME,
            "queue": NAME,
            "attempt": integer(0),
            "leased_ms": nullable(integer(0)),
        }
    )
    agent = obj(
        {
            "agent_id": NAME,
            "app": NAME,
            "version": nullable(NAME),
            "queues": _list(NAME),
            "task_types": nullable(_list(NAME)),
            "connected": {"type": "boolean", "description": "a poll waits, or ended < 30 s ago"},
            "last_poll_ms": nullable(integer(0)),
            "last_poll_age_ms": nullable(integer(0)),
            "polls": integer(0),
            "slots_asked": nullable(integer(0, description="free slots its last poll asked")),
            "slots_used": nullable(integer(0, description="its tasks LEASED (snapshot)")),
            "running": nullable(_list(task)),
        }
    )
    paused = obj({"queue": NAME, "paused": {"type": "boolean"}}, "queue", "paused")
    queue = _param("queue", NAME, "path")
    ENDPOINTS.extend(
        [
            (
                "get",
                "/v1/agents",
                "The agents polling this node for the key's tenant (app, version, slots used "
                "and asked, last poll) with their running tasks, from the snapshot",
                None,
                obj({"agents": _list(agent), "now_ms": integer(0)}),
                [],
            ),
            (
                "post",
                "/v1/queues/{queue}/pause",
                "Pause a queue on every partition: its tasks stay ENQUEUED and none is leased; "
                "enqueues are accepted",
                None,
                paused,
                [queue],
            ),
            (
                "post",
                "/v1/queues/{queue}/resume",
                "Resume a paused queue: its ready tasks are dealt to agents again at once",
                None,
                paused,
                [queue],
            ),
        ]
    )


_operators_section()
