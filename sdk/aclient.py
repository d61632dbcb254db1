"""``AsyncClient``: the asyncio twin of ``Client`` (same bodies, same retry rule)."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Coroutine, Iterable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, Unpack, overload
from urllib.parse import quote

from conveyor.ahttp import NotSent, Session, TransportError
from conveyor.app import TaskType
from conveyor.client import (
    DEFAULT_URL,
    RETRIED_STATUSES,
    WAIT_SLICE_MS,
    Decode,
    backoff_s,
    bulk_body,
    decoded,
    decoder_of,
    items_of,
    local_dev_key,
    outcome,
    parse,
    retry_after_ms,
)
from conveyor.codecs import (
    PayloadCodec,
    decoded_info,
    encode_bodies,
    encode_schedule,
    encode_value,
)
from conveyor.errors import TransientError
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


class AsyncTaskHandle(Generic[R]):
    """``TaskHandle`` for ``AsyncClient``: ``await handle.result()`` is typed the same way."""

    def __init__(
        self, client: AsyncClient, task_id: str, created: bool = True, decode: Decode | None = None
    ) -> None:
        self._client = client
        self.id = task_id
        self.created = created
        self._decode = decode

    def __repr__(self) -> str:
        return f"<AsyncTaskHandle {self.id}>"

    async def get(self) -> TaskInfo:
        """The task as the node describes it now (see ``TaskHandle.get``)."""
        return await self._client.get(self.id)

    async def status(self) -> str:
        """The task's status now."""
        return (await self._client.get(self.id)).status

    async def cancel(self) -> str:
        """Ask the platform to cancel the task; returns its status after the request."""
        return await self._client.cancel(self.id)

    async def result(self, timeout: float | None = None) -> R:
        """``TaskHandle.result``, awaited."""
        info = await self._client.wait(self.id, timeout)
        value: R = decoded(outcome(info, timeout), self._decode)
        return value


