"""No acknowledgement without a task: whatever the machine refuses answers a 4xx.

Two walks over ``Refusal`` (every reason the machine gives for refusing an item of a client
record), so a reason added without an HTTP mapping fails here:
- through the node: each refusal provoked in a real (in-memory) node, its reply mapped by
  ``gateway/refusals.py`` to a 4xx naming a field;
- through HTTP: the request that provokes each against a real ``conveyor node`` answers 4xx
  and creates nothing (the gateway's validation catches most before a record is written).
Then the defects this module was written for: a ``run_at`` before 1970 acknowledged with a
task id that never existed, and a key reused with other options answering the old task.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gateway import KEY_A, KEY_B, NodeProcess, call, write_keys

from conveyor.schemas import codec
from conveyor.schemas.types import (
    CatchUp,
    EnqueueTasks,
    OverlapPolicy,
    TaskSpec,
    UpsertSchedule,
)
from conveyor.streams.gateway.errors import classify
from conveyor.streams.gateway.refusals import refused
from conveyor.streams.machine import Refusal, Reply
from conveyor.streams.machine.handlers.events import EVENTS_KEPT_MAX
from conveyor.streams.node import Node
from conveyor.streams.routing import mint_task_id

pytestmark = pytest.mark.timeout(180)

APP = "refusals"
TYPES = ["echo", "flow"]
BAD_YEARS = ["0001-01-01T00:00:00Z", "1000-06-01T12:00:00Z", "1900-01-01T00:00:00Z"]
BAD_YEARS += ["1969-12-31T23:59:59.999Z", "9999-12-31T23:59:59-01:00"]


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home: Path = tmp_path_factory.mktemp("refusals") / "home"
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start()
    for key in (KEY_A, KEY_B):
        body = {"agent_id": "setup", "app": APP, "version": "1", "task_types": TYPES}
        assert call(proc.base, "POST", "/worker/register", body, key=key)[0] == 200
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def task(**fields: Any) -> dict[str, Any]:
    return {"task_type": "echo", "app": APP, "payload": {"n": 1}, **fields}


def tasks_of(node: NodeProcess, key: str = KEY_A) -> list[str]:
    ids, cursor = [], None
    while True:
        path = "/v1/tasks?limit=1000" + (f"&cursor={cursor}" if cursor else "")
        status, page = call(node.base, "GET", path, key=key)
        assert status == 200, page
        ids += [t["task_id"] for t in page["tasks"]]
        cursor = page["next_cursor"]
        if cursor is None:
            return sorted(ids)


def assert_error(status: int, body: Any, expected: int, field: str | None = None) -> None:
    assert status == expected, body
    error = body["error"]
    assert error["message"] and error["code"] != "internal", body
    if field is not None:
        assert error["field"] == field, body


# --- the walk through the node --------------------------------------------------------------

Provoke = Callable[[Node], Awaitable[Reply]]
TENANT = "t"


def spec(node: Node, **fields: Any) -> TaskSpec:
    base: dict[str, Any] = {"tenant": TENANT, "app": APP, "task_type": "echo", "payload": b"1"}
    return TaskSpec(task_id=mint_task_id(0), **{**base, **fields})


async def _not_a_spec(node: Node) -> Reply:
    (reply,) = await node.processors[0].submit(EnqueueTasks(tasks=[b"\xff\xfe"]), "k")
    return reply


async def _invalid_spec(node: Node) -> Reply:
    (reply,) = await node.enqueue([spec(node, run_at_ms=-62_135_596_800_000)])
    return reply


async def _conflict(node: Node) -> Reply:
    await node.enqueue([spec(node, idempotency_key="k")])
    (reply,) = await node.enqueue([spec(node, idempotency_key="k", queue="other")])
    return reply


async def _unknown_task(node: Node) -> Reply:
    return await node.cancel(TENANT, "0000" + "e" * 28, "test")


async def _finished(node: Node) -> Reply:
    first = spec(node)
    await node.enqueue([first])
    await node.cancel(TENANT, first.task_id, "test")
    return await node.send_event(TENANT, first.task_id, "go", b"1")


async def _events_full(node: Node) -> Reply:
    first = spec(node)
    await node.enqueue([first])
    for _ in range(EVENTS_KEPT_MAX):
        assert (await node.send_event(TENANT, first.task_id, "go", b"1")).ok
    return await node.send_event(TENANT, first.task_id, "go", b"1")


async def _invalid_schedule(node: Node) -> Reply:
    record = UpsertSchedule(
        tenant=TENANT,
        schedule_id="s",
        cron="61 * * * *",
        timezone="UTC",
        template=codec.TASK_SPEC.encode(spec(node)),
        overlap=OverlapPolicy.ALLOW,
        catch_up=CatchUp.ONCE,
    )
    return await node.upsert_schedule(record)


async def _unknown_schedule(node: Node) -> Reply:
    return await node.delete_schedule(TENANT, "nope")


THROUGH_NODE: dict[Refusal, Provoke] = {
    Refusal.NOT_A_SPEC: _not_a_spec,
    Refusal.INVALID_SPEC: _invalid_spec,
    Refusal.CONFLICT: _conflict,
    Refusal.UNKNOWN_TASK: _unknown_task,
    Refusal.FINISHED: _finished,
    Refusal.EVENTS_FULL: _events_full,
    Refusal.INVALID_SCHEDULE: _invalid_schedule,
    Refusal.UNKNOWN_SCHEDULE: _unknown_schedule,
}


@pytest.mark.parametrize("refusal", list(Refusal))
def test_every_refusal_of_the_machine_maps_to_a_4xx(refusal: Refusal) -> None:
    assert refusal in THROUGH_NODE, f"no test provokes {refusal}: add one, and its HTTP mapping"

    async def main() -> Reply:
        node = Node.in_memory(1)
        await node.start()
        try:
            return await THROUGH_NODE[refusal](node)
        finally:
            await node.stop()

    reply = asyncio.run(main())
    assert (reply.ok, reply.refusal, reply.created) == (False, refusal, False), reply
    error = refused(reply, "the_field")
    known = classify(error)
    assert known is not None and 400 <= known[0] < 500, (refusal, known)
    assert error.field == "the_field" and str(error), error


# --- the walk through HTTP ------------------------------------------------------------------


def _http_not_a_spec(node: NodeProcess) -> tuple[int, Any, int]:
    # No request produces it: the gateway encodes every spec it appends. The nearest a client
    # gets is a task that is not an object.
    status, body = call(node.base, "POST", "/v1/tasks", ["not", "a", "task"])
    return status, body, 400


def _http_invalid_spec(node: NodeProcess) -> tuple[int, Any, int]:
    status, body = call(node.base, "POST", "/v1/tasks", task(run_at="0001-01-01T00:00:00Z"))
    return status, body, 400


def _http_conflict(node: NodeProcess) -> tuple[int, Any, int]:
    assert call(node.base, "POST", "/v1/tasks", task(idempotency_key="walk"))[0] == 201
    status, body = call(node.base, "POST", "/v1/tasks", task(idempotency_key="walk", priority=3))
    return status, body, 409


def _http_unknown_task(node: NodeProcess) -> tuple[int, Any, int]:
    status, body = call(node.base, "POST", f"/v1/tasks/{'0000' + 'e' * 28}/cancel")
    return status, body, 404


def _canceled(node: NodeProcess, key: str = KEY_A) -> str:
    status, reply = call(node.base, "POST", "/v1/tasks", task(task_type="flow"), key=key)
    assert status == 201, reply
    assert call(node.base, "POST", f"/v1/tasks/{reply['task_id']}/cancel", key=key)[0] == 200
    return str(reply["task_id"])


def _http_finished(node: NodeProcess) -> tuple[int, Any, int]:
    path = f"/v1/workflows/{_canceled(node)}/events"
    status, body = call(node.base, "POST", path, {"name": "go", "payload": 1})
    return status, body, 409


def _http_events_full(node: NodeProcess) -> tuple[int, Any, int]:
    status, reply = call(node.base, "POST", "/v1/tasks", task(task_type="flow"))
    assert status == 201, reply
    path = f"/v1/workflows/{reply['task_id']}/events"
    for _ in range(EVENTS_KEPT_MAX):
        assert call(node.base, "POST", path, {"name": "go"})[0] == 200
    status, body = call(node.base, "POST", path, {"name": "go"})
    return status, body, 409


def _http_invalid_schedule(node: NodeProcess) -> tuple[int, Any, int]:
    body = {"schedule_id": "bad", "cron": "61 * * * *", "task": {"task_type": "echo", "app": APP}}
    status, reply = call(node.base, "POST", "/v1/schedules", body)
    return status, reply, 400


def _http_unknown_schedule(node: NodeProcess) -> tuple[int, Any, int]:
    status, body = call(node.base, "DELETE", "/v1/schedules/nope")
    return status, body, 404


THROUGH_HTTP: dict[Refusal, Callable[[NodeProcess], tuple[int, Any, int]]] = {
    Refusal.NOT_A_SPEC: _http_not_a_spec,
    Refusal.INVALID_SPEC: _http_invalid_spec,
    Refusal.CONFLICT: _http_conflict,
    Refusal.UNKNOWN_TASK: _http_unknown_task,
    Refusal.FINISHED: _http_finished,
    Refusal.EVENTS_FULL: _http_events_full,
    Refusal.INVALID_SCHEDULE: _http_invalid_schedule,
    Refusal.UNKNOWN_SCHEDULE: _http_unknown_schedule,
}


@pytest.mark.parametrize("refusal", list(Refusal))
def test_every_refusal_of_the_machine_answers_4xx_over_http(
    node: NodeProcess, refusal: Refusal
) -> None:
    assert refusal in THROUGH_HTTP, f"no request provokes {refusal}: add one"
    status, body, expected = THROUGH_HTTP[refusal](node)
    assert_error(status, body, expected)


# --- run_at out of range --------------------------------------------------------------------


@pytest.mark.parametrize("run_at", BAD_YEARS)
def test_a_run_at_outside_the_epoch_is_a_400_naming_the_range(
    node: NodeProcess, run_at: str
) -> None:
    before = tasks_of(node, KEY_B)
    key = f"old-{run_at}"
    for _ in range(2):  # the same key again: still refused, never a new id
        status, body = call(
            node.base, "POST", "/v1/tasks", task(run_at=run_at, idempotency_key=key), key=KEY_B
        )
        assert_error(status, body, 400, "run_at")
        assert "1970-01-01T00:00:00Z" in body["error"]["message"], body
    batch = {"tasks": [task(), task(run_at=run_at)]}
    status, body = call(node.base, "POST", "/v1/tasks:batch", batch, key=KEY_B)
    assert_error(status, body, 400, "tasks[1].run_at")
    assert tasks_of(node, KEY_B) == before  # nothing was created


def test_the_first_and_last_valid_instants_are_accepted(node: NodeProcess) -> None:
    for run_at in ("1970-01-01T00:00:00Z", "9999-12-31T23:59:59.999Z"):
        status, reply = call(node.base, "POST", "/v1/tasks", task(run_at=run_at))
        assert status == 201, reply
        status, got = call(node.base, "GET", f"/v1/tasks/{reply['task_id']}")
        assert status == 200 and got["status"] == "ENQUEUED", got


# --- same key, other options ----------------------------------------------------------------

OTHER_OPTIONS = [
    ({"queue": "slow"}, "queue"),
    ({"priority": 7}, "priority"),
    ({"delay_ms": 60_000}, "delay_ms"),
    ({"run_at": "2100-01-01T00:00:00Z"}, "run_at"),
    ({"retry": {"attempts_max": 2}}, "retry.attempts_max"),
    ({"timeouts": {"start_to_close_ms": 1000}}, "timeouts.start_to_close_ms"),
    ({"cancel_grace_ms": 5}, "cancel_grace_ms"),
    ({"payload": {"n": 2}}, "payload"),
]


@pytest.mark.parametrize(("options", "named"), OTHER_OPTIONS)
def test_a_key_reused_with_other_options_is_a_409_naming_them(
    node: NodeProcess, options: dict[str, Any], named: str
) -> None:
    key = f"opts-{named}"
    status, first = call(node.base, "POST", "/v1/tasks", task(idempotency_key=key))
    assert status == 201, first
    before = tasks_of(node)
    status, body = call(node.base, "POST", "/v1/tasks", task(idempotency_key=key, **options))
    assert_error(status, body, 409, "idempotency_key")
    assert named in body["error"]["message"] and first["task_id"] in body["error"]["message"]
    assert tasks_of(node) == before
    # The same request again still gets its task back.
    status, again = call(node.base, "POST", "/v1/tasks", task(idempotency_key=key))
    assert (status, again["task_id"], again["created"]) == (200, first["task_id"], False)


def test_a_delayed_keyed_enqueue_resent_later_is_the_same_task(node: NodeProcess) -> None:
    body = task(idempotency_key="delayed", delay_ms=600_000)
    status, first = call(node.base, "POST", "/v1/tasks", body)
    assert status == 201, first
    status, again = call(node.base, "POST", "/v1/tasks", body)  # a later now, the same delay
    assert (status, again["task_id"]) == (200, first["task_id"]), again


def test_one_key_twice_in_a_batch_with_other_options_is_a_409(node: NodeProcess) -> None:
    before = tasks_of(node)
    batch = {"tasks": [task(idempotency_key="b"), task(idempotency_key="b", queue="q2")]}
    status, body = call(node.base, "POST", "/v1/tasks:batch", batch)
    assert_error(status, body, 409, "tasks[1].idempotency_key")
    assert "queue" in json.dumps(body) and tasks_of(node) == before
