"""The in-process side of ``conveyor.testing``: wire bodies to a ``Node`` and back, without HTTP.

``NodeWorkerAPI`` is the ``WorkerAPI`` of the host agent over a Node; ``spec_from_body`` and
``task_info`` do what the gateway does with enqueue bodies and task reads. Payloads, results
and checkpoints are stored as compact JSON bytes (the gateway stores them the same way).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from conveyor.agents.worker_api import (
    CheckpointItem,
    CompletionItem,
    ItemResult,
    LeaseOffer,
    StepItem,
    trace_context_of,
)
from conveyor.errors import ContractError
from conveyor.schemas import codec
from conveyor.schemas.types import (
    Checkpoint,
    Completion,
    FanOut,
    Outcome,
    ParallelMode,
    SleepStep,
    StepOp,
    StepRow,
    StepWrite,
    Task,
    TaskSpec,
    WaitStep,
)
from conveyor.streams.gateway.refusals import field_of, refused
from conveyor.streams.gateway.worker_requests import bad_fan_out
from conveyor.streams.machine import Reply
from conveyor.streams.node import Node
from conveyor.streams.routing import mint_task_id, partition_for_key
from conveyor.wire import AttemptInfo, ErrorInfo, TaskInfo

# Wire names of the retry policy, the same in TaskSpec.
_RETRY_FIELDS = (
    "attempts_max",
    "backoff_base_ms",
    "backoff_factor",
    "backoff_cap_ms",
    "non_retryable",
)


def to_bytes(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def from_bytes(raw: bytes | None) -> Any:
    return None if not raw else json.loads(raw)


def step_bytes(value: Any) -> bytes:
    """A step's stored form: compact JSON, non-ASCII kept (what the SDK measured)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def step_json(row: StepRow) -> dict[str, Any]:
    """A step row as the worker protocol carries it in a lease."""
    return {
        "identity": row.identity,
        "position": row.position,
        "claims": row.claims,
        "committed": row.value is not None,
        "value": from_bytes(row.value),
        "wake_at_ms": row.wake_at_ms,
    }


def wait_step(raw: dict[str, Any] | None) -> WaitStep | None:
    if raw is None:
        return None
    return WaitStep(
        identity=str(raw["identity"]),
        position=int(raw["position"]),
        name=str(raw["name"]),
        timeout_ms=raw.get("timeout_ms"),
    )


def sleep_step(raw: dict[str, Any] | None) -> SleepStep | None:
    if raw is None:
        return None
    return SleepStep(
        identity=str(raw["identity"]),
        position=int(raw["position"]),
        sleep_ms=raw.get("sleep_ms"),
        wake_at_ms=raw.get("wake_at_ms"),
    )


class UnknownTaskType(ContractError):
    code = "unknown_task_type"


def spec_from_body(
    body: dict[str, Any], *, tenant: str, partitions: int, now_ms: int, known: dict[str, set[str]]
) -> TaskSpec:
    """The TaskSpec an enqueue body stands for, its id minted on its key's partition."""
    app, task_type = str(body["app"]), str(body["task_type"])
    if task_type not in known.get(app, set()):
        raise UnknownTaskType(
            f"app {app!r} has no registered task type {task_type!r}; "
            f"known: {sorted(known.get(app, set()))}",
            field="task_type",
        )
    key = str(body["idempotency_key"])
    extra: dict[str, Any] = {}
    retry = body.get("retry") or {}
    for name in _RETRY_FIELDS:
        if name in retry:
            extra[name] = retry[name]
    for name, value in (body.get("timeouts") or {}).items():
        extra[name] = value
    if "cancel_grace_ms" in body:
        extra["cancel_grace_ms"] = body["cancel_grace_ms"]
    if "resume" in body:
        extra["resume"] = str(body["resume"])
    if body.get("trace_context") is not None:
        extra["trace_context"] = json.dumps(body["trace_context"], separators=(",", ":"))
    return TaskSpec(
        task_id=mint_task_id(partition_for_key(tenant, key, partitions)),
        tenant=tenant,
        app=app,
        task_type=task_type,
        queue=str(body.get("queue", "default")),
        priority=int(body.get("priority", 0)),
        payload=to_bytes(body.get("payload")),
        run_at_ms=_run_at_ms(body, now_ms),
        delay_ms=int(body["delay_ms"]) if "delay_ms" in body else None,
        idempotency_key=key,
        **extra,
    )


