"""The machine's refusals of client records as HTTP errors: one entry per ``Refusal``.

Rule: an item the machine refused changed nothing, so its request never answers 200 or 201;
it answers the error below, naming the field at fault. A reason the machine gains without an
entry here fails ``tests/integration/test_enqueue_refusals.py`` (it walks ``Refusal``).
"""

from __future__ import annotations

from collections.abc import Callable

from conveyor.errors import Conflict, ContractError, NotFound
from conveyor.streams.machine import Refusal, Reply


def _not_a_spec(reply: Reply, field: str) -> ContractError:
    return ContractError(
        f"{field}: the partition could not read the task record; send the task again",
        field=field,
    )


def _invalid_spec(reply: Reply, field: str) -> ContractError:
    return ContractError(
        f"{field}: the task cannot be stored: {reply.reason}; fix that field and send it again",
        field=field,
    )


def _conflict(reply: Reply, field: str) -> ContractError:
    differing = ", ".join(reply.differing) or "its request"
    return Conflict(
        f"{field}: idempotency key already names task {reply.twin_id}, which differs in "
        f"{differing}; send the same request to get that task back, or use a new key for a "
        "different task",
        field=field,
    )


def _unknown_task(reply: Reply, field: str) -> ContractError:
    return NotFound(f"no task {reply.task_id}", field=field)


def _finished(reply: Reply, field: str) -> ContractError:
    return Conflict(f"{reply.reason}: it takes no more events", field=field)


def _events_full(reply: Reply, field: str) -> ContractError:
    return Conflict(
        f"{reply.reason}: wait until the workflow takes some, or send another name", field=field
    )


def _invalid_schedule(reply: Reply, field: str) -> ContractError:
    return ContractError(f"schedule refused: {reply.reason}", field=field)


def _unknown_schedule(reply: Reply, field: str) -> ContractError:
    return NotFound(f"no schedule {reply.task_id!r}", field=field)


ERRORS: dict[Refusal, Callable[[Reply, str], ContractError]] = {
    Refusal.NOT_A_SPEC: _not_a_spec,
    Refusal.INVALID_SPEC: _invalid_spec,
    Refusal.CONFLICT: _conflict,
    Refusal.UNKNOWN_TASK: _unknown_task,
    Refusal.FINISHED: _finished,
    Refusal.EVENTS_FULL: _events_full,
    Refusal.INVALID_SCHEDULE: _invalid_schedule,
    Refusal.UNKNOWN_SCHEDULE: _unknown_schedule,
}


def refused(reply: Reply, field: str) -> ContractError:
    """The error a client gets for a refused item; ``field`` is where the request holds what
    the refusal is about (``idempotency_key`` for a conflict, ``task_id``, ``cron``...)."""
    if reply.refusal is None:  # a refusal the machine gave no reason code for: our bug
        raise RuntimeError(f"item {reply.index} refused without a reason code: {reply.reason}")
    return ERRORS[reply.refusal](reply, field)


def field_of(refusal: Refusal | None, path: str) -> str:
    """The field of an enqueue body (at ``path``: "" or "tasks[3]") a refusal is about."""
    if refusal != Refusal.CONFLICT:
        return path or "task"  # the task as a whole
    return f"{path}.idempotency_key" if path else "idempotency_key"
