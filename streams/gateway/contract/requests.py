"""Request bodies of the client and worker APIs, as msgspec Structs.

Each model is a JSON Schema (``msgspec.json.schema_components``, served in ``/openapi.json``)
and, for the bodies ``decode.model`` reads, the node's type and range checks. What a type
cannot say is a rule of the model, written twice on purpose: as JSON Schema in ``RULES``
(``not`` / ``if``-``then``), so the document never allows what the node refuses, and as a
check after decoding, so the error names the field (``validation.parse_task``).
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal
from zoneinfo import available_timezones

from msgspec import Meta, Struct, field

from conveyor.contract import limits as v
from conveyor.contract import limits as w
from conveyor.contract.shapes import (
    INT_MAX,
    NAME_PATTERN,
    TEXT_PATTERN,
    Json,
    Ms,
    Name,
    NonNegative,
    PositiveMs,
    TaskId,
    Text,
    bounded_text,
)
from conveyor.schemas.limits import (
    ATTEMPT_LOG_BYTES_MAX,
    ERROR_CLASS_BYTES_MAX,
    ERROR_MESSAGE_BYTES_MAX,
    ERROR_STACK_BYTES_MAX,
    POLL_CAPACITY_MAX,
    WORKER_ITEMS_MAX,
    name_rule,
)
from conveyor.schemas.resume import RESUME_POLICIES
from conveyor.schemas.steps import PARALLEL_CHILDREN_MAX, STEP_NAME_BYTES_MAX, STEPS_MAX
from conveyor.schemas.types import TERMINAL, TaskStatus
from conveyor.streams import cron

Schema = dict[str, Any]


class Model(Struct, forbid_unknown_fields=True, kw_only=True, omit_defaults=True):
    """A request body: unknown fields are refused, naming the field and the known ones."""

    rules: ClassVar[Schema] = {}  # JSON Schema of the checks a type cannot state


def _set(name: str, kind: str) -> Schema:
    return {"required": [name], "properties": {name: {"type": kind}}}


# --- tasks --------------------------------------------------------------------------------


class RetryPolicy(Model):
    attempts_max: Annotated[int, Meta(ge=1, le=v.RETRY_ATTEMPTS_MAX)] | None = None
    backoff_base_ms: Ms | None = None
    backoff_factor: Annotated[float, Meta(ge=1, le=v.BACKOFF_FACTOR_MAX)] | None = None
    backoff_cap_ms: (
        Annotated[
            int,
            Meta(
                ge=0,
                le=v.DURATION_MS_MAX,
                description="bounds every delay, the first too: below backoff_base_ms every "
                "delay is backoff_cap_ms",
            ),
        ]
        | None
    ) = None
    non_retryable: (
        Annotated[
            list[Text],
            Meta(max_length=v.NON_RETRYABLE_MAX, description="error classes never retried"),
        ]
        | None
    ) = None


class Timeouts(Model):
    schedule_to_start_ms: PositiveMs | None = None
    start_to_close_ms: PositiveMs | None = None
    schedule_to_close_ms: PositiveMs | None = None


RUN_AT_PATTERN = (  # RFC 3339 with a zone, years 1970..9999
    "^(19[7-9][0-9]|[2-9][0-9]{3})-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])[Tt ]"
    "([01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](\\.[0-9]{1,9})?"
    "([Zz]|[+-]([01][0-9]|2[0-3]):[0-5][0-9])$"
)
Resume = Annotated[
    Literal["latest", "pinned"],
    Meta(
        description="a workflow's later attempts run on any agent of its app (latest) or only "
        "on agents serving the app version its first attempt was dealt to (pinned); absent: "
        "the policy its agents registered for the type"
    ),
]
assert tuple(Resume.__origin__.__args__) == RESUME_POLICIES  # type: ignore[attr-defined]


TRACEPARENT_PATTERN = "^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$"
TraceContext = Annotated[
    dict[
        Annotated[str, Meta(pattern="^[\\x21-\\x7e]{1,64}$")],
        Annotated[str, Meta(pattern="^[\\x20-\\x7e]{0,256}$")],
    ],
    Meta(
        min_length=1,
        max_length=4,
        description="the W3C trace context of the enqueue (traceparent, tracestate): each "
        "attempt runs in a child span of it (conveyor.tracing)",
        extra_json_schema={
            "required": ["traceparent"],
            "properties": {"traceparent": {"type": "string", "pattern": TRACEPARENT_PATTERN}},
        },
    ),
]


class TaskRequest(Model):
    """A task to enqueue. ``delay_ms`` and ``run_at`` are exclusive; ``null`` means absent."""

    task_type: Name
    app: Name
    payload: Annotated[
        Any, Meta(description="any JSON value; a large one goes to the blob store")
    ] = None
    queue: Name | None = None
    priority: Annotated[int, Meta(ge=0, le=v.PRIORITY_MAX, description="higher first")] | None = (
        None
    )
    delay_ms: Ms | None = None
    run_at: (
        Annotated[
            str,
            Meta(
                pattern=RUN_AT_PATTERN,
                extra_json_schema={"format": "date-time"},
                description="an RFC 3339 instant with a zone, e.g. 2026-01-01T00:00:00Z, from "
                f"{v.RUN_AT_MIN} to {v.RUN_AT_MAX} (an offset that moves the instant out of "
                "that range is refused)",
            ),
        ]
        | None
    ) = None
    idempotency_key: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=v.IDEMPOTENCY_KEY_BYTES_MAX,
                pattern=TEXT_PATTERN,
                description=f"1..{v.IDEMPOTENCY_KEY_BYTES_MAX} bytes of UTF-8, no control "
                "characters",
            ),
        ]
        | None
    ) = None
    retry: RetryPolicy | None = None
    timeouts: Timeouts | None = None
    cancel_grace_ms: Ms | None = None
    resume: Resume | None = None
    trace_context: TraceContext | None = None

    rules: ClassVar[Schema] = {
        "not": {"allOf": [_set("delay_ms", "integer"), _set("run_at", "string")]},
    }


class TaskBatch(Model):
    tasks: Annotated[list[TaskRequest], Meta(min_length=1, max_length=v.BATCH_MAX)]


def _cron_pattern() -> str:
    item = "(\\*|{v}(-{v})?)(/[1-9][0-9]?)?"
    values = (
        "[0-5]?[0-9]",  # minute
        "[01]?[0-9]|2[0-3]",  # hour
        "0?[1-9]|[12][0-9]|3[01]",  # day of month
        "0?[1-9]|1[0-2]",  # month
        "[0-7]",  # day of week, 0 and 7 Sunday
    )
    fields = [f"{item.format(v=f'({one})')}(,{item.format(v=f'({one})')})*" for one in values]
    aliases = "|".join(sorted(a[1:] for a in cron.ALIASES))
    spaced = " +".join(fields)  # spaces only: croniter takes no tab or newline
    return f"^(@({aliases})|{spaced})$"


CRON_PATTERN = _cron_pattern()
Cron = Annotated[
    str,
    Meta(
        pattern=CRON_PATTERN,
        max_length=cron.EXPRESSION_BYTES_MAX,
        description="five fields (minute hour day-of-month month day-of-week) or @daily etc.; "
        "minute resolution, so at most one firing a minute. An expression no date matches "
        "(0 0 31 2 *) is refused",
        examples=["0 9 * * 1-5"],
    ),
]


class TaskTemplate(TaskRequest):
    """A schedule's task: a task body without what each firing sets itself (``delay_ms``,
    ``run_at``, ``idempotency_key``)."""

    rules: ClassVar[Schema] = {
        "not": {
            "anyOf": [
                _set("delay_ms", "integer"),
                _set("run_at", "string"),
                _set("idempotency_key", "string"),
            ]
        }
    }


def _any_case(word: str) -> str:
    """A pattern of ``word`` in any case: a JSON Schema pattern takes no flags, so each
    letter is a class of both (FAILED, failed and Failed alike)."""
    return "".join(f"[{c.upper()}{c.lower()}]" if c.isalpha() else c for c in word)


def _any_case_of(words: tuple[str, ...], description: str) -> Any:
    one = "|".join(_any_case(w) for w in words)
    return Annotated[str, Meta(pattern=f"^({one})(?!\n)$", description=description)]


Overlap = _any_case_of(
    ("allow", "skip", "cancel_previous"),
    "allow (the default), skip or cancel_previous; case is ignored",
)
CatchUp = _any_case_of(("once", "none"), "once (the default) or none; case is ignored")


class ScheduleRequest(Model):
    schedule_id: Name
    cron: Cron
    task: TaskTemplate
    timezone: (
        Annotated[
            str,
            Meta(
                description="an IANA zone name; default UTC",
                extra_json_schema={"enum": sorted(available_timezones() | {"UTC"})},
            ),
        ]
        | None
    ) = None
    overlap: Overlap | None = None  # type: ignore[valid-type]
    catch_up: CatchUp | None = None  # type: ignore[valid-type]


_STATUSES = (
    *("ENQUEUED", "LEASED", "RETRY_WAIT", "SUCCEEDED", "FAILED", "CANCELED", "EXPIRED"),
    *("SLEEPING", "WAITING"),
)
assert set(_STATUSES) == {s.value for s in TaskStatus}
_STATUS = f"({'|'.join(_STATUSES)})"  # in capitals: the events' state
_UNFINISHED = tuple(s for s in _STATUSES if TaskStatus(s) not in TERMINAL)


StatusList = Annotated[
    str,
    Meta(pattern=f"^ *{_STATUS}( *, *{_STATUS})* *$", description="comma-separated statuses"),
]


def _any_case_item(names: tuple[str, ...]) -> str:
    """A pattern of one status of ``names`` in any case with spaces around it, or spaces
    alone (no status; written so that a long run of spaces is matched in linear time)."""
    return f"( *({'|'.join(_any_case(n) for n in names)}))? *"


def _status_list(names: tuple[str, ...]) -> Meta:
    """Statuses separated by commas, read as ``_statuses`` reads them."""
    one = _any_case_item(names)
    return Meta(
        pattern=f"^{one}(,{one})*(?!\n)$",
        description=f"comma-separated statuses, each one of {', '.join(names)}; case is "
        "ignored (failed is FAILED), spaces around a status are not part of it and an "
        "empty one is none; none at all: any status",
    )


def _statuses(names: tuple[str, ...]) -> Any:
    """A filter's ``status``: a list of ``names`` or one string of them separated by commas,
    in any case (``failed`` is FAILED, as a listing's query has always read it), spaces
    around each and an empty one not counted; the node reads them in capitals before the
    model decodes them (``validation.py``)."""
    item = Annotated[
        str,
        Meta(
            pattern=f"^{_any_case_item(names)}(?!\n)$",
            description=f"one of {', '.join(names)}; case is ignored, spaces around it are "
            "not part of it and an empty one is none",
        ),
    ]
    listed = Annotated[str, _status_list(names)]
    return Annotated[list[item], Meta(max_length=len(TaskStatus))] | listed


AnyCaseStatuses = _statuses(_STATUSES)
AnyCaseStatusList = Annotated[str, _status_list(_STATUSES)]  # the listings' query


class TaskFilter(Model):
    """The list API's filters as a JSON object; ``since_ms`` and ``created_from_ms`` both bound
    the creation."""

    status: AnyCaseStatuses | None = None  # type: ignore[valid-type]
    queue: Text | None = None
    task_type: Text | None = None
    since_ms: NonNegative | None = None
    created_from_ms: NonNegative | None = None
    created_to_ms: NonNegative | None = None
    finished_from_ms: NonNegative | None = None
    finished_to_ms: NonNegative | None = None
    error_class: Text | None = None
    error_text: bounded_text(256, "in the error message, any case") | None = None  # type: ignore[valid-type]


BulkLimit = Annotated[int, Meta(ge=1, le=INT_MAX, description="stop after this many tasks")]


class RetryFilter(TaskFilter):
    """A retry's filter: it takes FAILED tasks only, so ``status`` may only say FAILED."""

    status: _statuses(("FAILED",)) | None = None  # type: ignore[valid-type]


class CancelFilter(TaskFilter):
    """A bulk cancel's filter: finished tasks cannot be canceled."""

    status: _statuses(_UNFINISHED) | None = None  # type: ignore[valid-type]


class RetryRequest(Model):
    """Either ``task_ids`` (retried now) or ``filter`` (a bulk operation over every FAILED
    match, up to ``limit``), not both; ``limit`` goes with a filter only."""

    task_ids: Annotated[list[TaskId], Meta(min_length=1, max_length=v.BATCH_MAX)] | None = None
    filter: RetryFilter | None = None
    limit: BulkLimit | None = None

    rules: ClassVar[Schema] = {
        "not": {
            "anyOf": [
                {"allOf": [_set("task_ids", "array"), _set("filter", "object")]},
                {"properties": {"task_ids": {"type": "null"}, "filter": {"type": "null"}}},
                {"allOf": [_set("task_ids", "array"), _set("limit", "integer")]},
            ]
        }
    }


REASON_BYTES_MAX = 1024
Reason = Annotated[
    str,
    Meta(
        max_length=REASON_BYTES_MAX,
        pattern="^[^\\x00]*$",
        description=f"at most {REASON_BYTES_MAX} bytes of UTF-8, no U+0000 (NUL)",
    ),
]


class BulkCancelRequest(Model):
    filter: CancelFilter
    reason: Reason | None = None
    limit: BulkLimit | None = None


class CancelRequest(Model):
    reason: Reason | None = None


class RunKey(Model):
    """A rerun's or a schedule's run's options (``reruns.py``)."""

    idempotency_key: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=v.IDEMPOTENCY_KEY_BYTES_MAX,
                pattern=TEXT_PATTERN,
                description=f"1..{v.IDEMPOTENCY_KEY_BYTES_MAX} bytes of UTF-8, no control "
                "characters: a resent request with the same key answers the first one's task",
            ),
        ]
        | None
    ) = None


