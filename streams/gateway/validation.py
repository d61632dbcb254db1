"""Client API requests: checked field by field into plain values, then into ``TaskSpec``s.

Validation is pure: it reads the JSON (already parsed by ``fields.parse_json``) and query
strings and knows nothing of the node. The checks that need state (is the task type
registered, does an idempotency key already name a different payload) happen in the handlers.
Defaults come from ``TaskSpec`` itself, so the wire and the record never disagree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from conveyor.contract.limits import (
    BACKOFF_FACTOR_MAX,
    BATCH_MAX,
    CURSOR_BYTES_MAX,
    DURATION_MS_MAX,
    IDEMPOTENCY_KEY_BYTES_MAX,
    INT_MAX,
    LIST_LIMIT_DEFAULT,
    LIST_LIMIT_MAX,
    NAME_BYTES_MAX,
    NON_RETRYABLE_MAX,
    PRIORITY_MAX,
    RETRY_ATTEMPTS_MAX,
    RUN_AT_MAX,
    RUN_AT_MIN,
    RUN_AT_MS_MAX,
    WAIT_MS_MAX,
)
from conveyor.frozen import frozen
from conveyor.schemas.types import TERMINAL, TaskSpec, TaskStatus
from conveyor.streams.gateway.contract import decode
from conveyor.streams.gateway.contract import requests as req
from conveyor.streams.gateway.contract.decode import check_bytes, check_text
from conveyor.streams.gateway.contract.requests import RetryPolicy, TaskBatch, TaskRequest, Timeouts
from conveyor.streams.gateway.fields import (
    Fields,
    check_int,
    check_name,
    compact,
    describe,
    invalid,
    join,
)
from conveyor.streams.gateway.payload_fields import SEARCH_PREFIX, extract, parse_search
from conveyor.streams.gateway.payloads import check_not_marker

_DEFAULT = TaskSpec(task_id="", tenant="", app="", task_type="")
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
    """One task body (``TaskRequest``) at ``path``: the model's checks, then its rules."""
    return task_request(decode.model(body, TaskRequest, path), path)


def parse_batch(body: Any) -> list[EnqueueRequest]:
    """All or nothing: the first bad item rejects the batch, naming ``tasks[i].field``."""
    batch = decode.model(body, TaskBatch)
    return [task_request(task, f"tasks[{i}]") for i, task in enumerate(batch.tasks)]


_NO_RETRY = RetryPolicy()
_NO_TIMEOUTS = Timeouts()


def task_request(task: TaskRequest, path: str) -> EnqueueRequest:
    """The rules of ``TaskRequest`` no type states: a payload is no blob marker, ``delay_ms``
    and ``run_at`` are exclusive, byte limits (``conveyor.contract.shapes`` rule 2)."""
    check_not_marker(task.payload, join(path, "payload"))
    if task.delay_ms is not None and task.run_at is not None:
        raise invalid(join(path, "run_at"), "delay_ms and run_at are exclusive; send one of them")
    key = task.idempotency_key
    if key is not None and not key.isascii():
        check_text(key, join(path, "idempotency_key"), IDEMPOTENCY_KEY_BYTES_MAX)
    retry = task.retry or _NO_RETRY
    timeouts = task.timeouts or _NO_TIMEOUTS
    non_retryable = tuple(retry.non_retryable or ())
    for i, name in enumerate(non_retryable):
        check_text(name, join(path, f"retry.non_retryable[{i}]"), NAME_BYTES_MAX)
    return EnqueueRequest(
        path=path,
        task_type=task.task_type,
        app=task.app,
        payload=compact(task.payload),
        queue=_or(task.queue, _DEFAULT.queue),
        priority=_or(task.priority, _DEFAULT.priority),
        delay_ms=task.delay_ms,
        run_at_ms=None if task.run_at is None else _run_at_ms(task.run_at, path),
        idempotency_key=task.idempotency_key,
        cancel_grace_ms=_or(task.cancel_grace_ms, _DEFAULT.cancel_grace_ms),
        attempts_max=_or(retry.attempts_max, _DEFAULT.attempts_max),
        backoff_base_ms=_or(retry.backoff_base_ms, _DEFAULT.backoff_base_ms),
        backoff_factor=float(_or(retry.backoff_factor, _DEFAULT.backoff_factor)),
        backoff_cap_ms=_or(retry.backoff_cap_ms, _DEFAULT.backoff_cap_ms),
        non_retryable=non_retryable,
        schedule_to_start_ms=timeouts.schedule_to_start_ms,
        start_to_close_ms=timeouts.start_to_close_ms,
        schedule_to_close_ms=timeouts.schedule_to_close_ms,
        resume=task.resume,
        trace_context=_trace_context(task.trace_context, join(path, "trace_context")),
        payload_fields=extract(task.payload),
        sent=_sent(task, retry, timeouts),
    )


