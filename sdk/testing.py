"""``conveyor.testing``: the real engine, in-process, on a fake clock.

    with conveyor.testing.Engine(app) as engine:
        handle = engine.client.enqueue(send_email, {"to": "a@b.c"}, delay="10m")
        engine.run_until_idle()          # nothing is due: the delay has not passed
        engine.advance("10m")            # the timer fires, the task runs
        assert handle.result() == "sent"

The engine is a real Node (RocksDB and the local log in a temp dir, or in memory) and a real
host agent whose executor runs handlers in this process (breakpoints work), on a background
thread with its own event loop. Time is a ``FakeClock``: delays, backoff and timeouts fire when
``advance`` moves it, never by waiting. ``engine.client`` has the methods of
``conveyor.Client`` and talks to the node directly; inside the ``with``, ``task.enqueue()``
uses it too.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import tempfile
import threading
import time
from collections.abc import Coroutine, Iterable
from types import TracebackType
from typing import Any, TypeVar, Unpack

from conveyor.agents.host import HostAgent
from conveyor.agents.inline import InlineExecutor
from conveyor.app import App, TaskType
from conveyor.client import (
    Decode,
    EnqueueClient,
    TaskHandle,
    decoder_of,
    items_of,
    set_default_client,
)
from conveyor.codecs import (
    PayloadCodec,
    decode_tree,
    decoded_info,
    encode_bodies,
    encode_schedule,
    encode_value,
)
from conveyor.durations import Duration, to_ms
from conveyor.errors import ContractError
from conveyor.schemas import codec
from conveyor.schemas.types import CatchUp, OverlapPolicy, TaskStatus, TimerKind, UpsertSchedule
from conveyor.store import keys
from conveyor.store.tables import Tables
from conveyor.streams import cron as cron_rules
from conveyor.streams.clock import FakeClock
from conveyor.streams.gateway.reruns import rerun_spec, run_spec
from conveyor.streams.gateway.schedules import schedule_json
from conveyor.streams.gateway.workflows import history_page, parse_history_query, workflow_json
from conveyor.streams.machine.handlers.cancel import retry_id
from conveyor.streams.node import Node
from conveyor.testing_node import NodeWorkerAPI, check, spec_from_body, task_info
from conveyor.wire import (
    Enqueue,
    EnqueueOptions,
    ScheduleInfo,
    ScheduleList,
    ScheduleOptions,
    TaskInfo,
    TaskPage,
    enqueue_body,
    schedule_body,
)

__all__ = ["Engine", "EngineClient", "FakeClock"]

T = TypeVar("T")

LEASE_S = 10 * 365 * 86_400.0  # leases never lapse on a fake-time jump: no agent can die here
CALL_TIMEOUT_S = 60.0


class Engine:
    """The platform in this process on a fake clock: a real node and a host agent running
    ``app``'s handlers in this process (see the module's docstring). ``codec`` (default: the
    app's) encodes payloads on both sides, as ``conveyor.codecs`` describes."""

    def __init__(
        self,
        app: App,
        *,
        durable: bool = True,
        partitions: int = 2,
        tenant: str = "default",
        concurrency: int = 8,
        idle_timeout_s: float = 30.0,
        codec: PayloadCodec | None = None,
    ) -> None:
        self.app = app
        # Both sides of conveyor.codecs: the handlers' (default: the app's) and the client's.
        self.codec = codec if codec is not None else app.codec
        self.durable = durable
        self.partitions = partitions
        self.tenant = tenant
        self.concurrency = concurrency
        self.idle_timeout_s = idle_timeout_s
        self.clock = FakeClock()
        self.client = EngineClient(self)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="conveyor-engine")
        self._home: str | None = None
        self._node: Node | None = None
        self._api: NodeWorkerAPI | None = None
        self._agent: HostAgent | None = None
        self._agent_run: asyncio.Task[None] | None = None
        self._previous: EnqueueClient | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Engine:
        self._thread.start()
        try:
            self.call(self._start())
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self._previous = set_default_client(self.client)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        set_default_client(self._previous)
        try:
            if self._thread.is_alive():
                self.call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=CALL_TIMEOUT_S)
            self._loop.close()
            if self._home is not None:
                shutil.rmtree(self._home, ignore_errors=True)

    async def _start(self) -> None:
        if self.durable:
            self._home = tempfile.mkdtemp(prefix="conveyor-engine-")
            node = await Node.open(self._home, partitions=self.partitions, clock=self.clock)
        else:
            node = Node.in_memory(self.partitions, clock=self.clock)
        await node.start()
        self._node = node
        self._api = NodeWorkerAPI(node, tenant=self.tenant)
        self._agent = HostAgent(
            self._api,
            self.app,
            concurrency=self.concurrency,
            heartbeat_s=3_600.0,  # heartbeats are poked by the engine, not timed
            lease_s=LEASE_S,
            poll_wait_s=3_600.0,
            executor=InlineExecutor(self.app, threads=self.concurrency, codec=self.codec),
            clock=self.clock,
            agent_id="engine",
        )
        self._agent_run = asyncio.create_task(self._agent.run())
        started = asyncio.ensure_future(self._agent.started.wait())
        await asyncio.wait({self._agent_run, started}, return_when=asyncio.FIRST_COMPLETED)
        if self._agent_run.done():
            started.cancel()
            self._agent_run.result()  # the agent failed to start: raise why

    async def _stop(self) -> None:
        if self._agent is not None and self._agent_run is not None:
            self._agent.stop()
            await asyncio.wait_for(self._agent_run, CALL_TIMEOUT_S)
        if self._node is not None:
            await self._node.stop()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
        """Run ``coro`` on the engine's loop and return its result (from the test's thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def node(self) -> Node:
        """The engine's ``Node`` (to read its state in a test)."""
        assert self._node is not None, "the engine is not running: use `with Engine(app):`"
        return self._node

    @property
    def agent(self) -> HostAgent:
        """The engine's host agent."""
        assert self._agent is not None, "the engine is not running: use `with Engine(app):`"
        return self._agent

    @property
    def known(self) -> dict[str, set[str]]:
        """The task types the agent registered, by app."""
        assert self._api is not None, "the engine is not running: use `with Engine(app):`"
        return self._api.known

    # -- time -----------------------------------------------------------------------------------

    def advance(self, duration: Duration, *, settle: bool = True) -> None:
        """Move the fake clock forward (seconds, timedelta or "10m"); timers now due fire.
        Then, unless ``settle=False``, wait until the engine is idle."""
        ms = to_ms(duration, field="advance")

        async def move() -> None:
            self.clock.advance(ms)

        self.call(move())
        if settle:
            self.run_until_idle()

    def now_ms(self) -> int:
        """The fake clock's time, in epoch milliseconds."""
        return self.clock.now_ms()

    def run_until_idle(self, timeout: float | None = None) -> None:
        """Return once no task is ready, running or being completed and no timer is due.
        Timers in the future do not count: ``advance`` or ``drain`` to reach them."""
        seconds = timeout or self.idle_timeout_s
        deadline = time.monotonic() + seconds
        quiet = 0
        why: str | None = None
        while quiet < 2:  # twice in a row: nothing was in flight between the two looks
            if time.monotonic() > deadline:
                raise TimeoutError(f"the engine is not idle after {seconds}s: {why}")
            why = self.call(self._busy())
            quiet = quiet + 1 if why is None else 0
            time.sleep(0.002)

    def drain(self, *, steps_max: int = 10_000) -> None:
        """Run until idle, jump the clock to the next timer, repeat, until no timer is left:
        every delay, backoff and timeout plays out."""
        for _ in range(steps_max):
            self.run_until_idle()
            upcoming = self.call(self._next_timer_ms())
            if upcoming is None:
                return
            self.advance(max(0, upcoming - self.clock.now_ms()) / 1000)
        raise TimeoutError(f"timers still pending after {steps_max} steps")

    async def _busy(self) -> str | None:
        node, agent = self.node, self.agent
        agent.heartbeat_now()  # deliver pending cancels to running handlers
        now = self.clock.now_ms()
        for p, processor in enumerate(node.processors):
            if processor.applied + 1 < node.log.end_offset(p):
                return f"partition {p} has records to apply"
            tables = node.tables(p)
            if next(tables.scan(keys.READY_COUNTS), None) is not None:
                return f"partition {p} has ready tasks (is an agent polling their app?)"
            if next(tables.leased(), None) is not None:
                return f"partition {p} has a task running"
            if tables.due_timers(now, 1):
                return f"partition {p} has a due timer"
            if next(tables.scan(keys.MESSAGES), None) is not None:
                return f"partition {p} has messages for other partitions to ship"
        if agent.busy:
            return "the worker is running or completing an attempt"
        return None

    async def _next_timer_ms(self) -> int | None:
        """The next timer of a task. Schedules re-arm forever, so ``drain`` leaves them to
        ``advance``: it plays out what is pending, not an endless calendar. Forgetting an
        idempotency key a day later is housekeeping, not pending work: jumping to it would
        make every schedule fire again, and enqueue a task with a key to forget, forever."""
        times = [_next_task_timer_ms(self.node.tables(p)) for p in range(self.node.partitions)]
        known = [t for t in times if t is not None]
        return min(known) if known else None