EVENT_NAME_CHARS_MAX = STEP_NAME_BYTES_MAX - len("event:")  # a wait's step is event:<name>#<n>
EventName = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=EVENT_NAME_CHARS_MAX,
        pattern=NAME_PATTERN,
        description=name_rule(EVENT_NAME_CHARS_MAX),
        examples=["approved"],
    ),
]


class WorkflowEvent(Model):
    name: EventName
    payload: Json = None


# --- worker API ---------------------------------------------------------------------------


class Register(Model):
    agent_id: Text
    app: Name
    task_types: Annotated[list[Name], Meta(max_length=w.TASK_TYPES_MAX)]
    version: Text | None = None
    pinned: (
        Annotated[
            list[Name],
            Meta(
                max_length=w.TASK_TYPES_MAX,
                description="workflow types whose resume policy is pinned",
            ),
        ]
        | None
    ) = None
    deploy: (
        Annotated[
            int,
            Meta(
                ge=0,
                le=INT_MAX,
                description="the deploy number: only a higher one than any before removes the "
                "task types it does not serve",
            ),
        ]
        | None
    ) = None
    definitions: (
        Annotated[
            list[dict[str, Any]],
            Meta(
                max_length=w.TASK_TYPES_MAX,
                description="the types' definitions (default queue, priority, retry, "
                "timeouts, schemas), checked by the node's registry",
            ),
        ]
        | None
    ) = None


