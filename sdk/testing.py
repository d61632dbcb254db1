"""``conveyor.testing``: the real service, in-process, on a fake clock.

    with conveyor.testing.Engine(app) as engine:
        handle = engine.client.enqueue(send_email, {"to": "a@b.c"}, delay="10m")
        engine.run_until_idle()          # nothing is due: the delay has not passed
        engine.advance("10m")            # the timer fires, the task runs
        assert handle.result() == "sent"

The engine is what ``conveyor dev`` runs, in this process: a real Node (RocksDB and the local
log in a temp dir, or in memory), the gateway's own HTTP app (its middlewares, validation,
limits and service layer) served on 127.0.0.1 at a free port, and a real host agent polling it
over the worker protocol with an agent key. The agent's executor runs handlers in this process
(breakpoints work). All of it runs on a background thread with its own event loop. Time is a
``FakeClock``: delays, backoff and timeouts fire when ``advance`` moves it, never by waiting.
``engine.client`` is a ``conveyor.Client`` pointed at that gateway with a client key, so a test
sees exactly the replies, errors and status codes a deployed node gives; inside the ``with``,
``task.enqueue()`` uses it too. (An ``async`` handler runs on the engine's loop: it must not
call the synchronous client, which waits for that same loop to answer.)
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

import httpx
from aiohttp import web

from conveyor import extras
from conveyor.app import App
from conveyor.client import Client, EnqueueClient, set_default_client
from conveyor.codecs import PayloadCodec
from conveyor.durations import Duration, to_ms
from conveyor.wire import TaskInfo

extras.require("server", what="conveyor.testing")  # the node the imports below compose

from conveyor.agents.host import HostAgent  # noqa: E402
from conveyor.agents.inline import InlineExecutor  # noqa: E402
from conveyor.agents.worker_api import HttpWorkerAPI  # noqa: E402
from conveyor.contract.limits import LEASE_MS_MAX, WAIT_MS_MAX  # noqa: E402
from conveyor.schemas.types import TimerKind  # noqa: E402
from conveyor.store import keys  # noqa: E402
from conveyor.store.attempt_logs import AttemptLogs  # noqa: E402
from conveyor.store.tables import Tables  # noqa: E402
from conveyor.streams.clock import FakeClock  # noqa: E402
from conveyor.streams.gateway import KeyStore, Registry, build_app, routes, start  # noqa: E402
from conveyor.streams.gateway.auth import agent_grant, client_grant, create_key  # noqa: E402
from conveyor.streams.gateway.service import Gateway  # noqa: E402
from conveyor.streams.node import Node  # noqa: E402

__all__ = ["Engine", "EngineClient", "FakeClock"]

T = TypeVar("T")

HOST = "127.0.0.1"
# The longest lease the gateway grants. A fake-time jump longer than half of it is taken in
# steps, the agent's leases renewed between them (``advance``): no agent dies here.
LEASE_S = LEASE_MS_MAX / 1000
LEASE_STEP_MS = LEASE_MS_MAX // 2
CALL_TIMEOUT_S = 60.0
WAIT_DEFAULT_S = 10.0  # ``handle.result()`` without a timeout: real seconds (see ``wait``)


class EngineClient(Client):
    """A ``conveyor.Client`` on the engine's gateway, with one difference for a fake clock:
    ``wait`` (so ``handle.result()``) waits ``WAIT_DEFAULT_S`` real seconds when given no
    timeout, and says how to move time when the task has not finished."""

    def wait(self, task_id: str, timeout: float | None) -> TaskInfo:
        """The task once terminal. Real seconds: the fake clock does not move by itself, so a
        task waiting on a timer needs ``engine.advance``/``engine.drain`` first."""
        seconds = WAIT_DEFAULT_S if timeout is None else timeout
        info = super().wait(task_id, seconds)
        if not info.finished:
            raise TimeoutError(
                f"task {task_id} is still {info.status} after {seconds}s of real time; the "
                "engine's clock is fake: engine.advance(...) or engine.drain() to fire timers"
            )
        return info


class Engine:
    """The platform in this process on a fake clock: a real node behind the real gateway, and
    a host agent running ``app``'s handlers in this process (see the module's docstring).
    ``codec`` (default: the app's) encodes payloads on both sides, as ``conveyor.codecs``
    describes."""

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
        self.url = ""  # the gateway's, once running
        self._client: EngineClient | None = None
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="conveyor-engine")
        self._home: str | None = None
        self._node: Node | None = None
        self._registry: Registry | None = None
        self._gateway: Gateway | None = None
        self._runner: web.AppRunner | None = None
        self._api: HttpWorkerAPI | None = None
        self._leases: HttpWorkerAPI | None = None  # the engine's own, to renew leases
        self._agent: HostAgent | None = None
        self._agent_run: asyncio.Task[None] | None = None
        self._previous: EnqueueClient | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    def __enter__(self) -> Engine:
        self._thread.start()
        try:
            self._home = tempfile.mkdtemp(prefix="conveyor-engine-")
            client_key = create_key(self._home, client_grant(self.tenant))
            agent_key = create_key(self._home, agent_grant(self.tenant, self.app.name))
            self.call(self._start(agent_key))
            # A transport of its own: no $HTTP_PROXY between a test and the engine's port.
            direct = httpx.HTTPTransport()
            self._client = EngineClient(
                self.url, client_key, app=self.app.name, codec=self.codec, transport=direct
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        self._previous = set_default_client(self._client)
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        set_default_client(self._previous)
        try:
            if self._client is not None:
                self._client.close()
            if self._thread.is_alive():
                self.call(self._stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=CALL_TIMEOUT_S)
            self._loop.close()
            if self._home is not None:
                shutil.rmtree(self._home, ignore_errors=True)

    async def _start(self, agent_key: str) -> None:
        assert self._home is not None
        home = Path(self._home)
        if self.durable:
            node = await Node.open(home / "node", partitions=self.partitions, clock=self.clock)
        else:
            node = Node.in_memory(self.partitions, clock=self.clock)
        await node.start()
        self._node = node
        self._registry = Registry.load(home)
        gateway = build_app(
            node,
            KeyStore.load(home),
            self._registry,
            logs=AttemptLogs(home / "logs"),
        )
        self._gateway = gateway[routes.GATEWAY]
        self._runner, self.url = await start(gateway, HOST, 0)
        self._api = HttpWorkerAPI(self.url, agent_key, direct=True)
        self._leases = HttpWorkerAPI(self.url, agent_key, direct=True)
        self._agent = HostAgent(
            self._api,
            self.app,
            concurrency=self.concurrency,
            heartbeat_s=LEASE_S,  # heartbeats are poked by the engine, not timed
            lease_s=LEASE_S,
            poll_wait_s=WAIT_MS_MAX / 1000,
            executor=InlineExecutor(self.app, threads=self.concurrency, codec=self.codec),
            clock=self.clock,
            agent_id="engine",
            home=home,
        )
        self._agent_run = asyncio.create_task(self._agent.run())
        started = asyncio.ensure_future(self._agent.started.wait())
        await asyncio.wait({self._agent_run, started}, return_when=asyncio.FIRST_COMPLETED)
        if self._agent_run.done():
            started.cancel()
            self._agent_run.result()  # the agent failed to start: raise why

    async def _stop(self) -> None:
        try:
            if self._agent is not None and self._agent_run is not None:
                self._agent.stop()
                await asyncio.wait_for(self._agent_run, CALL_TIMEOUT_S)
        finally:
            for api in (self._api, self._leases):
                if api is not None:
                    await api.close()
            if self._runner is not None:
                await self._runner.cleanup()
            if self._node is not None:
                await self._node.stop()

    def call(self, coro: Coroutine[Any, Any, T], timeout: float = CALL_TIMEOUT_S) -> T:
        """Run ``coro`` on the engine's loop and return its result (from the test's thread)."""
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    @property
    def client(self) -> EngineClient:
        """A ``conveyor.Client`` on the engine's gateway, with a client key of its tenant."""
        assert self._client is not None, "the engine is not running: use `with Engine(app):`"
        return self._client

    @property
    def node(self) -> Node:
        """The engine's ``Node`` (to read its state in a test)."""
        assert self._node is not None, "the engine is not running: use `with Engine(app):`"
        return self._node

    @property
    def gateway(self) -> Gateway:
        """The gateway's service layer (what its routes call), to read what it would answer
        without a client in between (no codec: payloads as the node holds them)."""
        assert self._gateway is not None, "the engine is not running: use `with Engine(app):`"
        return self._gateway

    @property
    def agent(self) -> HostAgent:
        """The engine's host agent."""
        assert self._agent is not None, "the engine is not running: use `with Engine(app):`"
        return self._agent

    @property
    def known(self) -> dict[str, set[str]]:
        """The task types the agent registered, by app."""
        assert self._registry is not None, "the engine is not running: use `with Engine(app):`"
        return {self.app.name: set(self._registry.task_types(self.tenant, self.app.name))}

    # -- time -----------------------------------------------------------------------------------

    def advance(self, duration: Duration, *, settle: bool = True) -> None:
        """Move the fake clock forward (seconds, timedelta or "10m"); timers now due fire.
        Then, unless ``settle=False``, wait until the engine is idle."""
        ms = to_ms(duration, field="advance")
        self.call(self._move(ms))
        if settle:
            self.run_until_idle()

    async def _move(self, ms: int) -> None:
        """Move the clock by ``ms``; while the agent holds leases, in steps of at most half a
        lease, renewing them after each: a jump of fake time is not an agent that died."""
        left = ms
        while left > 0:
            step = left if not self.agent.running else min(left, LEASE_STEP_MS)
            self.clock.advance(step)
            left -= step
            await self._renew()

    async def _renew(self) -> None:
        held = [(t, run.offer.lease_id) for t, run in self.agent.running.items() if not run.lost]
        if held and self._leases is not None:
            await self._leases.heartbeat(held)

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