def _run_at_ms(body: dict[str, Any], now_ms: int) -> int | None:
    if "delay_ms" in body:
        return now_ms + int(body["delay_ms"])
    if "run_at" in body:
        when = datetime.fromisoformat(str(body["run_at"]).replace("Z", "+00:00"))
        return int(when.timestamp() * 1000)
    return None


def check(reply: Reply) -> Reply:
    """The reply of an item the machine took; what it refused raises the error HTTP answers
    for it (a ``Conflict`` for an idempotency key that names another task, as a 409 does)."""
    if not reply.ok:
        raise refused(reply, field_of(reply.refusal, ""))
    return reply


def task_info(node: Node, task: Task, *, full: bool = True) -> TaskInfo:
    tables = node.tables(node.partition_of(task.task_id))
    attempts = []
    if full:
        attempts = [
            AttemptInfo(
                attempt=a.attempt,
                worker=a.agent_id,
                started_ms=a.started_ms,
                finished_ms=a.finished_ms,
                outcome=a.outcome,
                error=_error(a.error_class, a.error_message, a.error_stack),
            )
            for a in tables.attempts(task.task_id)
        ]
        if task.status == "SUCCEEDED" and all(a.attempt != task.attempt for a in attempts):
            # The machine keeps no row for the successful attempt: the task row describes it.
            attempts.append(
                AttemptInfo(
                    attempt=task.attempt,
                    worker=task.agent_id,
                    started_ms=task.leased_ms,
                    finished_ms=task.finished_ms,
                    outcome="SUCCEEDED",
                )
            )
    return TaskInfo(
        task_id=task.task_id,
        app=task.app,
        task_type=task.task_type,
        status=task.status.value,
        attempt=task.attempt,
        queue=task.queue,
        priority=task.priority,
        created_ms=task.created_ms,
        updated_ms=task.updated_ms,
        run_at_ms=task.run_at_ms,
        finished_ms=task.finished_ms,
        payload=from_bytes(tables.payload(task.task_id)) if full else None,
        result=from_bytes(task.result),
        checkpoint=from_bytes(task.checkpoint),
        error=_error(task.error_class, task.error_message, task.error_stack),
        cancel_requested=task.cancel_cause is not None,
        attempts=attempts,
    )


def _error(error_class: str | None, message: str | None, stack: str | None) -> ErrorInfo | None:
    if error_class is None:
        return None
    return ErrorInfo(error_class=error_class, message=message, stack=stack)


