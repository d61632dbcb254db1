"""``/v1/schedules``: parse -> validate (cron, zone, task template) -> UpsertSchedule.

Validation is complete here, so the machine's own check only ever refuses records that did not
come through the gateway. The task template is a task body of ``POST /v1/tasks`` without the
fields a firing sets itself: ``delay_ms``/``run_at`` (the firing time is the schedule's) and
``idempotency_key`` (each firing's key is ``<schedule id>@<scheduled ms>``).
"""

from __future__ import annotations

from typing import Any, TypeVar

from conveyor.frozen import frozen
from conveyor.schemas import codec
from conveyor.schemas.types import CatchUp, OverlapPolicy, Schedule, UpsertSchedule
from conveyor.streams import cron
from conveyor.streams.gateway.fields import Fields, describe, invalid
from conveyor.streams.gateway.validation import EnqueueRequest, parse_task

_FIELDS = frozenset({"schedule_id", "cron", "timezone", "task", "overlap", "catch_up"})
_PER_FIRING = ("delay_ms", "run_at", "idempotency_key")
DEFAULT_TIMEZONE = "UTC"
E = TypeVar("E", OverlapPolicy, CatchUp)


@frozen(kw_only=True)
class ScheduleRequest:
    schedule_id: str
    cron: str
    timezone: str
    overlap: OverlapPolicy
    catch_up: CatchUp
    task: EnqueueRequest


def parse_schedule(body: Any) -> ScheduleRequest:
    f = Fields(body, "", _FIELDS)
    expression = f.req_str("cron", bytes_max=cron.EXPRESSION_BYTES_MAX)
    timezone = f.opt_str("timezone") or DEFAULT_TIMEZONE
    problem = cron.problem(expression, timezone)
    if problem is not None:
        raise invalid("timezone" if problem.startswith("unknown timezone") else "cron", problem)
    task_body = f.raw("task")
    if not isinstance(task_body, dict):
        raise invalid("task", f"must be an object (a task body), got {describe(task_body)}")
    for name in _PER_FIRING:
        if task_body.get(name) is not None:  # null is absent, as everywhere
            raise invalid(f"task.{name}", "is set by each firing; leave it out of the template")
    return ScheduleRequest(
        schedule_id=f.req_name("schedule_id"),
        cron=expression,
        timezone=timezone,
        overlap=_choice(f, "overlap", OverlapPolicy, OverlapPolicy.ALLOW),
        catch_up=_choice(f, "catch_up", CatchUp, CatchUp.ONCE),
        task=parse_task(task_body, "task"),
    )


def _choice(f: Fields, name: str, enum: type[E], default: E) -> E:
    value = f.raw(name)
    if value is None:
        return default
    allowed = [m.value.lower() for m in enum]
    if not isinstance(value, str) or value.lower() not in allowed:
        raise invalid(name, f"must be one of {', '.join(allowed)}, got {describe(value)}")
    return enum(value.upper())


def to_record(req: ScheduleRequest, *, tenant: str, template: bytes) -> UpsertSchedule:
    return UpsertSchedule(
        tenant=tenant,
        schedule_id=req.schedule_id,
        cron=req.cron,
        timezone=req.timezone,
        template=template,
        overlap=req.overlap,
        catch_up=req.catch_up,
    )


def schedule_json(row: Schedule, *, payload: Any) -> dict[str, Any]:
    spec = codec.TASK_SPEC.decode(row.template)
    return {
        "schedule_id": row.schedule_id,
        "cron": row.cron,
        "timezone": row.timezone,
        "overlap": row.overlap.lower(),
        "catch_up": row.catch_up.lower(),
        "task": {
            "task_type": spec.task_type,
            "app": spec.app,
            "queue": spec.queue,
            "priority": spec.priority,
            "payload": payload,
        },
        "next_fire_ms": row.next_fire_ms,
        "last_fire_ms": row.last_fire_ms,
        "last_task_id": row.last_task_id,
        "fired": row.fired,
        "skipped": row.skipped,
        "paused": row.paused,
        "created_ms": row.created_ms,
        "updated_ms": row.updated_ms,
    }
