"""``Client``: the synchronous HTTP client, ``TaskHandle``, and the default client.

Transport retries (connection errors, 503, 429) resend the SAME body, so an enqueue keeps the
idempotency key minted for it in ``wire.enqueue_body``: a lost ack never duplicates a task.
A request that is not idempotent (``retry_failed``) is resent only when it never left
(connect errors) or the server said 503 or 429 (a rejected request changes nothing); the
server's Retry-After sets the pause.
"""

from __future__ import annotations

import json
import os
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, Unpack, overload
from urllib.parse import quote

import httpx

from conveyor.app import TaskType
from conveyor.codecs import (
    PayloadCodec,
    decoded_info,
    encode_bodies,
    encode_schedule,
    encode_value,
)
from conveyor.errors import ContractError, TaskFailed, TransientError
from conveyor.wire import (
    AttemptInfo,
    BulkFilter,
    Enqueue,
    EnqueueOptions,
    OperationInfo,
    ScheduleInfo,
    ScheduleList,
    ScheduleOptions,
    TaskInfo,
    TaskPage,
    canceled_status,
    chunks,
    delivery_list,
    enqueue_body,
    enqueued,
    enqueued_batch,
    error_from_reply,
    event_status,
    events_page,
    new_webhook,
    payload_search,
    query,
    rerun_id,
    retried,
    schedule_body,
    schedule_list,
    schedule_run_id,
    task_info,
    webhook_list,
    workflow_history_page,
    workflow_reply,
)

if TYPE_CHECKING:  # the models load with the first reply, not with ``import conveyor``
    from conveyor.contract import replies as contract

P = ParamSpec("P")
R = TypeVar("R")
Decode = Callable[[Any], Any]
DEFAULT_URL = "http://127.0.0.1:7400"
RETRIED_STATUSES = frozenset({429, 503})  # refused without an effect: send it again later
WAIT_SLICE_MS = 30_000  # one long-poll of handle.result(); the HTTP timeout sits above it


def backoff_s(attempt: int, retry_after_ms: int | None = None) -> float:
    """Full-jitter backoff for transport retries; the server's Retry-After wins."""
    if retry_after_ms is not None:
        return retry_after_ms / 1000.0
    return random.uniform(0.0, min(2.0, 0.1 * 2**attempt))


def retry_after_ms(headers: Mapping[str, str]) -> int | None:
    raw = headers.get("retry-after")
    try:
        return None if raw is None else int(float(raw) * 1000)
    except ValueError:
        return None


def parse(status: int, content: bytes, headers: Mapping[str, str]) -> Any:
    """The JSON of a 2xx reply; any other status raises the mapped ConveyorError."""
    try:
        body = json.loads(content) if content else {}
    except ValueError:
        body = None
    if 200 <= status < 300:
        return body
    raise error_from_reply(status, body, retry_after_ms(headers))


def items_of(items: Iterable[Enqueue | tuple[TaskType[Any, Any] | str, Any]]) -> list[Enqueue]:
    return [it if isinstance(it, Enqueue) else Enqueue(it[0], it[1]) for it in items]


def outcome(info: TaskInfo, timeout: float | None) -> Any:
    """What ``handle.result()`` returns or raises for ``info``."""
    if info.status == "SUCCEEDED":
        return info.result
    if info.finished:
        err = info.error
        error_class, message = (err.error_class, err.message) if err else (None, None)
        raise TaskFailed(info.task_id, info.status, error_class, message)
    raise TimeoutError(f"task {info.task_id} is still {info.status} after {timeout}s")


class Backend(Protocol):
    """What a handle needs from its client (HTTP, or the in-process testing engine)."""

    def get(self, task_id: str) -> TaskInfo: ...

    def wait(self, task_id: str, timeout: float | None) -> TaskInfo: ...

    def cancel(self, task_id: str) -> str: ...


def decoder_of(task: TaskType[Any, Any] | str) -> Decode | None:
    """How a handle decodes the result of ``task``: by its handler's return annotation."""
    return task.decode_result if isinstance(task, TaskType) else None