T = TypeVar("T")


def _or(value: T | None, default: T) -> T:
    return default if value is None else value


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


def _sent(task: TaskRequest, retry: RetryPolicy, timeouts: Timeouts) -> frozenset[str]:
    """The options the request sets itself, by their EnqueueRequest names."""
    sent = [k for k in _TOP_OPTIONS if getattr(task, k) is not None]
    if retry is not _NO_RETRY:
        sent += [k for k in _RETRY_FIELDS if getattr(retry, k) is not None]
    if timeouts is not _NO_TIMEOUTS:
        sent += [k for k in _TIMEOUT_FIELDS if getattr(timeouts, k) is not None]
    return frozenset(sent) if sent else _NONE_SENT


_TOP_OPTIONS = ("queue", "priority", "cancel_grace_ms", "resume")
_NONE_SENT: frozenset[str] = frozenset()


def _run_at_ms(text: str, path: str) -> int:
    """``text`` (it matches ``RUN_AT_PATTERN``) in epoch ms, ``RUN_AT_MIN..RUN_AT_MAX``."""
    text = text.replace("z", "Z")
    frac = re.search(r"\.(\d+)", text)
    if frac and len(frac.group(1)) > 6:  # datetime keeps microseconds: drop the rest
        text = text[: frac.start(1) + 6] + text[frac.end(1) :]
    try:
        instant = datetime.fromisoformat(text)
    except ValueError as exc:
        raise invalid(join(path, "run_at"), f"is not a calendar instant: {exc}") from None
    run_at_ms = int(instant.timestamp() * 1000)
    if not 0 <= run_at_ms <= RUN_AT_MS_MAX:
        raise invalid(
            join(path, "run_at"),
            f"must be between {RUN_AT_MIN} and {RUN_AT_MAX} (the task's instant in epoch ms "
            f"must be 0..{RUN_AT_MS_MAX}), got {describe(text)}",
        )
    return run_at_ms


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
    # Read as a filter's status is (``_statuses``): any case, spaces around, empty ones none.
    for name in filter(None, (n.strip(" ") for n in (q.raw("status") or "").split(","))):
        try:
            statuses.add(TaskStatus(name.upper()))
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
        cursor=q.opt_str("cursor", bytes_max=CURSOR_BYTES_MAX) if q.raw("cursor") else None,
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


_UNKNOWN_STATUS = "unknown status {!r}; expected " + ", ".join(s.value for s in TaskStatus)


def _statuses(body: Any, field: str, allowed: frozenset[TaskStatus], why: str) -> None:
    """The filter's ``status`` in capitals, as the listing's query reads it (``failed`` is
    FAILED), in place before the model decodes it; a status the operation does not take is
    refused saying why (``why`` names the statuses), where the model would only list them."""
    filt: Any = body.get("filter") if isinstance(body, dict) else None
    raw = filt.get("status") if isinstance(filt, dict) else None
    names = raw.split(",") if isinstance(raw, str) else raw if isinstance(raw, list) else None
    if not names or not all(isinstance(n, str) for n in names):
        return  # absent, or not strings: the model says what it takes
    statuses = []
    for name in (n.strip(" ").upper() for n in names):
        if name:
            try:
                statuses.append(TaskStatus(name))
            except ValueError:
                raise invalid(field, _UNKNOWN_STATUS.format(name)) from None
    if wrong := [s.value for s in statuses if s not in allowed]:
        raise invalid(field, why.format(", ".join(sorted(set(wrong)))))
    if not statuses:  # "" or " , ": no status named, so any, as the listing reads it
        filt["status"] = None
    elif isinstance(raw, str):
        filt["status"] = ",".join(statuses)
    else:
        filt["status"] = [s.value for s in statuses]