class Poll(Model):
    agent_id: Text
    app: Text
    version: Text | None = None
    queues: Annotated[list[Text], Meta(max_length=w.QUEUES_MAX)] | None = None
    capacity: Annotated[int, Meta(ge=1, le=POLL_CAPACITY_MAX)] | None = None
    wait_ms: Annotated[int, Meta(ge=0, le=v.WAIT_MS_MAX)] | None = None
    lease_ms: Annotated[int, Meta(ge=w.LEASE_MS_MIN, le=w.LEASE_MS_MAX)] | None = None
    task_types: (
        Annotated[
            list[Text],
            Meta(max_length=w.TASK_TYPES_MAX, description="the task types taken now (absent: any)"),
        ]
        | None
    ) = None
    open_breakers: (
        Annotated[
            list[Text],
            Meta(
                max_length=w.TASK_TYPES_MAX,
                description="task types the agent's circuit breaker holds back",
            ),
        ]
        | None
    ) = None


class SignalsRequest(Model):
    agent_id: Text
    app: Text
    wait_ms: Annotated[int, Meta(ge=0, le=w.SIGNALS_WAIT_MS_MAX)] | None = None


LeaseId = Annotated[int, Meta(ge=0, le=INT_MAX)]
Identity = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=w.IDENTITY_BYTES_MAX,
        pattern="^[^\\x00]+$",
        description=f"1..{w.IDENTITY_BYTES_MAX} bytes of UTF-8, no U+0000",
    ),
]
Position = Annotated[int, Meta(ge=-1, le=STEPS_MAX)]