class TaskHandle(Generic[R]):
    """An enqueued task. Typed by its task: ``client.enqueue(add, (1, 2))`` of
    ``def add(x: int, y: int) -> int`` is a ``TaskHandle[int]``, and ``result()`` decodes the
    result to the handler's return annotation (a dataclass comes back a dataclass)."""

    def __init__(
        self, backend: Backend, task_id: str, created: bool = True, decode: Decode | None = None
    ) -> None:
        self._backend = backend
        self.id = task_id
        self.created = created  # False: the idempotency key matched an earlier enqueue
        self._decode = decode

    def __repr__(self) -> str:
        return f"<TaskHandle {self.id}>"

    def get(self) -> TaskInfo:
        """The task as the node describes it now (payload and result decoded)."""
        return self._backend.get(self.id)

    def status(self) -> str:
        """The task's status now: ENQUEUED, LEASED, ..., SUCCEEDED, FAILED, CANCELED."""
        return self._backend.get(self.id).status

    def cancel(self) -> str:
        """Ask the platform to cancel the task; returns its status after the request."""
        return self._backend.cancel(self.id)

    def result(self, timeout: float | None = None) -> R:
        """The handler's return value once the task SUCCEEDED; ``TaskFailed`` if it ended any
        other way; ``TimeoutError`` if it has not ended within ``timeout`` seconds."""
        value: R = decoded(outcome(self._backend.wait(self.id, timeout), timeout), self._decode)
        return value


def decoded(value: Any, decode: Decode | None) -> Any:
    return value if decode is None else decode(value)


