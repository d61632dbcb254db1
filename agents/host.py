"""The host agent: holds the credentials and the lease ids, claims work, runs it in sandboxes.

Loops, all on one event loop:
- poll:       long-poll with the free capacity for the app's task types, less those whose
              circuit breaker is open (``breaker.py``; paused only while all are). With
              ``prefetch`` the agent holds up to that many leases beyond its guests: they wait
              here for a free guest (heartbeated, their start_to_close running: the platform
              counts from the lease too); ``prefetch=None`` adapts it to the agent's pace
              (``agents/prefetch.py``), so the next tasks are at hand when a guest frees up
              instead of one poll round trip away, and polls and grants come in larger batches:
              while it holds more leases than guests, it polls once a quarter of ``prefetch``
              is free, not for every lease that ends; but at once after an answer with fewer
              leases than it asked for (the rest may be waiting at the node for its next poll).
              With it, a busy guest also holds a few of them queued (``GuestPool``
              pipelining): it starts the next as soon as it is done, without a round trip.
- heartbeat:  every ``heartbeat_s``, ONE call for all running leases (after flushing pending
              checkpoints). CANCEL -> the handler's ctx.cancelled, then a kill after the cancel
              grace. LOST -> kill and drop: nothing is reported for a lost lease.
- signals:    ONE long-poll the node answers when a lease held here is asked to stop
              (``agents/signals.py``): the same stop as a heartbeat's CANCEL, within a round
              trip instead of up to ``heartbeat_s``.
- deadlines:  the local start_to_close (ask the handler to stop, kill after the grace) and
              the kills due at the end of a grace.
- complete:   ``completer.Completer``: batched completions, checkpoints first.

The loops retry what the platform refuses or fails (``ConveyorError``); any other error stops
the agent as a whole, and ``run`` raises it: an agent with a dead loop would go on half alive
(say, heartbeating leases it never completes, or holding guests it never fills), where a
stopped one is restarted by its supervisor and its leases are retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import socket
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol

from conveyor.agents import bwrap
from conveyor.agents.breaker import Breaker, BreakerPolicy, Breakers
from conveyor.agents.cluster import ClusterWorkerAPI
from conveyor.agents.completer import Completer
from conveyor.agents.inline import InlineExecutor
from conveyor.agents.pool import GuestPool, import_path
from conveyor.agents.prefetch import Prefetch
from conveyor.agents.runner import app_ref_of, load_app
from conveyor.agents.running import NOTHING, Running, final_result
from conveyor.agents.sandbox import AttemptResult, Executor, Job, crashed, never_started
from conveyor.agents.signals import SignalsAPI, listen
from conveyor.agents.worker_api import (
    CANCEL,
    LOST,
    CheckpointItem,
    LeaseOffer,
    StepItem,
    WorkerAPI,
)
from conveyor.app import App
from conveyor.avro_schema import definitions
from conveyor.errors import ContractError, ConveyorError, TransientError
from conveyor.schemas.limits import POLL_CAPACITY_MAX
from conveyor.steps import StepAck

log = logging.getLogger("conveyor.agent")

CONCURRENCY = 8  # tasks an agent runs at once (its guests) unless told otherwise
RETRY_PAUSE_S = 1.0  # after a failed poll or heartbeat round


class AgentClock(Protocol):
    """The agent's local time (``conveyor.streams.clock`` clocks fit)."""

    def monotonic_ms(self) -> float: ...

    async def sleep_ms(self, ms: float) -> None: ...


class RealClock:
    def monotonic_ms(self) -> float:
        return time.monotonic() * 1000.0

    async def sleep_ms(self, ms: float) -> None:
        await asyncio.sleep(max(0.0, ms) / 1000.0)