class LeaseRef(Model):
    task_id: TaskId
    lease_id: LeaseId


class LeaseRefs(Model):
    leases: Annotated[list[LeaseRef], Meta(min_length=1, max_length=WORKER_ITEMS_MAX)]


class ErrorInfo(Model):
    class_: bounded_text(ERROR_CLASS_BYTES_MAX) | None = field(default=None, name="class")  # type: ignore[valid-type]
    message: bounded_text(ERROR_MESSAGE_BYTES_MAX) | None = None  # type: ignore[valid-type]
    stack: bounded_text(ERROR_STACK_BYTES_MAX) | None = None  # type: ignore[valid-type]


class SleepStep(Model):
    identity: Identity
    position: Position
    sleep_ms: NonNegative | None = None
    wake_at_ms: NonNegative | None = None


class WaitStep(Model):
    identity: Identity
    position: Position
    name: Annotated[str, Meta(min_length=1, max_length=STEP_NAME_BYTES_MAX)]
    timeout_ms: Ms | None = None


class FanOutStep(Model):
    identity: Identity
    position: Position
    mode: Literal["COLLECT", "FAIL_FAST"]
    children: Annotated[
        list[Json],
        Meta(
            min_length=1,
            max_length=PARALLEL_CHILDREN_MAX,
            description="task bodies (TaskRequest); a bad one fails the workflow (BadFanOut)",
        ),
    ]


