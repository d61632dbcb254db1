"""The worker API a host agent speaks: register, poll, heartbeat, complete, checkpoint, steps.

``WorkerAPI`` is the protocol; ``HttpWorkerAPI`` speaks the gateway's ``/worker/*`` endpoints
(streams/gateway/PROTOCOL.md), and ``conveyor.testing``'s agent uses it too, on loopback.
Payloads, results and checkpoints cross this boundary as JSON values.

Rule 1: a call takes any number of items: ``HttpWorkerAPI`` sends them in parts of at most
``WORKER_ITEMS_MAX``, the most the gateway takes in one request (an agent with more than that
running heartbeats them all).
Rule 2: every call here is safe to resend. Poll is at-most-once by construction (leases granted to
a request whose reply is lost lapse and are retried by the platform), heartbeats and checkpoints
are idempotent, and a completion is fenced by its lease id, so a resent completion is rejected
as stale rather than applied twice. ``HttpWorkerAPI`` therefore retries transport errors and 503.
Rule 3: a call fails only with a ``ConveyorError``, which the agent's loops retry; a 2xx reply
that is not what the protocol says is a ``TransientError`` too. Anything else is a bug of the
agent, which stops it (``HostAgent.run``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from dataclasses import field
from typing import Any, Protocol, TypeVar

from conveyor.agents.sandbox import read_log_tail
from conveyor.ahttp import Reply, Session, TransportError
from conveyor.client import backoff_s, parse, retry_after_ms
from conveyor.errors import Forbidden, TransientError
from conveyor.frozen import frozen
from conveyor.schemas.limits import ATTEMPT_LOG_BYTES_MAX, WORKER_ITEMS_MAX

log = logging.getLogger("conveyor.agent")

T = TypeVar("T")

CONTINUE, CANCEL, LOST = "CONTINUE", "CANCEL", "LOST"
RETRY_AFTER_MAX_MS = 60_000  # a reply's retry_after_ms is capped at this
NODES_PATH = "/worker/nodes"
NODES_TIMEOUT_S = 5.0  # the nodes are asked again soon (agents/cluster.py)


@frozen(kw_only=True)
class LeaseOffer:
    task_id: str
    lease_id: int
    attempt: int
    task_type: str
    payload: Any
    checkpoint: Any
    lease_ms: int
    start_to_close_ms: int | None = None
    cancel_grace_ms: int | None = None  # not in the v1 poll reply yet: the task type's default
    # The task's recorded steps: {"identity", "position", "claims", "committed", "value",
    # "wake_at_ms"} each; the lease's grant time; the run key of step idempotency keys.
    steps: list[dict[str, Any]] = field(default_factory=list)
    started_ms: int = 0
    run_key: str | None = None
    compensating: bool = False  # a canceled workflow's attempt: run its compensations
    trace_context: dict[str, str] | None = None  # the enqueue's W3C trace context, if any


@frozen(kw_only=True)
class CompletionItem:
    task_id: str
    lease_id: int
    outcome: str  # SUCCEEDED | FAILED | FATAL | CANCELED
    result: Any = None
    error_class: str | None = None
    error_message: str | None = None
    error_stack: str | None = None
    retry_after_ms: int | None = None
    log_ref: str | None = None
    sleep: dict[str, Any] | None = None  # outcome SLEEP: identity, position, sleep_ms, wake_at_ms
    # outcome FAN_OUT: identity, position, mode, children (enqueue bodies)
    fan_out: dict[str, Any] | None = None
    wait: dict[str, Any] | None = None  # outcome WAIT_EVENT: identity, position, name, timeout_ms

    def to_json(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "task_id": self.task_id,
            "lease_id": self.lease_id,
            "outcome": self.outcome,
            "result": self.result,
            "retry_after_ms": self.retry_after_ms,
        }
        if self.error_class is not None:
            body["error"] = {
                "class": self.error_class,
                "message": self.error_message,
                "stack": self.error_stack,
            }
        if self.log_ref is not None and (log := read_log_tail(self.log_ref, ATTEMPT_LOG_BYTES_MAX)):
            body["log"] = log
        if self.sleep is not None:
            body["sleep"] = self.sleep
        if self.fan_out is not None:
            body["fan_out"] = self.fan_out
        if self.wait is not None:
            body["wait"] = self.wait
        return body


@frozen(kw_only=True)
class StepItem:
    """One step claim or commit, under the lease the agent holds for the task."""

    task_id: str
    lease_id: int
    op: str  # CLAIM | COMMIT
    identity: str
    position: int
    value: Any = None  # COMMIT: the step's value (JSON)

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "lease_id": self.lease_id,
            "op": self.op,
            "identity": self.identity,
            "position": self.position,
            "value": self.value,
        }


@frozen(kw_only=True)
class CheckpointItem:
    task_id: str
    lease_id: int
    value: Any


@frozen(kw_only=True)
class ItemResult:
    task_id: str
    ok: bool
    reason: str | None = None
    retry_after_ms: int | None = None  # not ok for now: send it again after this long


class WorkerAPI(Protocol):
    """What a host agent needs from the platform. Implementations MUST scope every call to
    the agent's credentials; they SHOULD retry transport failures themselves."""

    async def register(
        self,
        *,
        agent_id: str,
        app: str,
        version: str,
        task_types: Sequence[str],
        pinned: Sequence[str] = (),
        deploy: int | None = None,
        definitions: Sequence[dict[str, Any]] = (),
    ) -> None:
        """``pinned``: the workflow types whose resume policy is pinned (the default of an
        enqueue that does not say); ``deploy``: the deploy number, which orders versions (only
        a registration of a higher one than any before removes the types it does not serve);
        ``definitions``: each type's default options and Avro schemas
        (``conveyor.avro_schema.definitions``), which the node applies to enqueues of it."""
        ...

    async def poll(
        self,
        *,
        agent_id: str,
        app: str,
        queues: Sequence[str],
        capacity: int,
        wait_ms: int,
        lease_ms: int,
        version: str | None = None,
        task_types: Sequence[str] | None = None,
        open_breakers: Sequence[str] = (),
    ) -> list[LeaseOffer]:
        """``version``: the app version the agent serves (pinned workflows resume on it);
        ``task_types``: the types to take (None: any of the app's); ``open_breakers``: the types
        left out because their circuit breaker is open (for the node to show)."""
        ...

    async def heartbeat(self, leases: Sequence[tuple[str, int]]) -> dict[str, str]:
        """{task id: CONTINUE | CANCEL | LOST} for each (task id, lease id)."""
        ...

    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]: ...

    async def checkpoint(self, items: Sequence[CheckpointItem]) -> list[ItemResult]: ...

    async def steps(self, items: Sequence[StepItem]) -> list[ItemResult]:
        """Record step claims and commits; each result once durable (or refused)."""
        ...

    async def close(self) -> None: ...


