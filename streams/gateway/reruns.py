"""Running again: ``POST /v1/tasks/{id}/rerun`` and ``POST /v1/schedules/{id}/run``.

Rule 1 (a re-run is a new task): it is enqueued with the spec the old task was enqueued with
(app, type, queue, priority, payload, retry policy, timeouts, resume policy), runs now, has
its own attempt budget and run key (its steps run afresh), and leaves the old task as it was.
Any finished task can be re-run, any number of times; one still running is a 409 (cancel it
first). ``POST /v1/tasks:retry`` is the other thing: it takes a FAILED task out of the dead
letters, once, and keeps its run key, so the retry replays the steps it had committed.
Rule 2 (run now): a schedule's run is one firing, now: its task template enqueued like a
firing's (``machine/handlers/schedules.py`` rule 2: on the schedule's partition, through the
enqueue check every enqueue goes through). The schedule is left as it stands: its next
firing, counts and last task do not change, and its overlap policy does not apply (an
operator who asks for a run gets one).
Rule 3 (idempotency): both take ``{"idempotency_key": ...}``. The task is enqueued with the key
``rerun:<task id>:<key>`` or ``<schedule id>@run:<key>`` (never a firing's
``<schedule id>@<ms>``), on the partition of the task or of the schedule, so a resent
request meets the first one's key in the same partition and answers its task (200,
``created: false``) instead of running it twice. Without a key every request runs once more.
The dashboard and the CLI send a fresh key per click or command and reuse it when they resend.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from aiohttp import web

from conveyor.contract.replies import Rerun, ScheduleRun
from conveyor.errors import Conflict, InvariantError
from conveyor.schemas import codec
from conveyor.schemas.types import TERMINAL, Schedule, Task, TaskSpec
from conveyor.streams.gateway import routes
from conveyor.streams.gateway.contract import decode
from conveyor.streams.gateway.contract.decode import check_text
from conveyor.streams.gateway.contract.requests import RunKey
from conveyor.streams.gateway.validation import IDEMPOTENCY_KEY_BYTES_MAX
from conveyor.streams.routing import mint_task_id

RERUN_PREFIX = "rerun:"
RUN_INFIX = "@run:"
KEY_BYTES_MAX = IDEMPOTENCY_KEY_BYTES_MAX  # the client's part: as long as a task's key


def add_routes(app: web.Application) -> None:
    app.router.add_post("/v1/tasks/{task_id}/rerun", rerun)
    app.router.add_post("/v1/schedules/{schedule_id}/run", run_schedule)


def parse_run(body: Any) -> str | None:
    """The optional ``idempotency_key`` of a rerun or a schedule's run (rule 3)."""
    if body is None:
        return None
    key = decode.model(body, RunKey).idempotency_key
    check_text(key, "idempotency_key", KEY_BYTES_MAX)
    return key


async def rerun(request: web.Request) -> web.Response:
    """Rule 1."""
    gw, tenant = routes.context(request)
    task_id = request.match_info["task_id"]
    key = parse_run(await routes.read_body(request, optional=True))
    task = gw.find(tenant, task_id)
    partition = gw.node.partition_of(task_id)
    spec = rerun_spec(task, gw.node.tables(partition).spec(task_id), partition, key)
    reply = await gw.enqueue_spec(tenant, spec)
    body = Rerun(task_id=task_id, new_task_id=reply.task_id, created=reply.created)
    return routes.reply(body, 201 if reply.created else 200)


async def run_schedule(request: web.Request) -> web.Response:
    """Rule 2."""
    gw, tenant = routes.context(request)
    schedule_id = request.match_info["schedule_id"]
    key = parse_run(await routes.read_body(request, optional=True))
    row = gw.node.get_schedule(tenant, schedule_id)
    spec = run_spec(row, gw.node.partition_of_schedule(tenant, schedule_id), key)
    reply = await gw.enqueue_spec(tenant, spec)
    body = ScheduleRun(schedule_id=schedule_id, task_id=reply.task_id, created=reply.created)
    return routes.reply(body, 201 if reply.created else 200)


def rerun_spec(task: Task, spec: TaskSpec | None, partition: int, key: str | None) -> TaskSpec:
    """The spec of ``task``'s re-run (rule 1), on ``partition``: Conflict while it runs."""
    if task.status not in TERMINAL:
        raise Conflict(
            f"task {task.task_id} is {task.status.value}: only a finished task can be re-run "
            "(cancel it first)",
            field="task_id",
        )
    if spec is None:
        raise InvariantError(f"task {task.task_id} has no spec row")
    return dataclasses.replace(
        spec,
        task_id=mint_task_id(partition),
        idempotency_key=None if key is None else f"{RERUN_PREFIX}{task.task_id}:{key}",
        run_at_ms=None,
        delay_ms=None,
        run_key=None,
    )


def run_spec(row: Schedule, partition: int, key: str | None) -> TaskSpec:
    """The spec of one run of the schedule ``row`` now (rule 2), on its ``partition``."""
    template: TaskSpec = codec.TASK_SPEC.decode(row.template)
    return dataclasses.replace(
        template,
        task_id=mint_task_id(partition),
        tenant=row.tenant,
        run_at_ms=None,
        delay_ms=None,
        idempotency_key=None if key is None else f"{row.schedule_id}{RUN_INFIX}{key}",
    )