_NOT_TASK_WORK = frozenset({TimerKind.SCHEDULE, TimerKind.FORGET_KEY})


def _next_task_timer_ms(tables: Tables) -> int | None:
    for key, _ in tables.scan(keys.TIMERS):
        ref = keys.parse_timer(key)
        if ref.kind not in _NOT_TASK_WORK:
            return ref.fire_at_ms
    return None


class EngineClient:
    """``conveyor.Client``'s methods, straight onto the engine's node."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def _enqueue_bodies(
        self, bodies: list[dict[str, Any]], decoders: list[Decode | None]
    ) -> list[TaskHandle[Any]]:
        engine = self._engine

        async def go() -> list[TaskHandle[Any]]:
            node = engine.node
            specs = [
                spec_from_body(
                    body,
                    tenant=engine.tenant,
                    partitions=node.partitions,
                    now_ms=engine.clock.now_ms(),
                    known=engine.known,
                )
                for body in bodies
            ]
            replies = await node.enqueue(specs)
            return [
                TaskHandle(self, check(r).task_id, r.created, decode)
                for r, decode in zip(replies, decoders, strict=True)
            ]

        return engine.call(go())

    def enqueue(
        self,
        task: TaskType[Any, Any] | str,
        payload: Any = None,
        **options: Unpack[EnqueueOptions],
    ) -> TaskHandle[Any]:
        """``Client.enqueue`` on the engine."""
        req = Enqueue(task, payload, **options)
        body = enqueue_body(req, self._engine.app.name)
        [body] = encode_bodies(self._engine.codec, [body], [task])
        return self._enqueue_bodies([body], [decoder_of(task)])[0]

    def enqueue_many(
        self, items: Iterable[Enqueue | tuple[TaskType[Any, Any] | str, Any]]
    ) -> list[TaskHandle[Any]]:
        """``Client.enqueue_many`` on the engine."""
        app = self._engine.app.name
        reqs = items_of(items)
        bodies = [enqueue_body(it, app) for it in reqs]
        bodies = encode_bodies(self._engine.codec, bodies, [it.task for it in reqs])
        return self._enqueue_bodies(bodies, [decoder_of(it.task) for it in reqs])

    def get(self, task_id: str) -> TaskInfo:
        """``Client.get`` on the engine."""
        engine = self._engine

        async def go() -> TaskInfo:
            info = task_info(engine.node, engine.node.get(engine.tenant, task_id))
            return decoded_info(engine.codec, info)

        return engine.call(go())

    def wait(self, task_id: str, timeout: float | None) -> TaskInfo:
        """The task once terminal. Real seconds: the fake clock does not move by itself, so a
        task waiting on a timer needs ``engine.advance``/``engine.drain`` first."""
        engine = self._engine
        seconds = 10.0 if timeout is None else timeout

        async def go() -> TaskInfo:
            task = await engine.node.wait_finished(engine.tenant, task_id, seconds * 1000)
            return decoded_info(engine.codec, task_info(engine.node, task))

        info = engine.call(go(), timeout=seconds + CALL_TIMEOUT_S)
        if not info.finished:
            raise TimeoutError(
                f"task {task_id} is still {info.status} after {seconds}s of real time; the "
                "engine's clock is fake: engine.advance(...) or engine.drain() to fire timers"
            )
        return info

    def cancel(self, task_id: str) -> str:
        """``Client.cancel`` on the engine; a running handler learns it at once."""
        engine = self._engine

        async def go() -> str:
            reply = check(await engine.node.cancel(engine.tenant, task_id, "canceled by request"))
            engine.agent.heartbeat_now()  # a running handler learns it at once
            return str(reply.status.value if reply.status else "")

        return engine.call(go())

    def rerun(self, task_id: str) -> str:
        """``Client.rerun`` on the engine: a finished task enqueued again as a new task."""
        engine = self._engine

        async def go() -> str:
            node = engine.node
            task = node.get(engine.tenant, task_id)
            partition = node.partition_of(task_id)
            spec = rerun_spec(task, node.tables(partition).spec(task_id), partition, None)
            (reply,) = await node.enqueue([spec])
            return check(reply).task_id

        return engine.call(go())

    def get_workflow(self, workflow_id: str) -> dict[str, Any]:
        """``Client.get_workflow``: the workflow, its steps, its parallel steps' children."""
        engine = self._engine

        async def go() -> dict[str, Any]:
            task = engine.node.get(engine.tenant, workflow_id)
            tables = engine.node.tables(engine.node.partition_of(workflow_id))
            reply = workflow_json(task, tables, engine.clock.now_ms(), node=engine.node)
            return dict(decode_tree(engine.codec, reply))

        return engine.call(go())

    def workflow_history(
        self, workflow_id: str, *, limit: int = 100, cursor: str | None = None
    ) -> dict[str, Any]:
        """``Client.workflow_history``: one page of the workflow's step rows."""
        engine = self._engine
        after = None if cursor is None else parse_history_query({"cursor": cursor})[1]

        async def go() -> dict[str, Any]:
            engine.node.get(engine.tenant, workflow_id)  # another tenant's is not found
            tables = engine.node.tables(engine.node.partition_of(workflow_id))
            return dict(decode_tree(engine.codec, history_page(tables, workflow_id, limit, after)))

        return engine.call(go())

    def send_event(self, workflow_id: str, name: str, payload: Any = None) -> str:
        """``Client.send_event``: wake the workflow's ``ctx.wait_for_event(name)``, or keep the
        event for its next such wait."""
        engine = self._engine
        sent = encode_value(engine.codec, payload)
        raw = json.dumps(sent, separators=(",", ":")).encode()

        async def go() -> str:
            reply = check(await engine.node.send_event(engine.tenant, workflow_id, name, raw))
            return str(reply.status.value if reply.status else "")

        return engine.call(go())

    def list(
        self,
        *,
        status: str | None = None,
        queue: str | None = None,
        task_type: str | None = None,
        since_ms: int | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> TaskPage:
        """``Client.list`` on the engine."""
        engine = self._engine

        async def go() -> list[TaskInfo]:
            node = engine.node
            wanted = {"tenant": engine.tenant, "status": status, "queue": queue}
            wanted["task_type"] = task_type
            out = [
                task_info(node, task, full=False)
                for p in range(node.partitions)
                for task in node.tables(p).tasks()
                if all(v is None or getattr(task, k) == v for k, v in wanted.items())
                and (since_ms is None or task.updated_ms >= since_ms)
            ]
            return sorted(out, key=lambda t: (t.created_ms or 0, t.task_id))

        tasks = engine.call(go())
        start = int(cursor or 0)
        end = start + limit
        return TaskPage(tasks=tasks[start:end], next_cursor=str(end) if end < len(tasks) else None)

    def retry_failed(
        self,
        task_ids: Iterable[str] | None = None,
        *,
        task_type: str | None = None,
        queue: str | None = None,
        since_ms: int | None = None,
        limit: int = 1000,
    ) -> dict[str, str]:
        """Re-enqueue FAILED tasks as new tasks: {old task id: new task id}."""
        if task_ids is None:
            page = self.list(
                status=TaskStatus.FAILED.value,
                task_type=task_type,
                queue=queue,
                since_ms=since_ms,
                limit=limit,
            )
            task_ids = [t.task_id for t in page.tasks]
        engine = self._engine

        async def go() -> dict[str, str]:
            node = engine.node
            failed = [
                t
                for t in dict.fromkeys(task_ids)
                if node.get(engine.tenant, t).status == TaskStatus.FAILED
            ]
            # The node answers partition by partition, in first-seen order: group alike.
            groups: dict[int, list[str]] = {}
            for t in failed:
                groups.setdefault(node.partition_of(t), []).append(t)
            order = [t for ids in groups.values() for t in ids]
            replies = await node.retry_failed(engine.tenant, order)
            created = {r.task_id: r.offset for r in replies if r.ok and r.created}
            # A retry's id is derived from the old id and the record's offset.
            offsets = set(created.values())
            pairs = ((old, retry_id(old, offset)) for old in order for offset in offsets)
            return {old: new for old, new in pairs if new in created}

        return engine.call(go())

    # -- schedules ----------------------------------------------------------------------------

    def schedule(
        self,
        task: TaskType[Any, Any] | str,
        payload: Any = None,
        **options: Unpack[ScheduleOptions],
    ) -> ScheduleInfo:
        """``Client.schedule`` on the engine: firings come as ``engine.advance`` moves time."""
        engine = self._engine
        body = schedule_body(task, payload, engine.app.name, options)
        body = encode_schedule(engine.codec, body, task)
        problem = cron_rules.problem(body["cron"], body["timezone"])
        if problem is not None:
            raise ContractError(problem, field="cron")

        async def go() -> ScheduleInfo:
            node = engine.node
            template = spec_from_body(
                {**body["task"], "idempotency_key": "template"},
                tenant=engine.tenant,
                partitions=node.partitions,
                now_ms=engine.clock.now_ms(),
                known=engine.known,
            )
            template = dataclasses.replace(template, task_id="", idempotency_key=None)
            record = UpsertSchedule(
                tenant=engine.tenant,
                schedule_id=body["schedule_id"],
                cron=body["cron"],
                timezone=body["timezone"],
                template=codec.TASK_SPEC.encode(template),
                overlap=OverlapPolicy(body["overlap"].upper()),
                catch_up=CatchUp(body["catch_up"].upper()),
            )
            reply = await node.upsert_schedule(record)
            if not reply.ok:
                raise ContractError(f"schedule refused: {reply.reason}", field="cron")
            row = node.get_schedule(engine.tenant, record.schedule_id)
            return ScheduleInfo.from_json(schedule_json(row, payload=None))

        return engine.call(go())

    def schedules(self) -> ScheduleList:
        """``Client.schedules`` on the engine."""
        engine = self._engine

        async def go() -> list[ScheduleInfo]:
            rows = engine.node.list_schedules(engine.tenant)
            return [ScheduleInfo.from_json(schedule_json(r, payload=None)) for r in rows]

        return engine.call(go())

    def unschedule(self, schedule_id: str) -> None:
        """``Client.unschedule`` on the engine."""
        engine = self._engine

        async def go() -> None:
            engine.node.get_schedule(engine.tenant, schedule_id)  # NotFound, as over HTTP
            await engine.node.delete_schedule(engine.tenant, schedule_id)

        engine.call(go())

    def run_schedule(self, schedule_id: str) -> str:
        """``Client.run_schedule`` on the engine: the schedule's task now, once."""
        engine = self._engine

        async def go() -> str:
            node = engine.node
            row = node.get_schedule(engine.tenant, schedule_id)  # NotFound, as over HTTP
            spec = run_spec(row, node.partition_of_schedule(engine.tenant, schedule_id), None)
            (reply,) = await node.enqueue([spec])
            return check(reply).task_id

        return engine.call(go())

    def pause_schedule(self, schedule_id: str) -> ScheduleInfo:
        """``Client.pause_schedule`` on the engine."""
        return self._pause(schedule_id, paused=True)

    def resume_schedule(self, schedule_id: str) -> ScheduleInfo:
        """Fire again from the next occurrence after the engine's now."""
        return self._pause(schedule_id, paused=False)

    def _pause(self, schedule_id: str, *, paused: bool) -> ScheduleInfo:
        engine = self._engine

        async def go() -> ScheduleInfo:
            node = engine.node
            node.get_schedule(engine.tenant, schedule_id)  # NotFound, as over HTTP
            await node.pause_schedule(engine.tenant, schedule_id, paused=paused)
            row = node.get_schedule(engine.tenant, schedule_id)
            return ScheduleInfo.from_json(schedule_json(row, payload=None))

        return engine.call(go())