class Wake:
    """``set()`` from anywhere on the loop; ``wait(clock, ms)`` returns on a set or timeout."""

    def __init__(self) -> None:
        self._event = asyncio.Event()

    def set(self) -> None:
        self._event.set()

    async def wait(self, clock: AgentClock, timeout_ms: float) -> None:
        if not self._event.is_set():
            waiter = asyncio.ensure_future(self._event.wait())
            sleeper = asyncio.ensure_future(clock.sleep_ms(timeout_ms))
            try:
                await asyncio.wait([waiter, sleeper], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for future in (waiter, sleeper):
                    future.cancel()
        self._event.clear()


class HostAgent:
    def __init__(
        self,
        api: WorkerAPI,
        app: App | str,
        *,
        app_ref: str | None = None,
        concurrency: int = CONCURRENCY,
        prefetch: int | None = 0,
        heartbeat_s: float = 10.0,
        lease_s: float = 30.0,
        poll_wait_s: float = 20.0,
        queues: tuple[str, ...] = (),
        fresh_process: bool = False,
        memory_mb: int | None = None,
        cpu_s: float | None = None,
        log_dir: str | Path | None = None,
        agent_id: str | None = None,
        executor: Executor | None = None,
        sandbox: bwrap.SandboxPolicy | None = None,
        clock: AgentClock | None = None,
        breaker: BreakerPolicy | None = None,
        complete_window_ms: float = 5.0,
        deploy: int | None = None,
        home: str | Path | None = None,
    ) -> None:
        if isinstance(app, str):
            app_ref, app = app, load_app(app)
        self.api = api
        self.app = app
        self.concurrency = concurrency
        self.prefetch = Prefetch.of(concurrency, prefetch)
        self.heartbeat_ms = heartbeat_s * 1000
        self.lease_ms = int(lease_s * 1000)
        self.poll_wait_ms = int(poll_wait_s * 1000)
        self.queues = queues
        self.deploy = deploy  # orders this agent's version among deploys (registry.py rule 2)
        self.agent_id = agent_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.clock: AgentClock = clock or RealClock()
        self.home = Path(home if home is not None else os.environ.get("CONVEYOR_HOME", ".conveyor"))
        self.executor = executor or self._guest_pool(
            app_ref, fresh_process, memory_mb, cpu_s, log_dir, sandbox
        )
        self._breakers = Breakers(breaker or BreakerPolicy(), self.app.name)
        self.running: dict[str, Running] = {}
        self.completer = Completer(api, window_ms=complete_window_ms)
        self._attempts: set[asyncio.Task[None]] = set()
        # Leases beyond it wait for a guest (or a place queued behind a running attempt).
        self._guests = asyncio.Semaphore(concurrency + self.executor.queued_max)
        self.started = asyncio.Event()  # set once registered and claiming work
        self._stop = asyncio.Event()
        self._now = asyncio.Event()  # stop(now=True): the drain ends at once
        self._slot = Wake()
        self._hb_wake = Wake()
        self._dl_wake = Wake()

    def _guest_pool(
        self,
        app_ref: str | None,
        fresh_process: bool,
        memory_mb: int | None,
        cpu_s: float | None,
        log_dir: str | Path | None,
        sandbox: bwrap.SandboxPolicy | None,
    ) -> GuestPool:
        ref = app_ref or app_ref_of(self.app)
        if ref is None:
            raise ContractError(
                f"guests import the app by reference: pass app_ref='module:attr' for {self.app}"
            )
        home = self.home  # guests' logs go under it; it is hidden from them
        return GuestPool(
            ref,
            log_dir=log_dir or home / "logs" / self.app.name,
            size_max=self.concurrency,
            fresh_process=fresh_process,
            pipeline=self.prefetch.cap > 0,
            memory_mb=memory_mb,
            cpu_s=cpu_s,
            sandbox=sandbox,
            hidden=(str(home),),
            concurrency_of={n: t.options.concurrency for n, t in self.app.tasks.items()},
        )

    # -- public surface ---------------------------------------------------------------------

    @property
    def breakers(self) -> dict[str, Breaker]:
        return dict(self._breakers.by_type)

    @property
    def busy(self) -> bool:
        """Running an attempt, or holding a completion not yet acknowledged."""
        return bool(self.running) or self.completer.unacked > 0

    def stop(self, *, now: bool = False) -> None:
        """Stop claiming work and drain (``run``); ``now``, also while draining: kill what
        still runs at once (reported as killed attempts, so they are retried at once)."""
        self._stop.set()
        if now:
            self._now.set()

    def heartbeat_now(self) -> None:
        self._hb_wake.set()

    async def run(self, *, drain_s: float = 0.0) -> None:
        """Run until ``stop()``; then stop claiming, let attempts finish for up to ``drain_s``,
        kill the rest (reported as failed attempts, so they retry at once), flush, close. A loop
        that fails stops it at once (its leases lapse and are retried), raising its error."""
        await self.executor.start()
        loops: list[asyncio.Task[None]] = []
        try:
            await self.api.register(
                agent_id=self.agent_id,
                app=self.app.name,
                version=self.app.version,
                task_types=sorted(self.app.tasks),
                pinned=sorted(n for n, t in self.app.tasks.items() if t.options.resume == "pinned"),
                deploy=self.deploy,
                definitions=definitions(self.app, warn=log.warning),
            )
            for name, loop in (
                ("heartbeat", self._heartbeats()),
                ("deadlines", self._deadlines()),
                ("complete", self.completer.run()),
                *self._signals(),
                ("poll", self._polls()),
            ):
                loops.append(asyncio.create_task(loop, name=name))
            self.started.set()
            log.info("agent %s serving %s (%d slots)", self.agent_id, self.app, self.concurrency)
            failed = await self._until_stopped(loops)
            if failed is not None:
                failed.result()  # raises the loop's error (the loops never return)
            loops[-1].cancel()
            await self._drain(drain_s)
        finally:
            await self._shutdown(loops)

    async def _until_stopped(self, loops: list[asyncio.Task[None]]) -> asyncio.Task[None] | None:
        """Wait for ``stop()``, or for a loop to fail: then the loop, else None."""
        stopped = asyncio.create_task(self._stop.wait())
        try:
            done, _ = await asyncio.wait([stopped, *loops], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        failed = next((loop for loop in loops if loop in done), None)
        if failed is not None:
            why = failed.exception()
            log.error(
                "agent %s: %s loop failed (%r); stopping", self.agent_id, failed.get_name(), why
            )
        return failed

    async def _drain(self, drain_s: float) -> None:
        # Leases not started yet go back at once (RELEASED: ready for another agent, no
        # attempt spent); the attempts under way get up to ``drain_s`` to finish.
        held = [run for run in self.running.values() if not run.started]
        for run in held:
            run.kill("the agent is stopping")
        for _ in held:  # let each through the slot it waits for: it reports and gives it back
            self._guests.release()  # (no poll runs any more to take a slot)
        if self._attempts and drain_s > 0 and not self._now.is_set():
            finished = asyncio.ensure_future(asyncio.wait(set(self._attempts)))
            now = asyncio.ensure_future(self._now.wait())
            try:
                await asyncio.wait(
                    {finished, now}, timeout=drain_s, return_when=asyncio.FIRST_COMPLETED
                )
            finally:
                for waiter in (finished, now):
                    waiter.cancel()
        for run in list(self.running.values()):
            run.kill("the agent is stopping")
        if self._attempts:
            await asyncio.wait(set(self._attempts), timeout=10)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.completer.flushed(), timeout=10)

    async def _shutdown(self, loops: list[asyncio.Task[None]]) -> None:
        for task in (*loops, *self._attempts):
            task.cancel()
        await asyncio.gather(*loops, *self._attempts, return_exceptions=True)
        await self.executor.close()

    # -- claiming work ----------------------------------------------------------------------

    async def _polls(self) -> None:
        # A poll answers soon after it holds a lease; the grants of its other slots still in
        # flight wait at the node for this agent's next poll (streams/processor/mailbox.py),
        # and lapse if none comes within their lease. So after a short answer, ask again at
        # once, whatever the batching rule below says.
        short = False
        while True:
            prefetch = self.prefetch.size(self.clock.monotonic_ms())
            free = self.concurrency + prefetch - len(self.running)
            # Free slots worth a poll while leases remain: a quarter of the prefetch.
            batching = free < max(1, prefetch // 4) and len(self.running) > self.concurrency
            if free <= 0 or (batching and not short):
                # Leases in hand keep every guest busy: wait to ask for a batch, not one.
                await self._slot.wait(self.clock, 1_000)
                continue
            held_back = [b.task_type for b in self._breakers.open_now(self.clock.monotonic_ms())]
            served = sorted(set(self.app.tasks) - set(held_back))
            if not served:
                await self._wait_for_a_breaker()
                continue
            capacity = min(free, POLL_CAPACITY_MAX)  # past it: the next poll asks for the rest
            try:
                offers = await self.api.poll(
                    agent_id=self.agent_id,
                    app=self.app.name,
                    version=self.app.version,
                    queues=list(self.queues),
                    capacity=capacity,
                    wait_ms=self.poll_wait_ms,
                    lease_ms=self.lease_ms,
                    task_types=served,
                    open_breakers=sorted(held_back),
                )
            except ConveyorError as exc:
                log.warning("poll failed: %s; retrying", exc)
                await asyncio.sleep(RETRY_PAUSE_S)
                continue
            short = 0 < len(offers) < capacity
            for offer in offers:
                self._start(offer)

    async def _wait_for_a_breaker(self) -> None:
        """Every type's breaker is open: nothing to poll for until the first cools down."""
        now = self.clock.monotonic_ms()
        reopen = self._breakers.reopens_at_ms() or now + 1_000
        await self._slot.wait(self.clock, max(1.0, min(1_000.0, reopen - now)))

    def _start(self, offer: LeaseOffer) -> None:
        task_type = self.app.tasks.get(offer.task_type)
        grace_ms = offer.cancel_grace_ms
        if grace_ms is None:
            grace_ms = task_type.options.cancel_grace_ms if task_type else 30_000
        run = Running(
            offer,
            started_ms=self.clock.monotonic_ms(),
            grace_ms=grace_ms,
            step_writer=self._write_step,
        )
        self._drop_stale(offer)
        self.running[offer.task_id] = run
        task = asyncio.create_task(self._attempt(run))
        self._attempts.add(task)
        task.add_done_callback(self._attempts.discard)
        if offer.start_to_close_ms is not None:
            self._dl_wake.set()

    def _drop_stale(self, offer: LeaseOffer) -> None:
        """A new lease of a task still running here: the node granted it again because the
        old lease lapsed (say, heartbeats failed for a while), so the old attempt is lost."""
        old = self.running.get(offer.task_id)
        if old is None or old.offer.lease_id == offer.lease_id:
            return
        log.info(
            "task %s: lease %d replaced by %d", offer.task_id, old.offer.lease_id, offer.lease_id
        )
        old.lost = True
        old.kill("the lease was lost")

    async def _attempt(self, run: Running) -> None:
        offer = run.offer
        job = Job(
            task_id=offer.task_id,
            task_type=offer.task_type,
            attempt=offer.attempt,
            payload=offer.payload,
            checkpoint=offer.checkpoint,
            steps=offer.steps,
            started_ms=offer.started_ms,
            run_key=offer.run_key,
            compensating=offer.compensating,
            trace_context=offer.trace_context,
        )
        try:
            async with self._guests:
                result = await self._execute(run, job)
        finally:
            # Only its own entry: a newer lease of the same task may hold the id by now.
            if self.running.get(offer.task_id) is run:
                del self.running[offer.task_id]
            self.prefetch.ended(self.clock.monotonic_ms())
            self._slot.set()
        if run.lost:
            log.info("task %s: lease %d lost; dropped", offer.task_id, offer.lease_id)
            return
        final = final_result(run, result)
        if final.outcome != "RELEASED":  # a task that never ran says nothing of its health
            self._breakers.record(
                offer.task_type,
                crashed=final.crashed,
                why=final.error_message or "",
                now_ms=self.clock.monotonic_ms(),
            )
        checkpoint = None
        if run.checkpoint is not NOTHING:
            checkpoint = CheckpointItem(
                task_id=offer.task_id, lease_id=offer.lease_id, value=run.checkpoint
            )
        await self.completer.put(run.completion(final), checkpoint)

    async def _execute(self, run: Running, job: Job) -> AttemptResult:
        if run.stop_reason is not None or run.kill_reason is not None:
            # Canceled, timed out, lost or killed while waiting for a guest (prefetch): never
            # start it. ``final_result`` turns a stop reason into the outcome to report.
            return never_started(run.kill_reason or run.stop_reason or "")
        if self._breakers.is_open(job.task_type, self.clock.monotonic_ms()):
            # Granted to a poll sent before the breaker opened: hand it back unstarted.
            return never_started(f"the circuit breaker of task type {job.task_type!r} is open")
        try:
            run.attach(await self.executor.launch(job, run))
        except Exception as exc:  # e.g. the guest could not import the app
            return crashed(f"could not start a sandbox: {exc}")
        assert run.sandbox is not None
        return await run.sandbox.wait()

    # -- durable steps ----------------------------------------------------------------------

    async def _write_step(
        self, run: Running, op: str, identity: str, position: int, value: Any
    ) -> StepAck:
        """A guest's step claim or commit, sent under the lease only the agent knows. One
        call per step: the body waits for its commit to be durable anyway."""
        if run.lost:
            return StepAck(ok=False, lost=True, reason="the lease was lost")
        item = StepItem(
            task_id=run.offer.task_id,
            lease_id=run.offer.lease_id,
            op=op,
            identity=identity,
            position=position,
            value=value,
        )
        try:
            (result,) = await self.api.steps([item])
        except TransientError as exc:
            return StepAck(ok=False, transient=True, reason=str(exc))
        except ConveyorError as exc:
            return StepAck(ok=False, reason=str(exc))
        if result.ok:
            return StepAck(ok=True)
        if _fenced(result.reason):
            run.lost = True  # dropped: nothing is reported for this attempt
            return StepAck(ok=False, lost=True, reason=result.reason)
        return StepAck(ok=False, reason=result.reason)

    # -- heartbeats and deadlines -----------------------------------------------------------

    async def _heartbeats(self) -> None:
        while True:
            await self._hb_wake.wait(self.clock, self.heartbeat_ms)
            try:
                await self._flush_checkpoints()
            except ConveyorError as exc:  # one refused checkpoint must not lapse every lease
                log.warning("saving checkpoints failed: %s", exc)
            try:
                # Ended attempts whose report is not through yet hold their leases too: let
                # them lapse and a slow completion makes the platform run the work again.
                live = dict(self.completer.unreported)
                live.update((t, r.offer.lease_id) for t, r in self.running.items() if not r.lost)
                actions = await self.api.heartbeat(list(live.items())) if live else {}
            except ConveyorError as exc:
                log.warning("heartbeat round failed: %s", exc)
                continue
            for task_id, action in actions.items():
                run = self.running.get(task_id)
                # The reply is about the lease sent: the task may hold a newer one by now.
                if run is None or run.offer.lease_id != live.get(task_id):
                    continue
                if action == LOST:
                    run.lost = True
                    run.kill("the lease was lost")
                elif action == CANCEL:
                    self._request_stop(run, "CANCEL")

    async def _flush_checkpoints(self) -> None:
        """Send the newest checkpoint of each running attempt. If they fail to go out, each
        goes again with the next round, unless its handler saved a newer one meanwhile."""
        async with self.completer.checkpoint_lock:
            sent = [
                (run, run.checkpoint)
                for run in self.running.values()
                if run.checkpoint is not NOTHING and not run.lost
            ]
            for run, _ in sent:
                run.checkpoint = NOTHING
            if not sent:
                return
            items = [
                CheckpointItem(task_id=run.offer.task_id, lease_id=run.offer.lease_id, value=v)
                for run, v in sent
            ]
            try:
                await self._save_checkpoints(items)
            except ConveyorError:
                for run, value in sent:
                    if run.checkpoint is NOTHING:
                        run.checkpoint = value
                raise

    async def _save_checkpoints(self, items: list[CheckpointItem]) -> None:
        """The platform refuses a whole request for one bad item (say, a value too large):
        then each goes alone, so the others are saved and only the bad one is dropped."""
        try:
            await self.api.checkpoint(items)
            return
        except ContractError as exc:
            if len(items) == 1:
                log.error("checkpoint of %s refused, dropped: %s", items[0].task_id, exc)
                return
        for item in items:
            await self._save_checkpoints([item])

    def _signals(self) -> list[tuple[str, Coroutine[Any, Any, None]]]:
        """The loop of cancels the node pushes (``agents/signals.py``), if the API has them."""
        if not isinstance(self.api, SignalsAPI):
            return []
        api: SignalsAPI = self.api
        return [
            ("signals", listen(api, agent_id=self.agent_id, app=self.app.name, stop=self._signaled))
        ]

    def _signaled(self, task_id: str, lease_id: int) -> None:
        """A pushed cancel: the same stop as a heartbeat's CANCEL, for that lease only."""
        run = self.running.get(task_id)
        if run is not None and run.offer.lease_id == lease_id and not run.lost:
            self._request_stop(run, "CANCEL")

    def _request_stop(self, run: Running, reason: str) -> None:
        if run.stop(reason, self.clock.monotonic_ms()):
            self._dl_wake.set()

    async def _deadlines(self) -> None:
        while True:
            now = self.clock.monotonic_ms()
            for run in list(self.running.values()):
                if run.kill_at_ms is not None and now >= run.kill_at_ms:
                    run.kill(f"the cancel grace of {run.grace_ms} ms is over")
                elif run.deadline_ms is not None and now >= run.deadline_ms:
                    self._request_stop(run, "START_TO_CLOSE")
            due = [t for r in self.running.values() for t in r.next_deadlines()]
            sleep_ms = min(1_000.0, max(1.0, min(due) - now)) if due else 1_000.0
            await self._dl_wake.wait(self.clock, sleep_ms)

    # -- completions ------------------------------------------------------------------------


def _fenced(reason: str | None) -> bool:
    """Whether a refusal says the lease is gone (the machine's ``holder`` reasons)."""
    text = reason or ""
    return text.startswith(("stale lease", "task is ", "unknown task"))


async def run_agent(
    url: str,
    api_key: str,
    app_ref: str,
    *,
    concurrency: int = CONCURRENCY,
    prefetch: int | None = None,
    heartbeat_s: float = 10.0,
    lease_s: float = 30.0,
    poll_wait_s: float = 20.0,
    queues: tuple[str, ...] = (),
    fresh_process: bool = False,
    memory_mb: int | None = None,
    cpu_s: float | None = None,
    log_dir: str | Path | None = None,
    drain_s: float = 30.0,
    in_process: bool = False,
    deploy: int | None = None,
    sandbox: str = "bwrap",
    allow_net: bool = False,
    home: str | Path | None = None,
    control: Callable[[HostAgent], None] | None = None,
) -> None:
    """Serve ``app_ref`` ("module:attr") against the gateway at ``url`` until SIGINT/SIGTERM
    (what ``conveyor agent`` and ``conveyor dev`` call).

    ``control``: the caller stops the agent itself (``conveyor dev``: a drain it counts down,
    a reload): it is handed the agent before it starts, and no signal handler is set here.

    ``in_process``: run handlers on threads of this process (``InlineExecutor``) instead of
    guest processes. No isolation and no kill: a handler shares the agent's memory and its
    credentials, as in a Celery or Dramatiq worker. For trusted code that wants the guest hop's
    CPU back; the limits, fresh-process and log capture options do not apply.

    ``sandbox``: "bwrap" runs guests in bubblewrap (``agents/bwrap.py``; ``allow_net`` lets them
    reach the network), failing at once with ``bwrap.SandboxUnavailable`` when it cannot;
    "none" runs them as this process's user, for trusted code only; "auto" (``conveyor dev``)
    is bwrap when it works here, else none with one warning.

    ``home``: the node's data directory (``--home``), where guests' logs go
    (``<home>/logs/<app>``) unless ``log_dir`` says; default $CONVEYOR_HOME, else ./.conveyor."""
    policy = _sandbox_policy(sandbox, allow_net, memory_mb, in_process)
    _hide_credentials()
    api = ClusterWorkerAPI(url, api_key)  # every node of its cluster (agents/cluster.py)
    executor = InlineExecutor(load_app(app_ref), threads=concurrency) if in_process else None
    agent = HostAgent(
        api,
        app_ref,
        concurrency=concurrency,
        prefetch=prefetch,
        heartbeat_s=heartbeat_s,
        lease_s=lease_s,
        poll_wait_s=poll_wait_s,
        queues=queues,
        fresh_process=fresh_process,
        memory_mb=memory_mb,
        cpu_s=cpu_s,
        log_dir=log_dir,
        executor=executor,
        deploy=deploy,
        sandbox=policy,
        home=home,
    )
    loop = asyncio.get_running_loop()
    signals = (signal.SIGINT, signal.SIGTERM) if control is None else ()
    if control is not None:
        control(agent)
    for sig in signals:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, agent.stop)
    try:
        await agent.run(drain_s=drain_s)
    finally:
        for sig in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):
                loop.remove_signal_handler(sig)
        await api.close()