class AsyncClient:
    """``Client``'s methods as coroutines, on aiohttp: ``async with AsyncClient(url, key) as c``."""

    def __init__(
        self,
        url: str | None = None,
        api_key: str | None = None,
        *,
        app: str | None = None,
        timeout: float = 30.0,
        retries: int = 5,
        codec: PayloadCodec | None = None,
    ) -> None:
        self.url = url or os.environ.get("CONVEYOR_URL", DEFAULT_URL)
        self.codec = codec  # see Client
        key = api_key or os.environ.get("CONVEYOR_API_KEY") or local_dev_key()
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.app = app
        self.retries = retries
        self._http = Session(self.url, headers, timeout)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the HTTP session (``async with`` does it)."""
        await self._http.close()

    async def _send(
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
                reply = await self._http.request(
                    method, path, body=body, params=params, timeout=timeout
                )
            except TransportError as exc:
                if last or not (idempotent or isinstance(exc, NotSent)):
                    raise TransientError(f"{method} {path}: {exc}") from exc
                await asyncio.sleep(backoff_s(attempt))
                continue
            if reply.status in RETRIED_STATUSES and not last:
                await asyncio.sleep(backoff_s(attempt, retry_after_ms(reply.headers)))
                continue
            return parse(reply.status, reply.content, reply.headers)
        raise AssertionError("unreachable")

    @overload
    async def enqueue(
        self,
        task: TaskType[P, Coroutine[Any, Any, R]],
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> AsyncTaskHandle[R]: ...

    @overload
    async def enqueue(
        self, task: TaskType[P, R], payload: Any = None, **options: Unpack[EnqueueOptions]
    ) -> AsyncTaskHandle[R]: ...

    @overload
    async def enqueue(
        self, task: str, payload: Any = None, **options: Unpack[EnqueueOptions]
    ) -> AsyncTaskHandle[Any]: ...

    async def enqueue(
        self,
        task: TaskType[Any, Any] | str,
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> AsyncTaskHandle[Any]:
        """Enqueue one task (see ``Client.enqueue``)."""
        req = Enqueue(task, payload, **options)
        [body] = encode_bodies(self.codec, [enqueue_body(req, self.app)], [task])
        reply = await self._send("POST", "/v1/tasks", body=body)
        r = enqueued(reply)
        return AsyncTaskHandle(self, r.task_id, r.created, decoder_of(task))

    async def enqueue_many(
        self, items: Iterable[Enqueue | tuple[TaskType[Any, Any] | str, Any]]
    ) -> list[AsyncTaskHandle[Any]]:
        """Enqueue many tasks in batches of up to 1000; handles in order."""
        reqs = items_of(items)
        bodies = [enqueue_body(it, self.app) for it in reqs]
        bodies = encode_bodies(self.codec, bodies, [it.task for it in reqs])
        decoders = iter([decoder_of(it.task) for it in reqs])
        handles: list[AsyncTaskHandle[Any]] = []
        for chunk in chunks(bodies):
            reply = await self._send("POST", "/v1/tasks:batch", body={"tasks": chunk})
            for r in enqueued_batch(reply):
                handles.append(AsyncTaskHandle(self, r.task_id, r.created, next(decoders)))
        return handles

    async def get(self, task_id: str) -> TaskInfo:
        """``GET /v1/tasks/{id}`` (see ``Client.get``)."""
        reply = await self._send("GET", f"/v1/tasks/{task_id}")
        return decoded_info(self.codec, task_info(reply))

    async def attempt_log(self, attempt: AttemptInfo) -> str:
        """What ``attempt`` printed (its tail), or "" when it left no output."""
        if attempt.log_url is None:
            return ""
        return str((await self._send("GET", attempt.log_url))["log"])

    async def wait(self, task_id: str, timeout: float | None) -> TaskInfo:
        """The task once it is terminal, or as it is after ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left_ms = WAIT_SLICE_MS
            if deadline is not None:
                left_ms = min(left_ms, max(0, int((deadline - time.monotonic()) * 1000)))
            reply = await self._send(
                "GET",
                f"/v1/tasks/{task_id}",
                params={"wait_ms": left_ms},
                timeout=left_ms / 1000 + self._http.timeout,
            )
            info = decoded_info(self.codec, task_info(reply))
            if info.finished or (deadline is not None and time.monotonic() >= deadline):
                return info

    async def cancel(self, task_id: str) -> str:
        """Cancel a task; returns its status after the request."""
        return canceled_status(await self._send("POST", f"/v1/tasks/{task_id}/cancel"))

    async def send_event(self, workflow_id: str, name: str, payload: Any = None) -> str:
        """Send event ``name`` to a workflow (see ``Client.send_event``)."""
        body = {"name": name, "payload": encode_value(self.codec, payload)}
        reply = await self._send("POST", f"/v1/workflows/{workflow_id}/events", body=body)
        return event_status(reply)

    async def rerun(self, task_id: str) -> str:
        """Enqueue a finished task again as a new task (see ``Client.rerun``)."""
        body = {"idempotency_key": os.urandom(16).hex()}
        path = f"/v1/tasks/{quote(task_id, safe='')}/rerun"
        return rerun_id(await self._send("POST", path, body=body))

    async def get_workflow(self, workflow_id: str) -> contract.Workflow:
        """``GET /v1/workflows/{id}`` as ``conveyor.contract.replies.Workflow`` (see
        ``Client.get_workflow``)."""
        reply = await self._send("GET", f"/v1/workflows/{workflow_id}")
        return workflow_reply(self.codec, reply)

    async def workflow_history(
        self, workflow_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> contract.WorkflowHistory:
        """One page of the workflow's step rows as ``conveyor.contract.replies.WorkflowHistory``
        (see ``Client.workflow_history``)."""
        params = query(limit=limit, cursor=cursor)
        path = f"/v1/workflows/{workflow_id}/history"
        return workflow_history_page(self.codec, await self._send("GET", path, params=params))

    async def list(
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
        """One page of the tenant's tasks (see ``Client.list``)."""
        params = query(
            status=status,
            queue=queue,
            task_type=task_type,
            since_ms=since_ms,
            limit=limit,
            cursor=cursor,
        )
        params.update(payload_search(payload))
        return TaskPage.from_json(await self._send("GET", "/v1/tasks", params=params))

    async def retry_failed(
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
            page = await self.list(
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
        reply = await self._send(
            "POST", "/v1/tasks:retry", body={"task_ids": ids}, idempotent=False
        )
        return retried(reply)

    async def retry_where(
        self, *, limit: int | None = None, **flt: Unpack[BulkFilter]
    ) -> OperationInfo:
        """Start a bulk retry of every FAILED task matching ``flt`` on the server; it runs in
        the background (``operation`` reports progress) and survives node restarts."""
        body = bulk_body(dict(flt), limit)
        reply = await self._send("POST", "/v1/tasks:retry", body=body, idempotent=False)
        return OperationInfo.from_json(reply)

    async def cancel_where(
        self, *, reason: str | None = None, limit: int | None = None, **flt: Unpack[BulkFilter]
    ) -> OperationInfo:
        """Start a bulk cancel of every unfinished task matching ``flt`` (see ``retry_where``)."""
        body = bulk_body(dict(flt), limit, reason)
        reply = await self._send("POST", "/v1/tasks:cancel", body=body, idempotent=False)
        return OperationInfo.from_json(reply)

    async def operation(self, operation_id: str) -> OperationInfo:
        """A bulk operation and its progress (see ``Client.operation``)."""
        path = f"/v1/operations/{quote(operation_id, safe='')}"
        return OperationInfo.from_json(await self._send("GET", path))

    # -- schedules --------------------------------------------------------------------------

    async def schedule(
        self,
        task: TaskType[Any, Any] | str,
        payload: Any = None,
        **options: Unpack[ScheduleOptions],
    ) -> ScheduleInfo:
        """Run ``task`` with ``payload`` on a cron schedule (five fields, read in ``timezone``);
        creates or replaces the schedule ``schedule_id`` (default: the task type's name)."""
        body = schedule_body(task, payload, self.app, options)
        body = encode_schedule(self.codec, body, task)
        return ScheduleInfo.from_json(await self._send("POST", "/v1/schedules", body=body))

    async def schedules(self) -> ScheduleList:
        """The tenant's schedules."""
        reply = await self._send("GET", "/v1/schedules")
        return schedule_list(reply)

    async def unschedule(self, schedule_id: str) -> None:
        """Delete a schedule; ``NotFound`` if there is none. Tasks it enqueued are untouched."""
        await self._send("DELETE", f"/v1/schedules/{quote(schedule_id, safe='')}")

    async def pause_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Stop firing (the schedule and its history stay); ``NotFound`` if there is none."""
        path = f"/v1/schedules/{quote(schedule_id, safe='')}/pause"
        return ScheduleInfo.from_json(await self._send("POST", path))

    async def resume_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Fire again from the next occurrence after now; occurrences that passed while paused
        never fire. ``NotFound`` if there is none."""
        path = f"/v1/schedules/{quote(schedule_id, safe='')}/resume"
        return ScheduleInfo.from_json(await self._send("POST", path))

    async def run_schedule(self, schedule_id: str) -> str:
        """Run a schedule's task now, once (see ``Client.run_schedule``)."""
        body = {"idempotency_key": os.urandom(16).hex()}
        path = f"/v1/schedules/{quote(schedule_id, safe='')}/run"
        return schedule_run_id(await self._send("POST", path, body=body))

    # -- the events stream and webhooks -----------------------------------------------------

    async def events(
        self, after: str | None = None, *, wait_s: float = 0.0, limit: int = 100, **filters: str
    ) -> contract.Events:
        """``GET /v1/events`` as a long poll, as ``conveyor.contract.replies.Events`` (see
        ``Client.events``)."""
        params = query(after=after, wait_ms=int(wait_s * 1000), limit=limit, **filters)
        timeout = wait_s + self._http.timeout
        return events_page(await self._send("GET", "/v1/events", params=params, timeout=timeout))

    async def create_webhook(
        self, url: str, events: Iterable[str], task_types: Iterable[str] | None = None
    ) -> contract.NewWebhook:
        """Register a webhook, as ``conveyor.contract.replies.NewWebhook``: its ``.secret``
        (shown once) verifies its signatures."""
        types = None if task_types is None else [*task_types]
        body = {"url": url, "events": [*events], "task_types": types}
        return new_webhook(await self._send("POST", "/v1/webhooks", body=body, idempotent=False))

    async def webhooks(self) -> tuple[contract.Webhook, ...]:
        """The tenant's webhooks, as ``conveyor.contract.replies.Webhook``."""
        return webhook_list(await self._send("GET", "/v1/webhooks"))

    async def delete_webhook(self, webhook_id: str) -> None:
        """Delete a webhook."""
        await self._send("DELETE", f"/v1/webhooks/{quote(webhook_id, safe='')}")

    async def webhook_deliveries(
        self, webhook_id: str, *, status: str | None = None, limit: int = 50
    ) -> tuple[contract.Delivery, ...]:
        """A webhook's deliveries, the most recently changed first, as
        ``conveyor.contract.replies.Delivery``."""
        path = f"/v1/webhooks/{quote(webhook_id, safe='')}/deliveries"
        reply = await self._send("GET", path, params=query(status=status, limit=limit))
        return delivery_list(reply)

    async def redeliver(self, webhook_id: str, delivery_id: str) -> None:
        """Send a delivery again, with the same webhook-id."""
        hook, delivery = quote(webhook_id, safe=""), quote(delivery_id, safe="")
        await self._send("POST", f"/v1/webhooks/{hook}/deliveries/{delivery}:redeliver")