def _task_filter(m: req.TaskFilter, path: str = "filter") -> TaskFilter:
    """The plain filter of a decoded ``TaskFilter`` (``status`` in capitals, ``_statuses``);
    ``since_ms`` and ``created_from_ms`` both bound the creation."""
    raw: Sequence[str] = m.status.split(",") if isinstance(m.status, str) else m.status or ()
    check_text(m.queue, join(path, "queue"))
    check_text(m.task_type, join(path, "task_type"))
    check_text(m.error_class, join(path, "error_class"))
    if m.error_text is not None:
        check_bytes(m.error_text, join(path, "error_text"), ERROR_TEXT_BYTES_MAX)
    since, created_from = m.since_ms, m.created_from_ms
    return TaskFilter(
        statuses=frozenset(TaskStatus(name.strip()) for name in raw if name.strip()),
        queue=m.queue,
        task_type=m.task_type,
        since_ms=max(since or 0, created_from or 0) if since or created_from else None,
        error_class=m.error_class,
        error_text=m.error_text,
        created_to_ms=m.created_to_ms,
        finished_from_ms=m.finished_from_ms,
        finished_to_ms=m.finished_to_ms,
    )


ERROR_TEXT_BYTES_MAX = 256
_FAILED_ONLY = frozenset({TaskStatus.FAILED})
_UNFINISHED = frozenset(TaskStatus) - TERMINAL


def parse_retry(body: Any) -> RetryRequest:
    """``RetryRequest``: the model, then its rules (one of ``task_ids`` and ``filter``;
    ``limit`` with a filter only)."""
    _statuses(
        body, "filter.status", _FAILED_ONLY, "a retry takes FAILED tasks only; leave status out"
    )
    m = decode.model(body, req.RetryRequest)
    if (m.task_ids is None) == (m.filter is None):
        raise invalid("task_ids", 'send either "task_ids" or "filter", not both or neither')
    if m.task_ids is not None:
        if m.limit is not None:
            raise invalid("limit", 'applies to a "filter" only; send at most 1000 task_ids')
        return RetryRequest(task_ids=m.task_ids, filter=None, limit=None)
    assert m.filter is not None
    return RetryRequest(task_ids=None, filter=_task_filter(m.filter), limit=m.limit)


def parse_bulk_cancel(body: Any) -> BulkCancelRequest:
    _statuses(body, "filter.status", _UNFINISHED, "{}: finished tasks cannot be canceled")
    m = decode.model(body, req.BulkCancelRequest)
    return BulkCancelRequest(
        filter=_task_filter(m.filter), reason=_reason(m.reason, "reason"), limit=m.limit
    )


def parse_cancel(body: Any) -> str:
    """The optional cancel reason (an empty body is a cancel without one)."""
    if body is None:
        return CANCEL_REASON
    return _reason(decode.model(body, req.CancelRequest).reason, "reason")


CANCEL_REASON = "canceled by request"


def _reason(text: str | None, path: str) -> str:
    if not text:
        return CANCEL_REASON
    check_bytes(text, path, req.REASON_BYTES_MAX)
    return text


__all__ = [  # the limits are defined in conveyor.contract.limits; read here too
    "BACKOFF_FACTOR_MAX",
    "BATCH_MAX",
    "DURATION_MS_MAX",
    "IDEMPOTENCY_KEY_BYTES_MAX",
    "LIST_LIMIT_DEFAULT",
    "LIST_LIMIT_MAX",
    "NON_RETRYABLE_MAX",
    "PRIORITY_MAX",
    "RETRY_ATTEMPTS_MAX",
    "WAIT_MS_MAX",
    "BulkCancelRequest",
    "EnqueueRequest",
    "ListQuery",
    "RetryRequest",
    "TaskFilter",
    "check_name",
    "parse_batch",
    "parse_bulk_cancel",
    "parse_cancel",
    "parse_list_query",
    "parse_retry",
    "parse_task",
    "parse_wait_ms",
    "to_spec",
]