def offer_from_json(data: dict[str, Any]) -> LeaseOffer:
    return LeaseOffer(
        task_id=str(data["task_id"]),
        lease_id=int(data["lease_id"]),
        attempt=int(data["attempt"]),
        task_type=str(data["task_type"]),
        payload=data.get("payload"),
        checkpoint=data.get("checkpoint"),
        lease_ms=int(data.get("lease_ms") or 30_000),
        start_to_close_ms=data.get("start_to_close_ms"),
        cancel_grace_ms=data.get("cancel_grace_ms"),
        steps=list(data.get("steps") or []),
        started_ms=int(data.get("started_ms") or 0),
        run_key=data.get("run_key"),
        compensating=bool(data.get("compensating")),
        trace_context=trace_context_of(data.get("trace_context")),
    )


def trace_context_of(raw: Any) -> dict[str, str] | None:
    """The lease's trace context, if it is an object of strings (tracing is best effort)."""
    if not isinstance(raw, dict):
        return None
    return {str(k): v for k, v in raw.items() if isinstance(v, str)}


def offers_from_json(reply: dict[str, Any]) -> list[LeaseOffer]:
    """The offers of a poll reply. One this agent cannot read is left to lapse (and logged):
    the others run, rather than all of them lapsing with it and coming back a lease later."""
    offers = []
    for item in reply.get("leases", []):
        try:
            offers.append(offer_from_json(item))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            task_id = item.get("task_id") if isinstance(item, dict) else None
            log.error("a lease offer of task %s this agent cannot read lapses: %r", task_id, exc)
    return offers


