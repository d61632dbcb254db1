"""``/v1/schedules``: parse -> validate (cron, zone, task template) -> UpsertSchedule.

Validation is complete here, so the machine's own check only ever refuses records that did not
come through the gateway. The task template is a task body of ``POST /v1/tasks`` without the
fields a firing sets itself: ``delay_ms``/``run_at`` (the firing time is the schedule's) and
``idempotency_key`` (each firing's key is ``<schedule id>@<scheduled ms>``).
"""

from __future__ import annotations

from typing import Any, cast

from conveyor.contract import replies as out
from conveyor.contract.replies import CatchUpMode, Overlap
from conveyor.errors import ContractError
from conveyor.frozen import frozen
from conveyor.schemas import codec
from conveyor.schemas.types import CatchUp, OverlapPolicy, Schedule, UpsertSchedule
from conveyor.streams import cron
from conveyor.streams.gateway.contract import decode
from conveyor.streams.gateway.contract import requests as req
from conveyor.streams.gateway.fields import invalid
from conveyor.streams.gateway.validation import EnqueueRequest, task_request

_PER_FIRING = ("delay_ms", "run_at", "idempotency_key")
DEFAULT_TIMEZONE = "UTC"


@frozen(kw_only=True)
class ScheduleRequest:
    schedule_id: str
    cron: str
    timezone: str
    overlap: OverlapPolicy
    catch_up: CatchUp
    task: EnqueueRequest


def parse_schedule(body: Any) -> ScheduleRequest:
    """The ``ScheduleRequest`` model, then what no type states: the expression has a date in
    the zone (``cron.problem``), the template sets nothing a firing sets (``TaskTemplate``'s
    rules), the template's own rules (``validation.parse_task``)."""
    if isinstance(body, dict):  # the policies read in any case, as they always did
        for name in ("overlap", "catch_up"):
            if isinstance(body.get(name), str):
                body[name] = body[name].lower()
    try:
        m = decode.model(body, req.ScheduleRequest)
    except ContractError as exc:
        raise _cron_refusal(exc, body) from None
    timezone = m.timezone or DEFAULT_TIMEZONE
    problem = cron.problem(m.cron, timezone)
    if problem is not None:
        raise invalid("timezone" if problem.startswith("unknown timezone") else "cron", problem)
    for name in _PER_FIRING:
        if getattr(m.task, name) is not None:  # null is absent, as everywhere
            raise invalid(f"task.{name}", "is set by each firing; leave it out of the template")
    return ScheduleRequest(
        schedule_id=m.schedule_id,
        cron=m.cron,
        timezone=timezone,
        overlap=OverlapPolicy((m.overlap or OverlapPolicy.ALLOW).upper()),
        catch_up=CatchUp((m.catch_up or CatchUp.ONCE).upper()),
        task=task_request(m.task, "task"),
    )


def _cron_refusal(exc: ContractError, body: dict[str, Any]) -> ContractError:
    """A ``cron`` the pattern refuses, in ``cron.problem``'s words (which field, what it
    takes): the pattern's description can only say what an expression looks like."""
    expression = body.get("cron") if exc.field == "cron" else None
    problem = cron.problem(expression, DEFAULT_TIMEZONE) if isinstance(expression, str) else None
    return exc if problem is None else invalid("cron", problem)


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


def schedule_json(row: Schedule, *, payload: Any) -> out.Schedule:
    spec = codec.TASK_SPEC.decode(row.template)
    return out.Schedule(
        schedule_id=row.schedule_id,
        cron=row.cron,
        timezone=row.timezone,
        overlap=cast("Overlap", row.overlap.lower()),
        catch_up=cast("CatchUpMode", row.catch_up.lower()),
        task=out.ScheduledTask(
            task_type=spec.task_type,
            app=spec.app,
            queue=spec.queue,
            priority=spec.priority,
            payload=payload,  # free-form JSON: the model's Json (Any)
        ),
        next_fire_ms=row.next_fire_ms,
        last_fire_ms=row.last_fire_ms,
        last_task_id=row.last_task_id,
        fired=row.fired,
        skipped=row.skipped,
        paused=row.paused,
        created_ms=row.created_ms,
        updated_ms=row.updated_ms,
    )