def _hide_credentials() -> None:
    """Make this process non-dumpable, so no process of the same user (a guest with
    ``--sandbox none``, or anything else) can read its /proc/<pid>/environ or memory, and drop
    the key from ``os.environ`` now that it was read: nothing started from here inherits it."""
    if not bwrap.make_non_dumpable():
        log.warning("could not make the agent non-dumpable: its memory is readable by its user")
    os.environ.pop("CONVEYOR_API_KEY", None)


def _sandbox_policy(
    sandbox: str, allow_net: bool, memory_mb: int | None, in_process: bool
) -> bwrap.SandboxPolicy | None:
    """The guests' confinement for ``--sandbox``; checked by starting one sandboxed
    interpreter, so a missing or broken bwrap stops the agent before it claims any work."""
    if in_process:
        return None
    if sandbox == "none":
        log.warning(
            "--sandbox none: guests run as the agent's own user, with its network and files and "
            "no process or file limits. Trusted code only."
        )
        return None
    if sandbox not in ("bwrap", "auto"):
        raise ValueError(f"--sandbox {sandbox!r}: expected bwrap or none")
    policy = bwrap.SandboxPolicy(allow_net=allow_net)
    if memory_mb:
        policy = dataclasses.replace(policy, memory_mb=memory_mb)
    paths = import_path()
    view = bwrap.host_view(policy, paths, (), os.getcwd())
    problem = bwrap.probe(policy, view, bwrap.guest_env(os.environ, paths))
    if problem is None:
        return bwrap.resolved(policy)
    if sandbox == "auto":  # conveyor dev, where bwrap was not asked for
        log.warning("guests run unsandboxed: %s", problem)
        return None
    raise bwrap.SandboxUnavailable(
        f"{problem}. The agent does not run guests unsandboxed: fix bwrap, or pass "
        "--sandbox none for trusted code"
    )
