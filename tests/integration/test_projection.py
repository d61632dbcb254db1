"""The Postgres projection against a real node (RocksDB, local logs) and a real PostgreSQL.

A random workload runs through ``Node`` while the projector follows the events stream and is
restarted mid-stream; afterwards every task row in Postgres must equal the processor's state,
a full replay must change nothing, and listing through the HTTP gateway must filter and page.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import secrets
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from conveyor.schemas.types import CatchUp, Completion, Outcome, OverlapPolicy, Task, TaskSpec
from conveyor.store import keys
from conveyor.streams.node import Node

asyncpg = pytest.importorskip("asyncpg")
pytestmark = pytest.mark.timeout(180)

TENANTS = ("alpha", "beta")
QUEUES = ("default", "critical")
TYPES = ("resize", "email", "report")
COMPARED = (
    "tenant", "app", "task_type", "queue", "status", "attempt", "created_ms", "updated_ms",
    "finished_ms", "error_class", "error_message", "version",
)  # fmt: skip


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"PostgreSQL is required under CI: {reason}")
    pytest.skip(f"PostgreSQL unavailable: {reason}")


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    try:
        import pgserver
    except ImportError as exc:
        _unavailable(f"pgserver not installed: {exc}")
    data = tmp_path_factory.mktemp("pg")
    try:
        server = pgserver.get_server(data, cleanup_mode="stop")
    except Exception as exc:
        _unavailable(str(exc))
    yield server
    server.cleanup()


@contextlib.asynccontextmanager
async def _fresh_pool(dsn: str) -> AsyncIterator[Any]:
    """A fresh database per test, migrated."""
    from conveyor.store.postgres import connect_pool

    name = f"t_{secrets.token_hex(6)}"
    admin = await asyncpg.connect(dsn)
    await admin.execute(f"CREATE DATABASE {name}")
    await admin.close()
    p = await connect_pool(dsn.replace("/postgres?", f"/{name}?"))
    try:
        yield p
    finally:
        await p.close()


@contextlib.asynccontextmanager
async def _node_and_pool(home: Path, dsn: str) -> AsyncIterator[tuple[Node, Any]]:
    n = await Node.open(home, partitions=4)
    await n.start()
    try:
        async with _fresh_pool(dsn) as p:
            yield n, p
    finally:
        await n.stop()


@pytest.fixture
def env(tmp_path: Path, pg_server: Any) -> tuple[Path, str]:
    return tmp_path / "home", str(pg_server.get_uri())


def _spec(node: Node, rng: random.Random, i: int) -> TaskSpec:
    from conveyor.streams.routing import mint_task_id

    return TaskSpec(
        task_id=mint_task_id(i % node.partitions),
        tenant=rng.choice(TENANTS),
        app="shop",
        task_type=rng.choice(TYPES),
        queue=rng.choice(QUEUES),
        attempts_max=3,
        backoff_base_ms=1,
        backoff_cap_ms=5,
    )


async def _workload(node: Node, rng: random.Random, tasks: int) -> None:
    """Enqueue, lease and complete with random outcomes; cancel and dead-letter-retry some."""
    specs = [_spec(node, rng, i) for i in range(tasks)]
    for start in range(0, tasks, 50):
        await node.enqueue(specs[start : start + 50])
    for spec in rng.sample(specs, tasks // 10):
        await node.cancel(spec.tenant, spec.task_id, "changed my mind")
    for _ in range(40):
        leases = await node.poll(
            agent_id=f"agent-{rng.randrange(3)}", app="shop", tenants=list(TENANTS),
            queues=list(QUEUES), capacity=64, wait_ms=200,
        )  # fmt: skip
        if not leases:
            break
        await node.complete([_outcome(rng, lease.task_id, lease.lease_id) for lease in leases])
        await asyncio.sleep(0.01)  # let backoff timers fire
    failed = [s for s in specs if node.get(s.tenant, s.task_id).status == "FAILED"]
    for spec in failed[:5]:
        await node.retry_failed(spec.tenant, [spec.task_id])


def _outcome(rng: random.Random, task_id: str, lease_id: int) -> Completion:
    roll = rng.random()
    if roll < 0.6:
        return Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.SUCCEEDED)
    kind = Outcome.FATAL if roll > 0.9 else Outcome.FAILED
    return Completion(
        task_id=task_id, lease_id=lease_id, outcome=kind, error_class="IOError",
        error_message=f"disk {rng.randrange(4)} unplugged", retry_after_ms=0,
    )  # fmt: skip


def _processor_rows(node: Node) -> dict[str, dict[str, Any]]:
    rows = {}
    for p in range(node.partitions):
        tables = node.tables(p)
        for key, _ in tables.scan(keys.TASKS, None):
            task = tables.task(key[len(keys.TASKS) :].decode())
            assert task is not None
            rows[task.task_id] = _as_row(task)
    return rows


def _as_row(task: Task) -> dict[str, Any]:
    row = {name: getattr(task, name) for name in COMPARED}
    row["status"] = task.status.value
    return row


async def _pg_rows(pool: Any) -> dict[str, dict[str, Any]]:
    records = await pool.fetch(f"SELECT task_id, {', '.join(COMPARED)} FROM tasks")
    return {r["task_id"]: {name: r[name] for name in COMPARED} for r in records}


async def _wait_equal(node: Node, pool: Any, timeout_s: float = 30.0) -> dict[str, Any]:
    """Poll until the snapshot equals the processors' state; the last diff on timeout."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        expected, actual = _processor_rows(node), await _pg_rows(pool)
        if expected == actual or asyncio.get_running_loop().time() > deadline:
            return {"expected": expected, "actual": actual}
        await asyncio.sleep(0.05)