class Client:
    """Talks to a Conveyor gateway. ``url``/``api_key`` default to $CONVEYOR_URL and
    $CONVEYOR_API_KEY; ``app`` is the default app of tasks named by string; ``codec`` (a
    ``conveyor.codecs.PayloadCodec``) encodes the payloads it sends and decodes those it
    reads."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        app: str | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        transport: httpx.BaseTransport | None = None,
        codec: PayloadCodec | None = None,
    ) -> None:
        self.url = url or os.environ.get("CONVEYOR_URL", DEFAULT_URL)
        self.codec = codec  # payloads leave encoded and come back decoded (conveyor.codecs)
        key = api_key or os.environ.get("CONVEYOR_API_KEY") or local_dev_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.app = app
        self.retries = retries
        self._timeout = timeout
        self._http = httpx.Client(
            base_url=self.url, headers=headers, timeout=timeout, transport=transport
        )

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the HTTP connections (``with Client(...)`` does it)."""
        self._http.close()

    def _send(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: dict[str, Any] | None = None,
        idempotent: bool = True,
        timeout: float | None = None,
    ) -> Any:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(
                    method, path, json=body, params=params, timeout=timeout or self._timeout
                )
            except httpx.TransportError as exc:
                if last or not (idempotent or isinstance(exc, httpx.ConnectError)):
                    raise TransientError(f"{method} {path}: {exc!r}") from exc
                time.sleep(backoff_s(attempt))
                continue
            if response.status_code in RETRIED_STATUSES and not last:
                time.sleep(backoff_s(attempt, retry_after_ms(response.headers)))
                continue
            return parse(response.status_code, response.content, response.headers)
        raise AssertionError("unreachable")

    # -- enqueue ----------------------------------------------------------------------------

    @overload
    def enqueue(
        self,
        task: TaskType[P, Coroutine[Any, Any, R]],
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> TaskHandle[R]: ...

    @overload
    def enqueue(
        self, task: TaskType[P, R], payload: Any = None, **options: Unpack[EnqueueOptions]
    ) -> TaskHandle[R]: ...

    @overload
    def enqueue(
        self, task: str, payload: Any = None, **options: Unpack[EnqueueOptions]
    ) -> TaskHandle[Any]: ...

    def enqueue(
        self,
        task: TaskType[Any, Any] | str,
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> TaskHandle[Any]:
        """Enqueue one task of ``task`` (a ``TaskType`` or its name) with ``payload``;
        ``options`` as ``conveyor.Enqueue`` takes them (delay, run_at, queue, priority,
        idempotency_key, ...)."""
        req = Enqueue(task, payload, **options)
        [body] = encode_bodies(self.codec, [enqueue_body(req, self.app)], [task])
        reply = self._send("POST", "/v1/tasks", body=body)
        r = enqueued(reply)
        return TaskHandle(self, r.task_id, r.created, decoder_of(task))

    def enqueue_many(
        self, items: Iterable[Enqueue | tuple[TaskType[Any, Any] | str, Any]]
    ) -> list[TaskHandle[Any]]:
        """Enqueue many tasks in ``/v1/tasks:batch`` calls of up to 1000; handles in order."""
        reqs = items_of(items)
        bodies = [enqueue_body(it, self.app) for it in reqs]
        bodies = encode_bodies(self.codec, bodies, [it.task for it in reqs])
        decoders = iter([decoder_of(it.task) for it in reqs])
        handles: list[TaskHandle[Any]] = []
        for chunk in chunks(bodies):
            reply = self._send("POST", "/v1/tasks:batch", body={"tasks": chunk})
            for r in enqueued_batch(reply):
                handles.append(TaskHandle(self, r.task_id, r.created, next(decoders)))
        return handles

    # -- reads and control ------------------------------------------------------------------

    def get(self, task_id: str) -> TaskInfo:
        """``GET /v1/tasks/{id}``: the task with its payload, result and attempts."""
        reply = self._send("GET", f"/v1/tasks/{task_id}")
        return decoded_info(self.codec, task_info(reply))

    def attempt_log(self, attempt: AttemptInfo) -> str:
        """What ``attempt`` printed (its tail), or "" when it left no output."""
        if attempt.log_url is None:
            return ""
        return str(self._send("GET", attempt.log_url)["log"])

    def wait(self, task_id: str, timeout: float | None) -> TaskInfo:
        """The task once it is terminal, or as it is when ``timeout`` seconds have passed."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left_ms = WAIT_SLICE_MS
            if deadline is not None:
                left_ms = min(left_ms, max(0, int((deadline - time.monotonic()) * 1000)))
            reply = self._send(
                "GET",
                f"/v1/tasks/{task_id}",
                params={"wait_ms": left_ms},
                timeout=left_ms / 1000 + self._timeout,
            )
            info = decoded_info(self.codec, task_info(reply))
            if info.finished or (deadline is not None and time.monotonic() >= deadline):
                return info

    def cancel(self, task_id: str) -> str:
        """Cancel a task (``NotFound`` if there is none); returns its status after the request."""
        return canceled_status(self._send("POST", f"/v1/tasks/{task_id}/cancel"))

    def send_event(self, workflow_id: str, name: str, payload: Any = None) -> str:
        """Send event ``name`` to a workflow: it wakes the workflow's ``ctx.wait_for_event
        (name)``, or is kept for its next such wait. Returns the workflow's status."""
        body = {"name": name, "payload": encode_value(self.codec, payload)}
        return event_status(self._send("POST", f"/v1/workflows/{workflow_id}/events", body=body))

    def rerun(self, task_id: str) -> str:
        """Enqueue a finished task again as a new task: the same type, payload and options,
        fresh attempts and steps (``retry_failed`` instead keeps a dead letter's steps).
        Returns the new task's id; a resend of this call (a timeout) reuses its key and gets
        the same task. ``Conflict`` while the task still runs."""
        body = {"idempotency_key": os.urandom(16).hex()}
        reply = self._send("POST", f"/v1/tasks/{quote(task_id, safe='')}/rerun", body=body)
        return rerun_id(reply)

    def get_workflow(self, workflow_id: str) -> contract.Workflow:
        """``GET /v1/workflows/{id}`` as ``conveyor.contract.replies.Workflow``: the workflow
        (``.workflow``, its task), its steps with their states (``.steps``), and each parallel
        step with its children (``.parallel[0].counts``: children by status). A workflow is
        enqueued like any task."""
        return workflow_reply(self.codec, self._send("GET", f"/v1/workflows/{workflow_id}"))

    def workflow_history(
        self, workflow_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> contract.WorkflowHistory:
        """One page of the workflow's step rows with their values, decoded by the client's
        codec chain, as ``conveyor.contract.replies.WorkflowHistory`` (``.steps[0].value``);
        pass ``.next_cursor`` on."""
        params = query(limit=limit, cursor=cursor)
        reply = self._send("GET", f"/v1/workflows/{workflow_id}/history", params=params)
        return workflow_history_page(self.codec, reply)

    def list(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        task_type: str | None = None,
        since_ms: int | None = None,
        limit: int = 100,
        cursor: str | None = None,
        payload: Mapping[str, Any] | None = None,
    ) -> TaskPage:
        """One page of the tenant's tasks, newest first, filtered; pass ``next_cursor`` on.

        ``payload={"customer": "acme"}`` lists the tasks whose payload has every one of these
        top-level fields with that value (compared as JSON: ``3`` is not ``"3"``). Only what
        the query snapshot keeps is searchable: the top-level scalars of an inline JSON object
        payload (at most 16 fields, 2 KiB); not an encoded (codec), blob-stored or hidden one."""
        params = query(
            status=status,
            queue=queue,
            task_type=task_type,
            since_ms=since_ms,
            limit=limit,
            cursor=cursor,
        )
        params.update(payload_search(payload))
        return TaskPage.from_json(self._send("GET", "/v1/tasks", params=params))

    def retry_failed(
        self,
        task_ids: Iterable[str] | None = None,
        *,
        task_type: str | None = None,
        queue: str | None = None,
        since_ms: int | None = None,
        limit: int = 1000,
    ) -> dict[str, str]:
        """Re-enqueue FAILED tasks as new tasks now: {old task id: new task id}. Without ids,
        the first ``limit`` (at most 1000) FAILED tasks the filters list (``since_ms``: created
        at or after); for more, ``retry_where`` runs a bulk operation on the server."""
        if task_ids is None:
            page = self.list(
                status="FAILED",
                task_type=task_type,
                queue=queue,
                since_ms=since_ms,
                limit=min(limit, 1000),
            )
            task_ids = [t.task_id for t in page.tasks]
        ids = list(task_ids)
        if not ids:
            return {}
        reply = self._send("POST", "/v1/tasks:retry", body={"task_ids": ids}, idempotent=False)
        return retried(reply)

    def retry_where(self, *, limit: int | None = None, **flt: Unpack[BulkFilter]) -> OperationInfo:
        """Start a bulk retry of every FAILED task matching ``flt`` on the server; it runs in
        the background (``operation`` reports progress) and survives node restarts."""
        body = bulk_body(dict(flt), limit)
        reply = self._send("POST", "/v1/tasks:retry", body=body, idempotent=False)
        return OperationInfo.from_json(reply)

    def cancel_where(
        self, *, reason: str | None = None, limit: int | None = None, **flt: Unpack[BulkFilter]
    ) -> OperationInfo:
        """Start a bulk cancel of every unfinished task matching ``flt`` (see ``retry_where``)."""
        body = bulk_body(dict(flt), limit, reason)
        reply = self._send("POST", "/v1/tasks:cancel", body=body, idempotent=False)
        return OperationInfo.from_json(reply)

    def operation(self, operation_id: str) -> OperationInfo:
        """A bulk operation (``retry_where``, ``cancel_where``) and its progress."""
        path = f"/v1/operations/{quote(operation_id, safe='')}"
        return OperationInfo.from_json(self._send("GET", path))

    # -- schedules --------------------------------------------------------------------------

    def schedule(
        self,
        task: TaskType[Any, Any] | str,
        payload: Any = None,
        **options: Unpack[ScheduleOptions],
    ) -> ScheduleInfo:
        """Run ``task`` with ``payload`` on a cron schedule (five fields, read in ``timezone``);
        creates or replaces the schedule ``schedule_id`` (default: the task type's name)."""
        body = schedule_body(task, payload, self.app, options)
        body = encode_schedule(self.codec, body, task)
        return ScheduleInfo.from_json(self._send("POST", "/v1/schedules", body=body))

    def schedules(self) -> ScheduleList:
        """The tenant's schedules."""
        reply = self._send("GET", "/v1/schedules")
        return schedule_list(reply)

    def unschedule(self, schedule_id: str) -> None:
        """Delete a schedule; ``NotFound`` if there is none. Tasks it enqueued are untouched."""
        self._send("DELETE", f"/v1/schedules/{quote(schedule_id, safe='')}")

    def pause_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Stop firing (the schedule and its history stay); ``NotFound`` if there is none."""
        path = f"/v1/schedules/{quote(schedule_id, safe='')}/pause"
        return ScheduleInfo.from_json(self._send("POST", path))

    def resume_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Fire again from the next occurrence after now; occurrences that passed while paused
        never fire. ``NotFound`` if there is none."""
        path = f"/v1/schedules/{quote(schedule_id, safe='')}/resume"
        return ScheduleInfo.from_json(self._send("POST", path))

    def run_schedule(self, schedule_id: str) -> str:
        """Run a schedule's task now, once (the schedule's next firing stays as it was).
        Returns the task's id; a resend of this call reuses its key and gets the same task."""
        body = {"idempotency_key": os.urandom(16).hex()}
        path = f"/v1/schedules/{quote(schedule_id, safe='')}/run"
        return schedule_run_id(self._send("POST", path, body=body))

    # -- the events stream and webhooks -----------------------------------------------------

    def events(
        self, after: str | None = None, *, wait_s: float = 0.0, limit: int = 100, **filters: str
    ) -> contract.Events:
        """``GET /v1/events`` as a long poll, as ``conveyor.contract.replies.Events``: the
        tenant's task events after ``after`` (none: from the newest on) in ``.events``; pass
        ``.cursor`` on. ``filters``: state, task_type, queue, type (comma-separated values)."""
        params = query(after=after, wait_ms=int(wait_s * 1000), limit=limit, **filters)
        timeout = wait_s + self._timeout
        return events_page(self._send("GET", "/v1/events", params=params, timeout=timeout))

    def create_webhook(
        self, url: str, events: Iterable[str], task_types: Iterable[str] | None = None
    ) -> contract.NewWebhook:
        """Register a webhook, as ``conveyor.contract.replies.NewWebhook``: its ``.secret``
        (shown once) verifies its signatures."""
        types = None if task_types is None else [*task_types]
        body = {"url": url, "events": [*events], "task_types": types}
        return new_webhook(self._send("POST", "/v1/webhooks", body=body, idempotent=False))

    def webhooks(self) -> tuple[contract.Webhook, ...]:
        """The tenant's webhooks, as ``conveyor.contract.replies.Webhook`` (their secrets are
        shown only when created)."""
        return webhook_list(self._send("GET", "/v1/webhooks"))

    def delete_webhook(self, webhook_id: str) -> None:
        """Delete a webhook; its pending deliveries are not made."""
        self._send("DELETE", f"/v1/webhooks/{quote(webhook_id, safe='')}")

    def webhook_deliveries(
        self, webhook_id: str, *, status: str | None = None, limit: int = 50
    ) -> tuple[contract.Delivery, ...]:
        """A webhook's deliveries, the most recently changed first, as
        ``conveyor.contract.replies.Delivery``."""
        path = f"/v1/webhooks/{quote(webhook_id, safe='')}/deliveries"
        return delivery_list(self._send("GET", path, params=query(status=status, limit=limit)))

    def redeliver(self, webhook_id: str, delivery_id: str) -> None:
        """Send a delivery again, with the same webhook-id."""
        hook, delivery = quote(webhook_id, safe=""), quote(delivery_id, safe="")
        self._send("POST", f"/v1/webhooks/{hook}/deliveries/{delivery}:redeliver")


def bulk_body(flt: dict[str, Any], limit: int | None, reason: str | None = None) -> dict[str, Any]:
    """The body of a bulk retry or cancel. Sent with ``idempotent=False``: a resent POST
    would start a second operation."""
    body: dict[str, Any] = {"filter": flt}
    if limit is not None:
        body["limit"] = limit
    if reason is not None:
        body["reason"] = reason
    return body


# --- the default client, used by ``task.enqueue(...)`` ------------------------------------------


class EnqueueClient(Protocol):
    """``Client`` or the testing engine's client."""

    @property
    def enqueue(self) -> Callable[..., Any]: ...


_default: EnqueueClient | None = None


def set_default_client(client: EnqueueClient | None) -> EnqueueClient | None:
    """Make ``client`` the one ``task.enqueue()`` uses; returns the previous one."""
    global _default
    previous, _default = _default, client
    return previous


def local_dev_key() -> str | None:
    """The key ``conveyor dev`` created in $CONVEYOR_HOME (default ./.conveyor), if any: lets
    a script on the developer's machine talk to the local dev node without configuration."""
    path = Path(os.environ.get("CONVEYOR_HOME", ".conveyor")) / "keys.json"
    try:
        keys = json.loads(path.read_text())["keys"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not isinstance(keys, dict):
        return None
    # Not an agent key: it can only speak the worker protocol (see ``conveyor keys list``).
    return next((k for k, e in keys.items() if not _is_agent_entry(e)), None)


def _is_agent_entry(entry: Any) -> bool:
    return isinstance(entry, dict) and entry.get("role") == "agent"


def default_client() -> EnqueueClient:
    global _default
    if _default is None:
        if "CONVEYOR_URL" not in os.environ:
            raise ContractError(
                "task.enqueue() needs a default client: call conveyor.set_default_client("
                "conveyor.Client(url, api_key)) or set CONVEYOR_URL and CONVEYOR_API_KEY"
            )
        client = Client()
        _default = client
        return client
    return _default