class NodeWorkerAPI:
    """``WorkerAPI`` straight onto a Node (same event loop), for one tenant."""

    def __init__(self, node: Node, *, tenant: str = "default") -> None:
        self.node = node
        self.tenant = tenant
        self.known: dict[str, set[str]] = {}  # app -> registered task types

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
        self.known.setdefault(app, set()).update(task_types)

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
        leases = await self.node.poll(
            agent_id=agent_id,
            app=app,
            tenants=[self.tenant],
            queues=list(queues),
            capacity=capacity,
            lease_ms=lease_ms,
            wait_ms=wait_ms,
            app_version=version,
            task_types=None if task_types is None else frozenset(task_types),
        )
        offers = []
        for lease in leases:
            spec = self.node.tables(lease.partition).spec(lease.task_id)
            offers.append(
                LeaseOffer(
                    task_id=lease.task_id,
                    lease_id=lease.lease_id,
                    attempt=lease.attempt,
                    task_type=lease.task_type,
                    payload=from_bytes(lease.payload),
                    checkpoint=from_bytes(lease.checkpoint),
                    lease_ms=lease.lease_ms,
                    start_to_close_ms=lease.start_to_close_ms,
                    cancel_grace_ms=None if spec is None else spec.cancel_grace_ms,
                    steps=[step_json(row) for row in lease.steps],
                    started_ms=lease.started_ms,
                    run_key=lease.run_key,
                    compensating=lease.compensating,
                    trace_context=trace_context_of(
                        None if lease.trace_context is None else json.loads(lease.trace_context)
                    ),
                )
            )
        return offers

    async def heartbeat(self, leases: Sequence[tuple[str, int]]) -> dict[str, str]:
        return {task_id: self.node.heartbeat(task_id, lease_id) for task_id, lease_id in leases}

    async def signals(self, *, agent_id: str, app: str, wait_ms: int) -> list[tuple[str, int]]:
        return await self.node.signals.wait(self.tenant, app, agent_id, wait_ms)

    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]:
        replies = await self.node.complete([self._completion(i) for i in items])
        return [_item_result(r) for r in replies]

    def _completion(self, i: CompletionItem) -> Completion:
        completion = Completion(
            task_id=i.task_id,
            lease_id=i.lease_id,
            outcome=Outcome(i.outcome),
            result=None if i.outcome != "SUCCEEDED" else to_bytes(i.result),
            error_class=i.error_class,
            error_message=i.error_message,
            error_stack=i.error_stack,
            retry_after_ms=i.retry_after_ms,
            sleep=sleep_step(i.sleep),
            wait=wait_step(i.wait) if i.outcome == Outcome.WAIT_EVENT else None,
        )
        if i.outcome != Outcome.FAN_OUT:
            return completion
        try:
            return dataclasses.replace(completion, fan_out=self._fan_out(i))
        except (ContractError, ValueError, KeyError, TypeError) as exc:  # as the gateway does
            return bad_fan_out(completion, str(exc))

    def _fan_out(self, i: CompletionItem) -> FanOut:
        """The children as the gateway would store them: checked enqueue bodies, in the
        workflow's app unless they name one, without ids or keys (the machine derives them)."""
        raw = i.fan_out or {}
        app = self.node.get(self.tenant, i.task_id).app
        children = []
        for body in raw.get("children") or []:
            body = {"app": app, **body, "idempotency_key": "-"}
            spec = spec_from_body(
                body,
                tenant=self.tenant,
                partitions=self.node.partitions,
                now_ms=self.node.clock.now_ms(),
                known=self.known,
            )
            spec = dataclasses.replace(spec, task_id="", idempotency_key=None)
            children.append(codec.TASK_SPEC.encode(spec))
        return FanOut(
            identity=str(raw.get("identity")),
            position=int(raw.get("position", -1)),
            mode=ParallelMode(str(raw.get("mode"))),
            children=children,
        )

    async def checkpoint(self, items: Sequence[CheckpointItem]) -> list[ItemResult]:
        replies = await self.node.checkpoint(
            [
                Checkpoint(task_id=i.task_id, lease_id=i.lease_id, value=to_bytes(i.value))
                for i in items
            ]
        )
        return [_item_result(r) for r in replies]

    async def steps(self, items: Sequence[StepItem]) -> list[ItemResult]:
        writes = [
            StepWrite(
                task_id=i.task_id,
                lease_id=i.lease_id,
                op=StepOp(i.op),
                identity=i.identity,
                position=i.position,
                value=step_bytes(i.value) if i.op == StepOp.COMMIT else None,
            )
            for i in items
        ]
        replies = await self.node.steps(writes)
        return [_item_result(r) for r in replies]

    async def close(self) -> None:
        return None


def _item_result(reply: Reply) -> ItemResult:
    return ItemResult(
        task_id=reply.task_id,
        ok=reply.ok,
        reason=reply.reason,
        retry_after_ms=reply.retry_after_ms,
    )