def _needs(outcome: str, name: str) -> Schema:
    return {
        "if": {"properties": {"outcome": {"const": outcome}}},
        "then": {"required": [name], "properties": {name: {"type": "object"}}},
    }


class Completion(Model):
    task_id: TaskId
    lease_id: LeaseId
    outcome: Literal[
        "SUCCEEDED", "FAILED", "FATAL", "CANCELED", "SLEEP", "FAN_OUT", "WAIT_EVENT", "RELEASED"
    ]
    result: Json = None
    error: ErrorInfo | None = None
    retry_after_ms: Ms | None = None
    sleep: SleepStep | None = None
    log: (
        Annotated[
            str,
            Meta(
                max_length=ATTEMPT_LOG_BYTES_MAX,
                description="the tail of what the attempt printed",
            ),
        ]
        | None
    ) = None
    fan_out: FanOutStep | None = None
    wait: WaitStep | None = None

    rules: ClassVar[Schema] = {
        "allOf": [
            _needs("SLEEP", "sleep"),
            _needs("FAN_OUT", "fan_out"),
            _needs("WAIT_EVENT", "wait"),
        ]
    }


class Completions(Model):
    completions: Annotated[list[Completion], Meta(min_length=1, max_length=WORKER_ITEMS_MAX)]


class CheckpointItem(Model):
    task_id: TaskId
    lease_id: LeaseId
    value: Json = None


class Checkpoints(Model):
    checkpoints: Annotated[list[CheckpointItem], Meta(min_length=1, max_length=WORKER_ITEMS_MAX)]


class StepItem(Model):
    task_id: TaskId
    lease_id: LeaseId
    op: Literal["CLAIM", "COMMIT"]
    identity: Identity
    position: Position
    value: Json = None


class Steps(Model):
    steps: Annotated[list[StepItem], Meta(min_length=1, max_length=WORKER_ITEMS_MAX)]