def _diff(seen: dict[str, Any]) -> list[str]:
    expected, actual = seen["expected"], seen["actual"]
    out = [f"missing {i}" for i in expected.keys() - actual.keys()]
    out += [f"extra {i}" for i in actual.keys() - expected.keys()]
    for task_id in expected.keys() & actual.keys():
        for name in COMPARED:
            if expected[task_id][name] != actual[task_id][name]:
                out.append(
                    f"{task_id}.{name}: {actual[task_id][name]!r} != {expected[task_id][name]!r}"
                )
        if len(out) > 20:
            break
    return out


async def _start(node: Node, pool: Any, metrics: Any = None) -> tuple[Any, asyncio.Task[None]]:
    from conveyor.streams.sinks.projector import Projector

    projector = Projector(node.events, pool, metrics=metrics)
    return projector, asyncio.create_task(projector.run())


async def _stop(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


def test_snapshot_equals_processor_state_across_projector_restarts(env: tuple[Path, str]) -> None:
    asyncio.run(_run(env, _restarts))


async def _run(env: tuple[Path, str], body: Any) -> None:
    async with _node_and_pool(*env) as (node, pool):
        await body(node, pool)


async def _restarts(node: Node, pool: Any) -> None:
    rng = random.Random(5)
    _, task = await _start(node, pool)
    await _workload(node, rng, 150)
    await _stop(task)  # mid-stream: the outbox keeps shipping while no projector runs
    await _workload(node, rng, 150)
    _, task = await _start(node, pool)
    await _workload(node, rng, 100)
    seen = await _wait_equal(node, pool)
    await _stop(task)
    assert _diff(seen) == []
    statuses = {row["status"] for row in seen["actual"].values()}
    assert {"SUCCEEDED", "FAILED", "CANCELED"} <= statuses
    attempts = await pool.fetchval("SELECT count(*) FROM attempts WHERE outcome = 'FAILED'")
    assert attempts > 0


def test_replaying_every_event_changes_nothing(env: tuple[Path, str]) -> None:
    asyncio.run(_run(env, _replay))


async def _replay(node: Node, pool: Any) -> None:
    from conveyor.streams.sinks.projector import Projector

    _, task = await _start(node, pool)
    await _workload(node, random.Random(7), 120)
    seen = await _wait_equal(node, pool)
    await _stop(task)
    assert _diff(seen) == []
    before = await pool.fetch("SELECT * FROM tasks ORDER BY task_id")
    attempts = await pool.fetch("SELECT * FROM attempts ORDER BY task_id, attempt")
    await pool.execute("UPDATE watermarks SET next_offset = 0")
    replayed = await Projector(node.events, pool).catch_up()
    assert replayed > 0
    assert await pool.fetch("SELECT * FROM tasks ORDER BY task_id") == before
    assert await pool.fetch("SELECT * FROM attempts ORDER BY task_id, attempt") == attempts
    rebuilt = await Projector(node.events, pool).rebuild()
    assert rebuilt == replayed
    assert await pool.fetch("SELECT * FROM tasks ORDER BY task_id") == before


def test_steps_and_schedules_are_projected_and_outlive_the_live_rows(
    env: tuple[Path, str],
) -> None:
    asyncio.run(_run(env, _steps_and_schedules))


async def _wait_for(pool: Any, sql: str, expected: Any, timeout_s: float = 30.0) -> Any:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        seen = [tuple(r) for r in await pool.fetch(sql)]
        if seen == expected or asyncio.get_running_loop().time() > deadline:
            return seen
        await asyncio.sleep(0.05)


STEPS_SQL = "SELECT identity, state, claims, value, tenant FROM steps ORDER BY identity"
SCHEDULES_SQL = (
    "SELECT schedule_id, paused, deleted, task_type, fired, next_fire_ms IS NULL "
    "FROM schedules ORDER BY schedule_id"
)


async def _steps_and_schedules(node: Node, pool: Any) -> None:
    from conveyor.schemas import codec
    from conveyor.schemas.types import StepOp, StepWrite, UpsertSchedule
    from conveyor.streams.sinks.projector import Projector

    _, task = await _start(node, pool)
    spec = _spec(node, random.Random(3), 0)
    await node.enqueue([spec])
    (lease,) = await node.poll(
        agent_id="a", app="shop", tenants=[spec.tenant], queues=[spec.queue], capacity=1,
        wait_ms=2_000,
    )  # fmt: skip
    writes = [
        StepWrite(task_id=spec.task_id, lease_id=lease.lease_id, op=op, identity=ident,
                  position=pos, value=value)
        for op, ident, pos, value in (
            (StepOp.CLAIM, "charge#0", 0, None),
            (StepOp.COMMIT, "charge#0", 0, b'"ch_1"'),
            (StepOp.CLAIM, "receipt#0", 1, None),
        )
    ]  # fmt: skip
    for write in writes:  # one record each: the claim and its commit at distinct versions
        assert [r.ok for r in await node.steps([write])] == [True]
    expected = [
        ("charge#0", "COMMITTED", 1, b'"ch_1"', spec.tenant),
        ("receipt#0", "CLAIMED", 1, None, spec.tenant),
    ]
    assert await _wait_for(pool, STEPS_SQL, expected) == expected
    workflow = await pool.fetchrow(
        "SELECT workflow_id, steps, steps_committed FROM workflows WHERE workflow_id = $1",
        spec.task_id,
    )
    assert tuple(workflow) == (spec.task_id, 2, 1)  # the view over tasks and steps
    await node.complete([Completion(task_id=spec.task_id, lease_id=lease.lease_id,
                                    outcome=Outcome.FATAL, error_class="E")])  # fmt: skip
    tables = node.tables(node.partition_of(spec.task_id))
    assert tables.steps(spec.task_id) == []  # the live rows went with the terminal state
    assert await _wait_for(pool, STEPS_SQL, expected) == expected  # the history stays

    template = codec.TASK_SPEC.encode(dataclasses.replace(spec, task_id="", tenant="alpha"))
    for schedule_id in ("nightly", "gone"):
        record = UpsertSchedule(
            tenant="alpha", schedule_id=schedule_id, cron="0 3 * * *", timezone="UTC",
            template=template, overlap=OverlapPolicy.ALLOW, catch_up=CatchUp.ONCE,
        )  # fmt: skip
        assert (await node.upsert_schedule(record)).ok
    assert (await node.pause_schedule("alpha", "nightly", paused=True)).ok
    assert (await node.delete_schedule("alpha", "gone")).ok
    schedules = [("gone", False, True, spec.task_type, 0, True),
                 ("nightly", True, False, spec.task_type, 0, True)]  # fmt: skip
    assert await _wait_for(pool, SCHEDULES_SQL, schedules) == schedules
    await _stop(task)

    steps_before = await pool.fetch("SELECT * FROM steps ORDER BY task_id, identity")
    schedules_before = await pool.fetch("SELECT * FROM schedules ORDER BY schedule_id")
    await pool.execute("UPDATE watermarks SET next_offset = 0")
    assert await Projector(node.events, pool).catch_up() > 0
    assert await pool.fetch("SELECT * FROM steps ORDER BY task_id, identity") == steps_before
    assert await pool.fetch("SELECT * FROM schedules ORDER BY schedule_id") == schedules_before
    await Projector(node.events, pool).rebuild()
    assert await pool.fetch("SELECT * FROM steps ORDER BY task_id, identity") == steps_before
    assert await pool.fetch("SELECT * FROM schedules ORDER BY schedule_id") == schedules_before


_METRICS_KEY = "metrics-key-0123456789"


@contextlib.asynccontextmanager
async def _gateway(node: Node, pool: Any) -> AsyncIterator[tuple[str, Any]]:
    from conveyor.streams.gateway import KeyStore, Registry, build_app, start
    from conveyor.streams.sinks.metrics import Metrics, time_appends

    metrics = Metrics()
    metrics.watch(node)
    time_appends(node, metrics)
    projector, task = await _start(node, pool, metrics)
    ks = KeyStore({"key-alpha-0123456789": "alpha", "key-beta-0123456789": "beta"})
    app = build_app(
        node, ks, Registry({}), snapshot=pool, metrics=metrics, metrics_key=_METRICS_KEY
    )
    runner, url = await start(app, "127.0.0.1", 0)
    try:
        yield url, projector
    finally:
        await runner.cleanup()
        await _stop(task)


def test_an_ended_workflow_shows_its_steps_from_the_snapshot(env: tuple[Path, str]) -> None:
    asyncio.run(_run(env, _ended_workflow))


async def _ended_workflow(node: Node, pool: Any) -> None:
    from conveyor.schemas.types import StepOp, StepWrite

    spec = dataclasses.replace(_spec(node, random.Random(4), 1), tenant="alpha")
    await node.enqueue([spec])
    (lease,) = await node.poll(
        agent_id="a", app="shop", tenants=["alpha"], queues=[spec.queue], capacity=1,
        wait_ms=2_000,
    )  # fmt: skip
    identities = [f"s{i}#0" for i in range(5)]
    writes = [
        StepWrite(task_id=spec.task_id, lease_id=lease.lease_id, op=StepOp.COMMIT,
                  identity=identity, position=i, value=str(i).encode())
        for i, identity in enumerate(identities)
    ]  # fmt: skip
    assert all(r.ok for r in await node.steps(writes))
    done = Completion(task_id=spec.task_id, lease_id=lease.lease_id, outcome=Outcome.SUCCEEDED)
    await node.complete([done])
    assert node.tables(node.partition_of(spec.task_id)).steps(spec.task_id) == []
    headers = {"Authorization": "Bearer key-alpha-0123456789"}
    async with (
        _gateway(node, pool) as (url, _),
        httpx.AsyncClient(base_url=url, headers=headers) as client,
    ):
        reply = await client.get(f"/v1/workflows/{spec.task_id}")
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["workflow"]["status"] == "SUCCEEDED"
        assert [(s["identity"], s["state"]) for s in body["steps"]] == [
            (identity, "COMMITTED") for identity in identities
        ]
        seen: list[str] = []
        cursor = None
        for _ in range(5):
            params = {"limit": 2, **({"cursor": cursor} if cursor else {})}
            page = await client.get(f"/v1/workflows/{spec.task_id}/history", params=params)
            assert page.status_code == 200, page.text
            seen += [s["identity"] for s in page.json()["steps"]]
            cursor = page.json()["next_cursor"]
            if cursor is None:
                break
        assert seen == identities


async def _list(client: httpx.AsyncClient, **params: Any) -> dict[str, Any]:
    reply = await client.get("/v1/tasks", params=params)
    assert reply.status_code == 200, reply.text
    body: dict[str, Any] = reply.json()
    return body


def test_listing_filters_and_pages_through_the_gateway(env: tuple[Path, str]) -> None:
    asyncio.run(_run(env, _listing))


async def _listing(node: Node, pool: Any) -> None:
    async with _gateway(node, pool) as (url, _):
        await _listing_checks(node, pool, url)


async def _listing_checks(node: Node, pool: Any, url: str) -> None:
    await _workload(node, random.Random(11), 200)
    await _wait_equal(node, pool)
    expected = {t: r for t, r in _processor_rows(node).items() if r["tenant"] == "alpha"}
    headers = {"Authorization": "Bearer key-alpha-0123456789"}
    async with httpx.AsyncClient(base_url=url, headers=headers) as client:
        seen: list[str] = []
        cursor = None
        while True:
            page = await _list(client, limit=17, **({"cursor": cursor} if cursor else {}))
            seen += [t["task_id"] for t in page["tasks"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert sorted(seen) == sorted(expected) and len(seen) == len(set(seen))
        failed = await _list(client, status="FAILED", error_class="IOError", count="true")
        want = {
            t
            for t, r in expected.items()
            if r["status"] == "FAILED" and r["error_class"] == "IOError"
        }
        assert {t["task_id"] for t in failed["tasks"]} == want and failed["count"] == len(want)
        disk = await _list(client, error_text="DISK 2", queue="critical", task_type="email")
        want = {
            t for t, r in expected.items()
            if "disk 2" in (r["error_message"] or "") and r["queue"] == "critical"
            and r["task_type"] == "email"
        }  # fmt: skip
        assert {t["task_id"] for t in disk["tasks"]} == want
        cut = sorted(r["finished_ms"] for r in expected.values() if r["finished_ms"])[10]
        late = await _list(client, finished_from_ms=cut, limit=1000)
        assert {t["task_id"] for t in late["tasks"]} == {
            t for t, r in expected.items() if (r["finished_ms"] or 0) >= cut
        }
        queues = (await client.get("/v1/queues")).json()["queues"]
        assert {q["queue"] for q in queues} <= set(QUEUES)
        bad = await client.get("/v1/tasks", params={"cursor": "nope"})
        assert bad.status_code == 400
    await _sdk_lists_the_snapshot(node, url, expected)


async def _sdk_lists_the_snapshot(
    node: Node, url: str, expected: dict[str, dict[str, Any]]
) -> None:
    """The SDK's client reads the same pages: snapshot rows carry no priority (null), which
    it must take as unknown rather than fail on. Its retry by filter retries every FAILED
    email task that is still a dead letter (the workload retried a few already: one retry
    each)."""
    from conveyor import AsyncClient

    async with AsyncClient(url, "key-alpha-0123456789") as sdk:
        page = await sdk.list(status="FAILED", limit=1000)
        want = {t for t, r in expected.items() if r["status"] == "FAILED"}
        assert {t.task_id for t in page.tasks} == want and want
        assert all(t.priority is None and t.status == "FAILED" for t in page.tasks)
        dead = {t for t in want if node.tables(node.partition_of(t)).is_dead("alpha", t)}
        retried = await sdk.retry_failed(task_type="email")
        assert set(retried) == {t for t in dead if expected[t]["task_type"] == "email"}


def test_metrics_expose_the_named_series(env: tuple[Path, str]) -> None:
    asyncio.run(_run(env, _metrics))


async def _metrics(node: Node, pool: Any) -> None:
    async with _gateway(node, pool) as (url, projector):
        await _metrics_checks(node, pool, url, projector)


async def _metrics_checks(node: Node, pool: Any, url: str, projector: Any) -> None:
    await _workload(node, random.Random(13), 60)
    await _wait_equal(node, pool)
    auth = {"Authorization": f"Bearer {_METRICS_KEY}"}
    async with httpx.AsyncClient(base_url=url, headers=auth) as client:
        text = (await client.get("/metrics")).text
    for name in (
        "conveyor_schedule_to_start_seconds_bucket",
        "conveyor_dispatched_total",
        "conveyor_processor_lag_records",
        "conveyor_processor_lag_seconds",
        "conveyor_timer_lag_seconds",
        "conveyor_log_fsyncs_total",
        "conveyor_log_records_written_total",
        "conveyor_projection_lag_records",
        "conveyor_projection_lag_seconds",
        "conveyor_projection_events_total",
        "conveyor_tasks_finished_total",
        "conveyor_enqueue_ack_seconds",
        "conveyor_log_append_seconds",
        "conveyor_tasks",
        "conveyor_lease_expired",
    ):
        assert name in text, name
    for p in range(node.partitions):  # no duty failed here
        assert f'conveyor_processor_duty_failures_total{{partition="{p}"}} 0.0' in text
    assert 'conveyor_dispatched_total{tenant="alpha"}' in text
    assert 'conveyor_log_append_seconds_count{log="records"}' in text


def test_a_nul_in_an_error_message_does_not_stop_the_projection(env: tuple[Path, str]) -> None:
    """PostgreSQL text cannot hold U+0000, which a handler's exception text may (a C library's
    message, bytes decoded as text). The snapshot shows it as U+FFFD; the node keeps it."""
    asyncio.run(_run(env, _nul))


async def _nul(node: Node, pool: Any) -> None:
    from conveyor.streams.routing import mint_task_id
    from conveyor.streams.sinks.projector import Projector

    spec = TaskSpec(task_id=mint_task_id(0), tenant="alpha", app="shop", task_type="email")
    await node.enqueue([spec])
    (lease,) = await node.poll(
        agent_id="a", app="shop", tenants=[], queues=[], capacity=1, wait_ms=2_000
    )
    failed = Completion(
        task_id=lease.task_id, lease_id=lease.lease_id, outcome=Outcome.FATAL,
        error_class="Bad\x00Class", error_message="bad \x00 byte",
    )  # fmt: skip
    await node.complete([failed])
    later = TaskSpec(task_id=mint_task_id(0), tenant="alpha", app="shop", task_type="email")
    await node.enqueue([later])
    projector = Projector(node.events, pool)
    deadline = asyncio.get_running_loop().time() + 20
    while True:  # the outbox ships the events meanwhile
        await projector.catch_up()
        rows = {r["task_id"]: r for r in await pool.fetch("SELECT * FROM tasks")}
        done = rows.get(spec.task_id, {}).get("status") == "FAILED" and later.task_id in rows
        if done or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.05)
    assert rows[spec.task_id]["status"] == "FAILED"
    assert rows[spec.task_id]["error_message"] == "bad \ufffd byte"
    assert rows[spec.task_id]["error_class"] == "Bad\ufffdClass"
    assert later.task_id in rows  # the events after it were projected too
    assert node.get("alpha", spec.task_id).error_message == "bad \x00 byte"


def test_a_lease_is_held_back_and_folded_with_its_end(env: tuple[Path, str]) -> None:
    """Rule 5 of the projector: a row whose newest event is TaskLeased waits (on the
    projector's clock) for the attempt's end, so a short attempt is written once; the
    watermark stays below a held row, so a restart projects it; and a held row is written
    when its time is up, with no event after it."""
    asyncio.run(_run(env, _held_lease))


async def _held_lease(node: Node, pool: Any) -> None:
    from conveyor.streams.clock import FakeClock
    from conveyor.streams.routing import mint_task_id
    from conveyor.streams.sinks.projector import HOLD_LEASED_MS, Projector

    await pool.execute(
        """CREATE TABLE written (task_id text, status text);
        CREATE FUNCTION note() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
            INSERT INTO written VALUES (NEW.task_id, NEW.status); RETURN NEW; END $$;
        CREATE TRIGGER noted AFTER INSERT OR UPDATE ON tasks
            FOR EACH ROW EXECUTE FUNCTION note();"""
    )  # every version of a task row, in order
    clock = FakeClock()
    projector = Projector(node.events, pool, clock=clock)
    running = asyncio.create_task(projector.run())

    async def projected(events: int) -> None:
        deadline = asyncio.get_running_loop().time() + 20
        while projector.events_projected < events:
            assert asyncio.get_running_loop().time() < deadline, projector.events_projected
            await asyncio.sleep(0.01)

    async def row(task_id: str) -> tuple[Any, ...]:
        status = await pool.fetchval("SELECT status FROM tasks WHERE task_id = $1", task_id)
        attempts = await pool.fetch(
            "SELECT started_ms IS NOT NULL, outcome FROM attempts WHERE task_id = $1", task_id
        )
        return status, [tuple(a) for a in attempts]

    async def until(task_id: str, status: str) -> None:
        deadline = asyncio.get_running_loop().time() + 20
        while (await row(task_id))[0] != status:
            assert asyncio.get_running_loop().time() < deadline, await row(task_id)
            await asyncio.sleep(0.01)

    async def lease(spec: TaskSpec) -> Any:
        (got,) = await node.poll(
            agent_id="a", app="shop", tenants=[], queues=[], capacity=1, wait_ms=2_000
        )
        assert got.task_id == spec.task_id
        return got

    first, second = (
        TaskSpec(task_id=mint_task_id(0), tenant="alpha", app="shop", task_type="email")
        for _ in range(2)
    )
    await node.enqueue([first])
    await projected(1)
    assert await row(first.task_id) == ("ENQUEUED", [])
    leased = await lease(first)
    await projected(2)
    await asyncio.sleep(0.1)  # a chunk or two more: the row stays held, time has not moved
    assert await row(first.task_id) == ("ENQUEUED", [])

    await _stop(running)  # a restart re-reads the held lease from the watermark
    assert await Projector(node.events, pool).catch_up() >= 1
    assert await row(first.task_id) == ("LEASED", [(True, None)])

    running = asyncio.create_task(projector.run())
    await node.enqueue([second])
    await until(second.task_id, "ENQUEUED")
    done = Completion(task_id=first.task_id, lease_id=leased.lease_id, outcome=Outcome.SUCCEEDED)
    await node.complete([done])
    await until(first.task_id, "SUCCEEDED")
    assert await row(first.task_id) == ("SUCCEEDED", [(True, "SUCCEEDED")])
    written = await pool.fetch("SELECT status FROM written WHERE task_id = $1", first.task_id)
    assert [w["status"] for w in written] == ["ENQUEUED", "LEASED", "SUCCEEDED"]  # restarted

    before = projector.events_projected
    await lease(second)
    await projected(before + 1)
    await asyncio.sleep(0.1)
    assert await row(second.task_id) == ("ENQUEUED", [])  # held

    clock.advance(HOLD_LEASED_MS)  # its time is up: written with no event after it
    await until(second.task_id, "LEASED")
    assert await row(second.task_id) == ("LEASED", [(True, None)])

    third = TaskSpec(task_id=mint_task_id(0), tenant="alpha", app="shop", task_type="email")
    await node.enqueue([third])
    await until(third.task_id, "ENQUEUED")
    short = await lease(third)
    done = Completion(task_id=third.task_id, lease_id=short.lease_id, outcome=Outcome.SUCCEEDED)
    await node.complete([done])
    await until(third.task_id, "SUCCEEDED")
    assert await row(third.task_id) == ("SUCCEEDED", [(True, "SUCCEEDED")])
    written = await pool.fetch("SELECT status FROM written WHERE task_id = $1", third.task_id)
    assert [w["status"] for w in written] == ["ENQUEUED", "SUCCEEDED"]  # one version less
    await _stop(running)


def test_an_attempt_handed_back_unstarted_leaves_no_attempt_row(env: tuple[Path, str]) -> None:
    """A RELEASED attempt did not happen: its open row goes, the task row is ENQUEUED under
    the same attempt, and the next lease of that attempt number writes a row of its own."""
    asyncio.run(_run(env, _released))


async def _released(node: Node, pool: Any) -> None:
    from conveyor.streams.routing import mint_task_id
    from conveyor.streams.sinks.projector import Projector

    spec = TaskSpec(task_id=mint_task_id(0), tenant="alpha", app="shop", task_type="email")

    async def lease() -> Any:
        (got,) = await node.poll(
            agent_id="a", app="shop", tenants=[], queues=[], capacity=1, wait_ms=2_000
        )
        assert got.task_id == spec.task_id
        return got

    async def projected(status: str) -> tuple[Any, ...]:
        """Once the events shipped so far show ``status``: (status, attempt), attempt rows."""
        deadline = asyncio.get_running_loop().time() + 20
        while True:
            await Projector(node.events, pool).catch_up()
            task = await pool.fetchrow(
                "SELECT status, attempt FROM tasks WHERE task_id = $1", spec.task_id
            )
            if task is not None and task["status"] == status:
                break
            assert asyncio.get_running_loop().time() < deadline, task
            await asyncio.sleep(0.01)
        attempts = await pool.fetch(
            "SELECT attempt, started_ms, outcome FROM attempts WHERE task_id = $1",
            spec.task_id,
        )
        return tuple(task), [tuple(a) for a in attempts]

    await node.enqueue([spec])
    first = await lease()
    (_, [(number, started_ms, outcome)]) = await projected("LEASED")
    assert (number, outcome) == (1, None)
    (reply,) = await node.complete(
        [Completion(task_id=spec.task_id, lease_id=first.lease_id, outcome=Outcome.RELEASED)]
    )
    assert reply.ok
    assert await projected("ENQUEUED") == (("ENQUEUED", 1), [])
    await asyncio.sleep(0.01)  # the next lease starts later than the first
    second = await lease()
    await node.complete(
        [Completion(task_id=spec.task_id, lease_id=second.lease_id, outcome=Outcome.SUCCEEDED)]
    )
    task, [(number, started_again, outcome)] = await projected("SUCCEEDED")
    assert task == ("SUCCEEDED", 1) and (number, outcome) == (1, "SUCCEEDED")
    assert started_again > started_ms
