"""The client side of the HTTP contract (streams/gateway/PROTOCOL.md), without any transport.

Both clients and ``conveyor.testing`` build enqueue bodies here, so an enqueue means the same
thing over HTTP and in-process. Rule: every enqueue body carries an idempotency key, minted
here (uuid4) when the caller gave none, BEFORE any transport retry, so a retried request whose
first ack was lost meets its twin instead of creating a second task.
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import KW_ONLY, field
from datetime import UTC, datetime
from enum import Enum
from typing import TYPE_CHECKING, Any, Final, Required, TypedDict, TypeVar

import msgspec

from conveyor import tracing
from conveyor.app import Retry, TaskOptions, TaskType, check_priority
from conveyor.durations import Duration, to_ms, to_ms_or_none
from conveyor.errors import (
    Conflict,
    ContractError,
    ConveyorError,
    Forbidden,
    NotFound,
    RateLimited,
    TransientError,
    Unauthorized,
)
from conveyor.frozen import frozen
from conveyor.typed import encode

if TYPE_CHECKING:
    from conveyor.codecs import PayloadCodec
    from conveyor.contract import replies as contract

TERMINAL: Final = frozenset({"SUCCEEDED", "FAILED", "CANCELED", "EXPIRED"})
BATCH_MAX: Final = 1000
IDEMPOTENCY_KEY_BYTES_MAX: Final = 256


class _Unset(Enum):
    UNSET = "UNSET"


UNSET: Final = _Unset.UNSET
MaybeDuration = Duration | None | _Unset


@frozen
class Enqueue:
    """One task to enqueue: for ``enqueue_many``. Unset options take the task type's
    defaults (or the server's, for a task named by string)."""

    task: TaskType[Any, Any] | str
    payload: Any = None
    _: KW_ONLY
    app: str | None = None
    delay: Duration | None = None
    run_at: datetime | None = None
    queue: str | None = None
    priority: int | None = None
    idempotency_key: str | None = None
    retry: Retry | None = None
    timeout: MaybeDuration = UNSET
    schedule_to_start: MaybeDuration = UNSET
    schedule_to_close: MaybeDuration = UNSET
    cancel_grace: Duration | None = None


class EnqueueOptions(TypedDict, total=False):
    """The keyword options of every client's ``enqueue`` (the fields of ``Enqueue``)."""

    app: str | None
    delay: Duration | None
    run_at: datetime | None
    queue: str | None
    priority: int | None
    idempotency_key: str | None
    retry: Retry | None
    timeout: MaybeDuration
    schedule_to_start: MaybeDuration
    schedule_to_close: MaybeDuration
    cancel_grace: Duration | None


def enqueue_body(req: Enqueue, default_app: str | None) -> dict[str, Any]:
    """The ``POST /v1/tasks`` body for ``req``."""
    task = req.task
    opts: TaskOptions | None = None
    app: str | None
    if isinstance(task, TaskType):
        name, app, opts = task.name, req.app or task.app.name, task.options
    else:
        name, app = task, req.app or default_app
    if not app:
        raise ContractError(
            f"enqueue of {name!r} needs an app: pass app= or a decorated task", field="app"
        )
    payload = (
        task.encode_payload(req.payload) if isinstance(task, TaskType) else encode(req.payload)
    )
    body: dict[str, Any] = {"task_type": name, "app": app, "payload": payload}
    queue = req.queue if req.queue is not None or opts is None else opts.queue
    _put(body, "queue", queue)
    priority = req.priority if req.priority is not None or opts is None else opts.priority
    _put(body, "priority", None if priority is None else check_priority(priority))
    if req.delay is not None and req.run_at is not None:
        raise ContractError("delay and run_at are exclusive", field="delay")
    if req.delay is not None:
        body["delay_ms"] = to_ms(req.delay, field="delay")
    if req.run_at is not None:
        body["run_at"] = rfc3339(req.run_at)
    body["idempotency_key"] = _key(req.idempotency_key)
    retry = req.retry if req.retry is not None or opts is None else opts.retry
    _put(body, "retry", None if retry is None else retry.to_wire())
    timeouts = _timeouts(req, opts.timeouts() if opts else {})
    if timeouts:
        body["timeouts"] = timeouts
    if req.cancel_grace is not None:
        body["cancel_grace_ms"] = to_ms(req.cancel_grace, field="cancel_grace")
    elif opts is not None:
        body["cancel_grace_ms"] = opts.cancel_grace_ms
    if opts is not None and opts.resume != "latest":
        body["resume"] = opts.resume
    trace = tracing.current_context()  # the caller's span, for the attempts' spans
    if trace is not None:
        body["trace_context"] = trace
    return body


def _put(body: dict[str, Any], key: str, value: Any) -> None:
    if value is not None:
        body[key] = value


# An idempotency key the SDK mints for an enqueue that names none: ``cv~<window>~<random>``.
# The node routes such a key by its window alone (``routing.partition_for_key``), so the
# enqueues of one ~67 ms window, from every client, share a partition and its record batches
# (concurrent single enqueues from 16 callers: 41-53% more per second, a third less node CPU
# each, in alternating runs), while a retry of the key still meets its twin; over a second the
# windows spread over every partition.
MINTED_KEY_PREFIX = "cv~"
MINTED_WINDOW_NS = 1 << 26


def minted_key() -> str:
    return f"{MINTED_KEY_PREFIX}{time.time_ns() // MINTED_WINDOW_NS:x}~{uuid.uuid4().hex}"


def _key(given: str | None) -> str:
    if given is None:
        return minted_key()
    if not isinstance(given, str) or not given:
        raise ContractError("idempotency_key must be a non-empty string", field="idempotency_key")
    if len(given.encode()) > IDEMPOTENCY_KEY_BYTES_MAX:
        raise ContractError(
            f"idempotency_key is at most {IDEMPOTENCY_KEY_BYTES_MAX} bytes",
            field="idempotency_key",
        )
    return given


def _timeouts(req: Enqueue, defaults: Mapping[str, int | None]) -> dict[str, int | None]:
    out = dict(defaults)
    for attr, wire in (
        ("timeout", "start_to_close_ms"),
        ("schedule_to_start", "schedule_to_start_ms"),
        ("schedule_to_close", "schedule_to_close_ms"),
    ):
        value = getattr(req, attr)
        if value is not UNSET:
            out[wire] = to_ms_or_none(value, field=attr)
    return out


def rfc3339(when: datetime) -> str:
    if when.tzinfo is None:
        raise ContractError(
            "run_at must be timezone-aware (e.g. datetime.now(UTC) + ...)", field="run_at"
        )
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")


def chunks(bodies: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    return [bodies[i : i + BATCH_MAX] for i in range(0, len(bodies), BATCH_MAX)]


# --- replies -----------------------------------------------------------------------------------
#
# Replies decode through the models the node renders with and the document states
# (``conveyor.contract.replies``): a reply the model refuses is a ContractError naming the field
# (``tasks[3].priority``), never a TypeError from deep inside the client. The classes below are
# the SDK's views of the models: frozen, with the attribute names the SDK has always had.

R = TypeVar("R", bound="contract.Reply")
_AT = re.compile(r" - at `\$(.*)`$")
_MISSING = re.compile(r"missing required field `([^`]+)`")


def decode_reply(model: type[R], data: Any) -> R:
    """``data`` (a reply's parsed JSON) as ``model``; a ContractError naming the field at fault
    when the node sent what the contract does not allow. The callers import the models when
    they first decode, so ``import conveyor; conveyor.Client`` does not load them."""
    try:
        return msgspec.convert(data, model)
    except msgspec.ValidationError as exc:
        raise reply_error(model, exc) from None


def reply_error(model: type[contract.Reply], exc: msgspec.ValidationError) -> ContractError:
    reason = str(exc)
    at = _AT.search(reason)
    path = at.group(1).lstrip(".") if at else ""
    reason = reason[: at.start()] if at else reason
    missing = _MISSING.search(reason)
    if missing:  # the path is the object's; the field at fault is the one it lacks
        path = f"{path}.{missing.group(1)}" if path else missing.group(1)
    where = f" at {path}" if path else ""
    return ContractError(
        f"the node's reply does not match the HTTP contract ({model.__name__}{where}: {reason}); "
        "the client and the node disagree on the contract: upgrade the older of the two",
        field=path or None,
    )


@frozen(kw_only=True)
class ErrorInfo:
    error_class: str
    message: str | None = None
    stack: str | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | None) -> ErrorInfo | None:
        """The error of a task or attempt as the API describes it; None for none."""
        if not data:
            return None
        from conveyor.contract import replies as contract  # loaded by the first reply

        return _error(decode_reply(contract.Error, data))


def _error(e: contract.Error | None) -> ErrorInfo | None:
    if e is None or (e.class_ is None and e.message is None and e.stack is None):
        return None
    return ErrorInfo(error_class=e.class_ or "Error", message=e.message, stack=e.stack)


@frozen(kw_only=True)
class AttemptInfo:
    attempt: int
    worker: str | None
    started_ms: int | None
    finished_ms: int | None
    outcome: str | None
    error: ErrorInfo | None = None
    log_url: str | None = None  # what the attempt printed: ``client.attempt_log(attempt)``


@frozen(kw_only=True)
class TaskInfo:
    """A task as ``GET /v1/tasks/{id}`` describes it. Lists leave out payload and attempts,
    and a list read from the query snapshot does not know priority and run_at (``None``)."""

    task_id: str
    app: str
    task_type: str
    status: str
    attempt: int
    queue: str = "default"
    priority: int | None = 0
    created_ms: int | None = None
    updated_ms: int | None = None
    run_at_ms: int | None = None
    finished_ms: int | None = None
    payload: Any = None
    result: Any = None
    checkpoint: Any = None
    error: ErrorInfo | None = None
    cancel_requested: bool = False
    attempts: list[AttemptInfo] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        """True once the task is terminal (SUCCEEDED, FAILED, CANCELED, EXPIRED)."""
        return self.status in TERMINAL

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TaskInfo:
        """A task from its ``GET /v1/tasks/{id}`` JSON, or a listing's row (no ``attempts``)."""
        if isinstance(data, Mapping) and "attempts" in data:
            return task_info(data)
        from conveyor.contract import replies as contract  # loaded by the first reply

        return _task(decode_reply(contract.TaskSummary, data))


def task_info(data: Any) -> TaskInfo:
    """The reply of ``GET /v1/tasks/{id}``: a task with its payload, result and attempts."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    t = decode_reply(contract.Task, data)
    attempts = [
        AttemptInfo(
            attempt=a.attempt,
            worker=a.worker,
            started_ms=a.started_ms,
            finished_ms=a.finished_ms,
            outcome=a.outcome,
            error=_error(a.error),
            log_url=a.log_url,
        )
        for a in t.attempts
    ]
    return _task(t, t.payload, t.result, t.checkpoint, attempts)


def _task(
    t: contract.TaskSummary,
    payload: Any = None,
    result: Any = None,
    checkpoint: Any = None,
    attempts: list[AttemptInfo] | None = None,
) -> TaskInfo:
    return TaskInfo(
        task_id=t.task_id,
        app=t.app,
        task_type=t.task_type,
        status=t.status,
        attempt=t.attempt,
        queue=t.queue,
        priority=t.priority,
        created_ms=t.created_ms,
        updated_ms=t.updated_ms,
        run_at_ms=t.run_at_ms,
        finished_ms=t.finished_ms,
        payload=payload,
        result=result,
        checkpoint=checkpoint,
        error=_error(t.error),
        cancel_requested=t.cancel_requested,
        attempts=[] if attempts is None else attempts,
    )


@frozen(kw_only=True)
class TaskPage:
    tasks: list[TaskInfo]
    next_cursor: str | None = None
    # True: the node's query snapshot had not caught up with it within the listing's wait, so
    # a task acknowledged a moment ago may be missing from this page.
    may_trail: bool = False

    @classmethod
    def from_json(cls, reply: Mapping[str, Any]) -> TaskPage:
        """A page of ``GET /v1/tasks``."""
        from conveyor.contract import replies as contract  # loaded by the first reply

        page = decode_reply(contract.TaskPage, reply)
        return cls(
            tasks=[_task(t) for t in page.tasks],
            next_cursor=page.next_cursor,
            may_trail=page.may_trail,
        )


def enqueued(reply: Any) -> contract.EnqueueReply:
    """The reply of ``POST /v1/tasks``."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.EnqueueReply, reply)


def enqueued_batch(reply: Any) -> list[contract.EnqueueReply]:
    """The results of ``POST /v1/tasks:batch``, in the order of the request's tasks."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.EnqueueBatchReply, reply).results


def query(**params: Any) -> dict[str, Any]:
    """Query parameters of a request, those that are None left out."""
    return {k: v for k, v in params.items() if v is not None}


def payload_search(payload: Mapping[str, Any] | None) -> dict[str, str]:
    """``list(payload={"customer": "acme", "n": 3})`` as the listing's ``payload.<field>``
    query parameters. The server reads a value as the JSON scalar it spells, else as a string;
    so a number, true, false or None is sent as JSON, and a string as it is unless it would
    read as something else (``"3"``, ``"true"``, ``'"x"'``): then quoted, as JSON."""
    params: dict[str, str] = {}
    for name, value in (payload or {}).items():
        if isinstance(value, str):
            params[f"payload.{name}"] = value if _reads_as_itself(value) else json.dumps(value)
        elif value is None or isinstance(value, bool | int | float):
            params[f"payload.{name}"] = json.dumps(value)
        else:
            raise TypeError(
                f"payload[{name!r}]: a payload search compares top-level scalars (str, int, "
                f"float, bool, None), got {type(value).__name__}"
            )
    return params


def _reads_as_itself(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return True
    return False


@frozen(kw_only=True)
class OperationInfo:
    """A bulk retry or cancel by filter, as ``GET /v1/operations/{id}`` reports it."""

    operation_id: str
    kind: str  # "retry" | "cancel"
    state: str  # "running" | "done" | "failed"
    matched: int | None  # tasks the filter matched at start; None while counting
    done: int  # tasks processed so far
    changed: int  # of those: re-enqueued, or canceled / asked to stop
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.state != "running"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> OperationInfo:
        """An operation from its ``GET /v1/operations/{id}`` JSON."""
        from conveyor.contract import replies as contract  # loaded by the first reply

        op = decode_reply(contract.Operation, data)
        return cls(
            operation_id=op.operation_id,
            kind=op.kind,
            state=op.state,
            matched=op.matched,
            done=op.done,
            changed=op.changed,
            error=op.error,
        )


class BulkFilter(TypedDict, total=False):
    """Which tasks a bulk operation takes: the list API's filters."""

    status: list[str]
    queue: str
    task_type: str
    error_class: str
    error_text: str
    since_ms: int
    created_to_ms: int
    finished_from_ms: int
    finished_to_ms: int


# --- errors ------------------------------------------------------------------------------------

_BY_CODE: dict[str, type[ContractError]] = {
    "not_found": NotFound,
    "unauthorized": Unauthorized,
    "forbidden": Forbidden,
    "conflict": Conflict,
}


def error_from_reply(status: int, body: Any, retry_after_ms: int | None = None) -> ConveyorError:
    """The exception for a 4xx/5xx reply, carrying the server's code and message."""
    err = body.get("error") if isinstance(body, dict) else None
    code = str(err.get("code", "")) if isinstance(err, dict) else ""
    message = str(err.get("message", "")) if isinstance(err, dict) else ""
    field_ = err.get("field") if isinstance(err, dict) else None
    message = message or f"HTTP {status} with no error body"
    exc: ConveyorError
    if status == 429 or code == "rate_limited":
        exc = RateLimited(message, retry_after_ms=retry_after_ms or 1_000)
    elif status == 503 or code == "unavailable":
        exc = TransientError(message, retry_after_ms=retry_after_ms or 100)
    elif 400 <= status < 500:
        exc = _BY_CODE.get(code, ContractError)(message, field=field_)
    else:
        exc = ConveyorError(f"HTTP {status}: {message}")
    if code:
        exc.code = code
    return exc


# --- schedules ---------------------------------------------------------------------------------

OVERLAP_POLICIES: Final = ("allow", "skip", "cancel_previous")
CATCH_UP_POLICIES: Final = ("once", "none")


class ScheduleOptions(TypedDict, total=False):
    """The keyword options of every client's ``schedule``."""

    cron: Required[str]
    schedule_id: str | None
    timezone: str
    overlap: str
    catch_up: str
    app: str | None
    queue: str | None
    priority: int | None
    retry: Retry | None
    timeout: MaybeDuration


def schedule_body(
    task_type: TaskType[Any, Any] | str,
    payload: Any,
    default_app: str | None,
    options: ScheduleOptions,
) -> dict[str, Any]:
    """The ``POST /v1/schedules`` body: the task each firing enqueues, and when. Without a
    ``schedule_id`` the task type's name is the id, so scheduling the same task again replaces
    its schedule instead of adding a second one."""
    req = Enqueue(
        task_type,
        payload,
        app=options.get("app"),
        queue=options.get("queue"),
        priority=options.get("priority"),
        retry=options.get("retry"),
        timeout=options.get("timeout", UNSET),
    )
    schedule_id = options.get("schedule_id")
    timezone = options.get("timezone", "UTC")
    overlap = options.get("overlap", "allow")
    catch_up = options.get("catch_up", "once")
    cron = options["cron"]
    task = enqueue_body(req, default_app)
    for per_firing in ("idempotency_key", "delay_ms", "run_at"):
        task.pop(per_firing, None)
    if overlap not in OVERLAP_POLICIES:
        raise ContractError(f"overlap must be one of {OVERLAP_POLICIES}", field="overlap")
    if catch_up not in CATCH_UP_POLICIES:
        raise ContractError(f"catch_up must be one of {CATCH_UP_POLICIES}", field="catch_up")
    return {
        "schedule_id": schedule_id or task["task_type"],
        "cron": cron,
        "timezone": timezone,
        "overlap": overlap,
        "catch_up": catch_up,
        "task": task,
    }


@frozen
class ScheduleInfo:
    schedule_id: str
    cron: str
    timezone: str
    overlap: str
    catch_up: str
    task_type: str
    app: str
    next_fire_ms: int | None
    last_fire_ms: int | None
    last_task_id: str | None
    fired: int
    skipped: int
    paused: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScheduleInfo:
        """A schedule from its JSON (``POST /v1/schedules``, a pause or resume)."""
        from conveyor.contract import replies as contract  # loaded by the first reply

        return _schedule(decode_reply(contract.Schedule, data))


def _schedule(s: contract.Schedule) -> ScheduleInfo:
    return ScheduleInfo(
        schedule_id=s.schedule_id,
        cron=s.cron,
        timezone=s.timezone,
        overlap=s.overlap,
        catch_up=s.catch_up,
        task_type=s.task.task_type,
        app=s.task.app,
        next_fire_ms=s.next_fire_ms,
        last_fire_ms=s.last_fire_ms,
        last_task_id=s.last_task_id,
        fired=s.fired,
        skipped=s.skipped,
        paused=s.paused,
    )


def schedule_list(reply: Any) -> list[ScheduleInfo]:
    """The schedules of ``GET /v1/schedules``."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return [_schedule(s) for s in decode_reply(contract.Schedules, reply).schedules]


ScheduleList = list[ScheduleInfo]  # for clients whose own ``list`` method shadows the builtin


# The workflow, events and webhook replies are handed on as the contract's models themselves
# (``conveyor.contract.replies``): no SDK view, the attribute names are the document's. The
# payload-carrying fields (``Json``: a history row's value, which is a step's return, a parallel
# step's results or an event's payload) are decoded through the client's codec chain before the
# model takes the reply, so they hold what the code sent; a workflow's reply goes through the
# chain alike, so a payload field it gains is decoded too.


def workflow_reply(codec: PayloadCodec | None, reply: Any) -> contract.Workflow:
    """The reply of ``GET /v1/workflows/{id}``, its payloads decoded by ``codec``."""
    from conveyor.codecs import decode_tree  # conveyor.codecs imports this module
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.Workflow, decode_tree(codec, reply))


def workflow_history_page(codec: PayloadCodec | None, reply: Any) -> contract.WorkflowHistory:
    """A page of ``GET /v1/workflows/{id}/history``, its step values decoded by ``codec``."""
    from conveyor.codecs import decode_tree  # conveyor.codecs imports this module
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.WorkflowHistory, decode_tree(codec, reply))


def events_page(reply: Any) -> contract.Events:
    """A page of ``GET /v1/events``."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.Events, reply)


def new_webhook(reply: Any) -> contract.NewWebhook:
    """The reply of ``POST /v1/webhooks``: the webhook and its signing secret."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.NewWebhook, reply)


def webhook_list(reply: Any) -> tuple[contract.Webhook, ...]:
    """The webhooks of ``GET /v1/webhooks``."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return tuple(decode_reply(contract.Webhooks, reply).webhooks)


def delivery_list(reply: Any) -> tuple[contract.Delivery, ...]:
    """The deliveries of ``GET /v1/webhooks/{id}/deliveries``."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return tuple(decode_reply(contract.Deliveries, reply).deliveries)


def canceled_status(reply: Any) -> str:
    """The status of ``POST /v1/tasks/{id}/cancel``'s reply."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.Canceled, reply).status


def event_status(reply: Any) -> str:
    """The workflow's status in ``POST /v1/workflows/{id}/events``'s reply."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.EventSent, reply).status


def rerun_id(reply: Any) -> str:
    """The new task's id in ``POST /v1/tasks/{id}/rerun``'s reply."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.Rerun, reply).new_task_id


def schedule_run_id(reply: Any) -> str:
    """The task's id in ``POST /v1/schedules/{id}/run``'s reply."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return decode_reply(contract.ScheduleRun, reply).task_id


def retried(reply: Any) -> dict[str, str]:
    """{old task id: new task id} of ``POST /v1/tasks:retry`` with task ids."""
    from conveyor.contract import replies as contract  # loaded by the first reply

    return {r.task_id: r.new_task_id for r in decode_reply(contract.RetriedList, reply).retried}
