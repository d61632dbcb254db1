"""Client API requests: checked field by field into plain values, then into ``TaskSpec``s.

Validation is pure: it reads the JSON (already parsed by ``fields.parse_json``) and query
strings and knows nothing of the node. The checks that need state (is the task type
registered, does an idempotency key already name a different payload) happen in the handlers.
Defaults come from ``TaskSpec`` itself, so the wire and the record never disagree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from conveyor.frozen import frozen
from conveyor.schemas.resume import RESUME_POLICIES
from conveyor.schemas.types import TERMINAL, TaskSpec, TaskStatus
from conveyor.streams.gateway.fields import (
    INT_MAX,
    Fields,
    check_int,
    check_name,
    check_task_id,
    compact,
    describe,
    invalid,
)
from conveyor.streams.gateway.payload_fields import SEARCH_PREFIX, extract, parse_search
from conveyor.streams.gateway.payloads import check_not_marker

BATCH_MAX = 1_000
IDEMPOTENCY_KEY_BYTES_MAX = 256
PRIORITY_MAX = 9
RETRY_ATTEMPTS_MAX = 1_000
BACKOFF_FACTOR_MAX = 100.0
DURATION_MS_MAX = 100 * 365 * 86_400_000  # a century: keeps now + duration far inside int64
NON_RETRYABLE_MAX = 100
LIST_LIMIT_MAX = 1_000
LIST_LIMIT_DEFAULT = 100
WAIT_MS_MAX = 60_000
# ``run_at`` from the epoch (the machine stores instants as unsigned ms) to the last instant an
# RFC 3339 year of four digits can write.
RUN_AT_MIN = "1970-01-01T00:00:00Z"
RUN_AT_MAX = "9999-12-31T23:59:59.999Z"
RUN_AT_MS_MAX = 253_402_300_799_999

_DEFAULT = TaskSpec(task_id="", tenant="", app="", task_type="")
_TASK_FIELDS = frozenset(
    {
        "task_type",
        "app",
        "payload",
        "queue",
        "priority",
        "delay_ms",
        "run_at",
        "idempotency_key",
        "retry",
        "timeouts",
        "cancel_grace_ms",
        "resume",
        "trace_context",
    }
)
_RETRY_FIELDS = frozenset(
    {"attempts_max", "backoff_base_ms", "backoff_factor", "backoff_cap_ms", "non_retryable"}
)
_TIMEOUT_FIELDS = ("schedule_to_start_ms", "start_to_close_ms", "schedule_to_close_ms")
# The options a task type's definition may give a default (``registry.py`` rule 4); an enqueue
# that sets one (``EnqueueRequest.sent``) keeps its own.
DEFAULTABLE = (
    "queue",
    "priority",
    *sorted(_RETRY_FIELDS),
    *_TIMEOUT_FIELDS,
    "cancel_grace_ms",
    "resume",
)
_ABSENT = Fields({}, "", ())  # an object not sent: every read gives its default, none fails
_RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$"
)


@frozen(kw_only=True)
class EnqueueRequest:
    """One validated task of ``POST /v1/tasks`` or of a batch. ``path`` is where it sat."""

    path: str
    task_type: str
    app: str
    payload: bytes  # compact JSON
    queue: str = _DEFAULT.queue
    priority: int = _DEFAULT.priority
    delay_ms: int | None = None
    run_at_ms: int | None = None
    idempotency_key: str | None = None
    attempts_max: int = _DEFAULT.attempts_max
    backoff_base_ms: int = _DEFAULT.backoff_base_ms
    backoff_factor: float = _DEFAULT.backoff_factor
    backoff_cap_ms: int = _DEFAULT.backoff_cap_ms
    non_retryable: tuple[str, ...] = ()
    schedule_to_start_ms: int | None = None
    start_to_close_ms: int | None = None
    schedule_to_close_ms: int | None = None
    cancel_grace_ms: int = _DEFAULT.cancel_grace_ms
    resume: str | None = None  # None: the task type's registered policy (registry rule 3)
    trace_context: str | None = None  # compact JSON (``_trace_context``)
    payload_fields: str | None = None  # compact JSON (``payload_fields.extract``)
    sent: frozenset[str] = frozenset()  # the DEFAULTABLE options the request set itself

    def field(self, name: str) -> str:
        return f"{self.path}.{name}" if self.path else name


def parse_task(body: Any, path: str = "") -> EnqueueRequest:
    f = Fields(body, path, _TASK_FIELDS)
    payload = f.raw("payload")
    check_not_marker(payload, f.at("payload"))
    delay_ms = f.opt_int("delay_ms", 0, DURATION_MS_MAX)
    run_at_ms = _run_at(f)
    if delay_ms is not None and run_at_ms is not None:
        raise invalid(f.at("run_at"), "delay_ms and run_at are exclusive; send one of them")
    timeouts = f.obj("timeouts", _TIMEOUT_FIELDS) or _ABSENT
    retry = f.obj("retry", _RETRY_FIELDS) or _ABSENT
    base = retry.int_or("backoff_base_ms", 0, DURATION_MS_MAX, _DEFAULT.backoff_base_ms)
    cap = retry.int_or("backoff_cap_ms", 0, DURATION_MS_MAX, _DEFAULT.backoff_cap_ms)
    if cap < base:
        raise invalid(
            retry.at("backoff_cap_ms"), f"must be at least backoff_base_ms ({base}), got {cap}"
        )
    return EnqueueRequest(
        path=path,
        task_type=f.req_name("task_type"),
        app=f.req_name("app"),
        payload=compact(payload),
        queue=f.opt_name("queue") or _DEFAULT.queue,
        priority=f.int_or("priority", 0, PRIORITY_MAX, _DEFAULT.priority),
        delay_ms=delay_ms,
        run_at_ms=run_at_ms,
        idempotency_key=f.opt_str("idempotency_key", bytes_max=IDEMPOTENCY_KEY_BYTES_MAX),
        cancel_grace_ms=f.int_or("cancel_grace_ms", 0, DURATION_MS_MAX, _DEFAULT.cancel_grace_ms),
        attempts_max=retry.int_or("attempts_max", 1, RETRY_ATTEMPTS_MAX, _DEFAULT.attempts_max),
        backoff_base_ms=base,
        backoff_factor=retry.number_or(
            "backoff_factor", 1.0, BACKOFF_FACTOR_MAX, _DEFAULT.backoff_factor
        ),
        backoff_cap_ms=cap,
        non_retryable=tuple(retry.strs("non_retryable", NON_RETRYABLE_MAX)),
        schedule_to_start_ms=timeouts.opt_int("schedule_to_start_ms", 1, DURATION_MS_MAX),
        start_to_close_ms=timeouts.opt_int("start_to_close_ms", 1, DURATION_MS_MAX),
        schedule_to_close_ms=timeouts.opt_int("schedule_to_close_ms", 1, DURATION_MS_MAX),
        resume=_resume(f),
        trace_context=_trace_context(f.raw("trace_context"), f.at("trace_context")),
        payload_fields=extract(payload),
        sent=_sent(body),
    )


TRACE_CONTEXT_BYTES_MAX = 2048  # of the trace context's compact JSON
_TRACEPARENT = re.compile(r"^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")


def _trace_context(value: Any, field: str) -> str | None:
    """The enqueue's W3C trace context (``conveyor.tracing``), as compact JSON: an object of
    strings with a ``traceparent``; None when absent."""
    if value is None:
        return None
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise invalid(field, f"must be an object of strings, got {describe(value)}")
    parent = value.get("traceparent")
    if not isinstance(parent, str) or _TRACEPARENT.match(parent) is None:
        raise invalid(
            f"{field}.traceparent",
            "must be a W3C traceparent, as 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>",
        )
    text = compact(value).decode()
    if len(text.encode()) > TRACE_CONTEXT_BYTES_MAX:
        raise invalid(field, f"is at most {TRACE_CONTEXT_BYTES_MAX} bytes of JSON")
    return text


def _sent(body: dict[str, Any]) -> frozenset[str]:
    """The options ``body`` (already checked) sets, by their EnqueueRequest names."""
    top = ("queue", "priority", "cancel_grace_ms", "resume")
    sent = {k for k in top if body.get(k) is not None}
    for group in ("retry", "timeouts"):
        inner = body.get(group)
        if isinstance(inner, dict):
            sent.update(k for k, v in inner.items() if v is not None)
    return frozenset(sent)


def _resume(f: Fields) -> str | None:
    value = f.raw("resume")
    if value is None:
        return None
    if value not in RESUME_POLICIES:
        raise invalid(
            f.at("resume"),
            f"must be one of {'|'.join(RESUME_POLICIES)} (where a workflow's later attempts "
            f"run), got {describe(value)}",
        )
    return str(value)


def _run_at(f: Fields) -> int | None:
    value = f.raw("run_at")
    if value is None:
        return None
    expected = 'an RFC 3339 instant with a zone, e.g. "2026-01-01T00:00:00Z"'
    if not isinstance(value, str) or _RFC3339.match(value) is None:
        raise invalid(f.at("run_at"), f"must be {expected}, got {describe(value)}")
    text = value.replace("z", "Z")
    frac = re.search(r"\.(\d+)", text)
    if frac and len(frac.group(1)) > 6:  # datetime keeps microseconds: drop the rest
        text = text[: frac.start(1) + 6] + text[frac.end(1) :]
    try:
        instant = datetime.fromisoformat(text)
    except ValueError:
        raise invalid(f.at("run_at"), f"must be {expected}, got {describe(value)}") from None
    run_at_ms = int(instant.timestamp() * 1000)
    if not 0 <= run_at_ms <= RUN_AT_MS_MAX:
        raise invalid(
            f.at("run_at"),
            f"must be between {RUN_AT_MIN} and {RUN_AT_MAX} (the task's instant in epoch ms "
            f"must be 0..{RUN_AT_MS_MAX}), got {describe(value)}",
        )
    return run_at_ms


def parse_batch(body: Any) -> list[EnqueueRequest]:
    """All or nothing: the first bad item rejects the batch, naming ``tasks[i].field``."""
    f = Fields(body, "", {"tasks"})
    items = f.items("tasks", 1, BATCH_MAX)
    return [parse_task(item, f"tasks[{i}]") for i, item in enumerate(items)]


def to_spec(
    req: EnqueueRequest,
    *,
    task_id: str,
    tenant: str,
    payload: bytes,
    now_ms: int,
    resume: str = _DEFAULT.resume,
    searchable: bool = True,
) -> TaskSpec:
    """The record for ``req``; ``payload`` is ``req.payload`` or its blob marker; ``resume``
    the policy when ``req`` names none. The payload's fields are kept for search when
    ``searchable`` (the tenant shows payloads) and the payload is inline
    (``payload_fields.py`` rule 1)."""
    run_at_ms = req.run_at_ms
    if run_at_ms is None and req.delay_ms:
        run_at_ms = now_ms + req.delay_ms
    return TaskSpec(
        task_id=task_id,
        tenant=tenant,
        app=req.app,
        task_type=req.task_type,
        queue=req.queue,
        priority=req.priority,
        payload=payload,
        run_at_ms=run_at_ms,
        attempts_max=req.attempts_max,
        backoff_base_ms=req.backoff_base_ms,
        backoff_factor=req.backoff_factor,
        backoff_cap_ms=req.backoff_cap_ms,
        non_retryable=list(req.non_retryable),
        schedule_to_start_ms=req.schedule_to_start_ms,
        start_to_close_ms=req.start_to_close_ms,
        schedule_to_close_ms=req.schedule_to_close_ms,
        cancel_grace_ms=req.cancel_grace_ms,
        idempotency_key=req.idempotency_key,
        resume=req.resume or resume,
        delay_ms=req.delay_ms,
        trace_context=req.trace_context,
        payload_fields=req.payload_fields if searchable and payload == req.payload else None,
    )


# --- reads and bulk operations -----------------------------------------------------------


@frozen(kw_only=True)
class TaskFilter:
    statuses: frozenset[TaskStatus] = frozenset()  # empty: any
    queue: str | None = None
    task_type: str | None = None
    since_ms: int | None = None  # created (listing) or failed (retry) at or after
    error_class: str | None = None
    error_text: str | None = None  # substring of the error message, case-insensitive
    created_to_ms: int | None = None  # created before (exclusive)
    finished_from_ms: int | None = None  # finished at or after
    finished_to_ms: int | None = None  # finished before (exclusive)
    payload_fields: str | None = None  # a JSON object the task's fields contain (listing only)


@frozen(kw_only=True)
class ListQuery:
    filter: TaskFilter
    limit: int
    cursor: str | None
    count: bool = False  # also answer how many tasks match (a second, counting query)


_LIST_FIELDS = frozenset(
    {
        "status",
        "queue",
        "task_type",
        "since_ms",
        "created_from_ms",
        "created_to_ms",
        "finished_from_ms",
        "finished_to_ms",
        "error_class",
        "error_text",
        "limit",
        "cursor",
        "count",
    }
)


def parse_list_query(query: Mapping[str, str]) -> ListQuery:
    """The listing's query string; ``payload.<field>=<value>`` pairs (repeatable, one per
    field) search the payload fields (``payload_fields.py``)."""
    search = parse_search(query.items())
    rest = {k: query[k] for k in query if not k.startswith(SEARCH_PREFIX)}
    q = Fields(rest, "", set(_LIST_FIELDS))
    statuses: set[TaskStatus] = set()
    for name in filter(None, (q.raw("status") or "").split(",")):
        try:
            statuses.add(TaskStatus(name.strip().upper()))
        except ValueError:
            known = ", ".join(s.value for s in TaskStatus)
            raise invalid("status", f"unknown status {name!r}; expected {known}") from None
    since = _query_int(q, "since_ms", 0, INT_MAX)
    created_from = _query_int(q, "created_from_ms", 0, INT_MAX)
    return ListQuery(
        filter=TaskFilter(
            statuses=frozenset(statuses),
            queue=q.opt_str("queue"),
            task_type=q.opt_str("task_type"),
            since_ms=max(since or 0, created_from or 0) if since or created_from else None,
            error_class=q.opt_str("error_class"),
            error_text=q.opt_text("error_text", bytes_max=256),
            created_to_ms=_query_int(q, "created_to_ms", 0, INT_MAX),
            finished_from_ms=_query_int(q, "finished_from_ms", 0, INT_MAX),
            finished_to_ms=_query_int(q, "finished_to_ms", 0, INT_MAX),
            payload_fields=search,
        ),
        limit=_query_int(q, "limit", 1, LIST_LIMIT_MAX) or LIST_LIMIT_DEFAULT,
        cursor=q.opt_str("cursor", bytes_max=1024),
        count=_query_bool(q, "count"),
    )


def _query_bool(q: Fields, name: str) -> bool:
    text = (q.raw(name) or "").strip().lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise invalid(name, f"expected true or false, got {text!r}")


def parse_wait_ms(query: Mapping[str, str]) -> int:
    q = Fields(dict(query), "", {"wait_ms"})
    return _query_int(q, "wait_ms", 0, WAIT_MS_MAX) or 0


def parse_lease_id(text: str) -> int:
    """A lease id in a path: a positive 64-bit integer."""
    value: Any = int(text) if re.fullmatch(r"\d{1,19}", text) else text
    return check_int(value, "lease_id", 1, 2**63 - 1)


def _query_int(q: Fields, name: str, lo: int, hi: int) -> int | None:
    text = q.raw(name)
    if text is None or text == "":
        return None
    value: Any = int(text) if re.fullmatch(r"-?\d{1,19}", text) else text
    return check_int(value, name, lo, hi)


@frozen(kw_only=True)
class RetryRequest:
    """``task_ids``: retried in the request, at most ``BATCH_MAX``. ``filter``: a bulk
    operation over every FAILED match (up to ``limit`` tasks when given), run in the
    background."""

    task_ids: list[str] | None
    filter: TaskFilter | None
    limit: int | None


@frozen(kw_only=True)
class BulkCancelRequest:
    filter: TaskFilter
    reason: str
    limit: int | None


# A bulk operation's filter: the list API's filters, as a JSON object.
_FILTER_FIELDS = _LIST_FIELDS - {"limit", "cursor", "count"}


def parse_filter(f: Fields, name: str = "filter") -> TaskFilter:
    """The list API's filters as a JSON object; ``status`` is an array of statuses or one
    comma-separated string. ``since_ms`` and ``created_from_ms`` both bound the creation."""
    flt = f.obj(name, _FILTER_FIELDS)
    if flt is None:
        raise invalid(f.at(name), "is required (an object of list filters, {} for every task)")
    raw = flt.raw("status")
    names = raw.split(",") if isinstance(raw, str) else flt.strs("status", len(TaskStatus))
    statuses: set[TaskStatus] = set()
    for text in filter(None, (n.strip() for n in names)):
        try:
            statuses.add(TaskStatus(text.upper()))
        except ValueError:
            known = ", ".join(s.value for s in TaskStatus)
            raise invalid(flt.at("status"), f"unknown status {text!r}; expected {known}") from None
    since = flt.opt_int("since_ms", 0, INT_MAX)
    created_from = flt.opt_int("created_from_ms", 0, INT_MAX)
    return TaskFilter(
        statuses=frozenset(statuses),
        queue=flt.opt_str("queue"),
        task_type=flt.opt_str("task_type"),
        since_ms=max(since or 0, created_from or 0) if since or created_from else None,
        error_class=flt.opt_str("error_class"),
        error_text=flt.opt_text("error_text", bytes_max=256),
        created_to_ms=flt.opt_int("created_to_ms", 0, INT_MAX),
        finished_from_ms=flt.opt_int("finished_from_ms", 0, INT_MAX),
        finished_to_ms=flt.opt_int("finished_to_ms", 0, INT_MAX),
    )


def parse_retry(body: Any) -> RetryRequest:
    f = Fields(body, "", {"task_ids", "filter", "limit"})
    if f.has("task_ids") == f.has("filter"):
        raise invalid("task_ids", 'send either "task_ids" or "filter", not both or neither')
    if f.has("task_ids"):
        if f.has("limit"):
            raise invalid("limit", 'applies to a "filter" only; send at most 1000 task_ids')
        items = f.items("task_ids", 1, BATCH_MAX)
        ids = [check_task_id(v, f"task_ids[{i}]") for i, v in enumerate(items)]
        return RetryRequest(task_ids=ids, filter=None, limit=None)
    flt = parse_filter(f)
    if flt.statuses and flt.statuses != {TaskStatus.FAILED}:
        raise invalid("filter.status", "a retry takes FAILED tasks only; leave status out")
    return RetryRequest(task_ids=None, filter=flt, limit=f.opt_int("limit", 1, INT_MAX))


def parse_bulk_cancel(body: Any) -> BulkCancelRequest:
    f = Fields(body, "", {"filter", "reason", "limit"})
    flt = parse_filter(f)
    if flt.statuses & TERMINAL:
        finished = ", ".join(sorted(s.value for s in flt.statuses & TERMINAL))
        raise invalid("filter.status", f"{finished}: finished tasks cannot be canceled")
    return BulkCancelRequest(
        filter=flt,
        reason=f.opt_text("reason", bytes_max=1024, nul_ok=False) or "canceled by request",
        limit=f.opt_int("limit", 1, INT_MAX),
    )


def parse_cancel(body: Any) -> str:
    """The optional cancel reason (an empty body is a cancel without one)."""
    if body is None:
        return "canceled by request"
    f = Fields(body, "", {"reason"})
    return f.opt_text("reason", bytes_max=1024, nul_ok=False) or "canceled by request"


__all__ = [
    "BulkCancelRequest",
    "EnqueueRequest",
    "ListQuery",
    "RetryRequest",
    "TaskFilter",
    "check_name",
    "parse_batch",
    "parse_bulk_cancel",
    "parse_cancel",
    "parse_filter",
    "parse_list_query",
    "parse_retry",
    "parse_task",
    "parse_wait_ms",
    "to_spec",
]