def actions_from_json(reply: dict[str, Any]) -> dict[str, str]:
    return {str(a["task_id"]): str(a["action"]) for a in reply.get("actions", [])}


def signals_from_json(reply: dict[str, Any]) -> list[tuple[str, int]]:
    return [(str(s["task_id"]), int(s["lease_id"])) for s in reply.get("signals", [])]


def warnings_from_json(reply: dict[str, Any]) -> list[str]:
    return [str(warning) for warning in reply.get("warnings", [])]


def _retry_after(value: Any) -> int | None:
    if value is None:
        return None
    return min(max(0, int(value)), RETRY_AFTER_MAX_MS)


def results_from_json(reply: dict[str, Any]) -> list[ItemResult]:
    return [
        ItemResult(
            task_id=str(r["task_id"]),
            ok=bool(r.get("ok")),
            reason=r.get("reason"),
            retry_after_ms=_retry_after(r.get("retry_after_ms")),
        )
        for r in reply.get("results", [])
    ]


class HttpWorkerAPI:
    """``WorkerAPI`` over HTTP. Transport errors and 503 are retried with jittered backoff for
    up to ``retry_for_s``; after that the call raises ``TransientError``.

    Completions carry the tail of what the attempt printed (``log``, read from the agent's
    local ``log_ref``), so the output is kept with the task wherever the agent runs.
    """

    def __init__(
        self,
        url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        retry_for_s: float = 60.0,
        direct: bool = False,
    ) -> None:
        """``direct``: never through the proxy the environment names (a server of this very
        process on the loopback, as ``conveyor.testing``'s)."""
        self.url = url
        self.retry_for_s = retry_for_s
        self._http = Session(url, {"Authorization": f"Bearer {api_key}"}, timeout)
        if direct:
            self._http.proxy = None

    async def _post(
        self,
        path: str,
        body: dict[str, Any],
        decode: Callable[[Any], T],
        timeout: float | None = None,
    ) -> T:
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.retry_for_s
        attempt = 0
        while True:
            try:
                reply = await self._http.request("POST", path, body=body, timeout=timeout)
                if reply.status != 503:
                    return _decoded(path, decode, _parse(path, reply))
                delay, why = backoff_s(attempt, retry_after_ms(reply.headers)), "503"
            except TransportError as exc:
                delay, why = backoff_s(attempt), str(exc)
            if loop.time() + delay > give_up:
                raise TransientError(f"POST {path}: gave up after {attempt + 1} tries: {why}")
            log.debug("POST %s failed (%s); retrying in %.2fs", path, why, delay)
            attempt += 1
            await asyncio.sleep(delay)

    async def register(
        self,
        *,
        agent_id: str,
        app: str,
        version: str,
        task_types: Sequence[str],
        pinned: Sequence[str] = (),
        deploy: int | None = None,
        definitions: Sequence[dict[str, Any]] = (),
    ) -> None:
        body: dict[str, Any] = {
            "agent_id": agent_id,
            "app": app,
            "version": version,
            "task_types": [*task_types],
            "pinned": [*pinned],
            "deploy": deploy,
        }
        if definitions:
            body["definitions"] = [*definitions]
        for warning in await self._post("/worker/register", body, warnings_from_json):
            log.warning("registering %s: %s", app, warning)  # a deploy removed handlers

    async def poll(
        self,
        *,
        agent_id: str,
        app: str,
        queues: Sequence[str],
        capacity: int,
        wait_ms: int,
        lease_ms: int,
        version: str | None = None,
        task_types: Sequence[str] | None = None,
        open_breakers: Sequence[str] = (),
    ) -> list[LeaseOffer]:
        body = {
            "agent_id": agent_id,
            "app": app,
            "version": version,
            "queues": [*queues],
            "capacity": capacity,
            "wait_ms": wait_ms,
            "lease_ms": lease_ms,
            "task_types": None if task_types is None else [*task_types],
            "open_breakers": [*open_breakers],
        }
        timeout = wait_ms / 1000 + self._http.timeout
        return await self._post("/worker/poll", body, offers_from_json, timeout=timeout)

    async def heartbeat(self, leases: Sequence[tuple[str, int]]) -> dict[str, str]:
        rows = [{"task_id": t, "lease_id": lease} for t, lease in leases]
        replies = await self._post_items("/worker/heartbeat", "leases", rows, actions_from_json)
        return {task_id: action for reply in replies for task_id, action in reply.items()}

    async def signals(self, *, agent_id: str, app: str, wait_ms: int) -> list[tuple[str, int]]:
        """The (task id, lease id) of leases this agent holds that were asked to stop, as soon
        as one is; [] after ``wait_ms`` (``agents/signals.py``)."""
        body = {"agent_id": agent_id, "app": app, "wait_ms": wait_ms}
        timeout = wait_ms / 1000 + self._http.timeout
        return await self._post("/worker/signals", body, signals_from_json, timeout=timeout)

    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]:
        rows = [item.to_json() for item in items]
        return _results(
            await self._post_items("/worker/complete", "completions", rows, results_from_json)
        )

    async def checkpoint(self, items: Sequence[CheckpointItem]) -> list[ItemResult]:
        rows = [{"task_id": i.task_id, "lease_id": i.lease_id, "value": i.value} for i in items]
        return _results(
            await self._post_items("/worker/checkpoint", "checkpoints", rows, results_from_json)
        )

    async def steps(self, items: Sequence[StepItem]) -> list[ItemResult]:
        rows = [item.to_json() for item in items]
        return _results(await self._post_items("/worker/steps", "steps", rows, results_from_json))

    async def _post_items(
        self, path: str, name: str, rows: list[dict[str, Any]], decode: Callable[[Any], T]
    ) -> list[T]:
        """POST ``{name: rows}`` in parts the gateway takes (rule 1); the replies, in order."""
        return [
            await self._post(path, {name: rows[lo : lo + WORKER_ITEMS_MAX]}, decode)
            for lo in range(0, len(rows), WORKER_ITEMS_MAX)
        ]

    async def nodes(self) -> list[str] | None:
        """The URLs of the nodes of the cluster that lead partitions (``GET /worker/nodes``,
        ``agents/cluster.py``); None from a node without the endpoint (it serves alone)."""
        try:
            reply = await self._http.request("GET", NODES_PATH, timeout=NODES_TIMEOUT_S)
        except TransportError as exc:
            raise TransientError(f"GET {NODES_PATH}: {exc}") from exc
        if reply.status == 404:
            return None
        body = _parse(NODES_PATH, reply)
        return _decoded(NODES_PATH, lambda b: [str(n["url"]) for n in b["nodes"]], body)

    async def close(self) -> None:
        await self._http.close()


def _parse(path: str, reply: Reply) -> Any:
    """The JSON of a 2xx reply. A 403 names the key as the cause: the node takes the key but
    not for this (a client key, or an agent key of another app or version), and no retry or
    restart can help until the agent runs with the right key."""
    try:
        return parse(reply.status, reply.content, reply.headers)
    except Forbidden as exc:
        raise Forbidden(
            f"POST {path}: the node refused this agent's API key ($CONVEYOR_API_KEY or "
            f"--api-key): {exc}",
            field=exc.field,
        ) from None


def _decoded(path: str, decode: Callable[[Any], T], body: Any) -> T:
    """A 2xx reply that is not what the protocol says (a proxy's page, a gateway of another
    version) fails the call as a transport error would (rule 3): the agent retries it later."""
    try:
        return decode(body)
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise TransientError(f"POST {path}: unexpected reply: {exc!r}") from exc


def _results(replies: list[list[ItemResult]]) -> list[ItemResult]:
    return [result for reply in replies for result in reply]
