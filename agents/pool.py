"""Guest processes: a warm pool per app version, one attempt per guest at a time.

A guest is ``python -m conveyor.agents.guest`` in its own session (so a kill takes its
children too), with a socketpair end as its only line to the agent, an environment without
CONVEYOR_* variables (no credentials), and RLIMIT_AS/RLIMIT_CPU set by the stub before user
code loads. With a ``SandboxPolicy`` it runs inside bubblewrap (``agents/bwrap.py``): another
user, its own namespaces, no network, the code read-only, a private /tmp, and process and
file-size limits too; without one (``--sandbox none``) it runs as the agent's user.

Guests are reused across tasks unless ``fresh_process``; a guest that died, broke the protocol,
was killed, or asked not to be reused is never handed another task.

Rule: a guest's reports count only for the job it was handed; frames naming another task id
are dropped, so a guest cannot complete or checkpoint a task it was not given.

Pipelining (``pipeline=True``, what a host agent with ``prefetch`` asks for): when every
guest is busy, a guest may also hold up to ``QUEUED_PER_GUEST`` queued jobs, which it starts
one after the other without a round trip to the agent. Frames sent to one guest in one turn of
the loop go in one write. So a guest wakes once for several tasks, and the agent's writes seldom
have to wake a guest: those wakeups were most of the CPU a no-op task cost (``conveyor bench
e2e``: guests 0.25 -> 0.13 ms and agent 0.16 -> 0.11 ms of CPU per task with 3 queued; with 1,
0.22 and 0.13). The pool never holds more than ``size_max`` guests: a launch that finds every
guest full, or still starting, waits for room. Only the running job (the first handed and not
done) may report. A queued job
- canceled: the guest never starts it and reports CANCELED;
- killed (the cancel grace, a lost lease): the agent withdraws it; the guest is not killed,
  unless the withdraw crossed the "done" of the job ahead: then the guest may have started it,
  and it is killed as for a running attempt (a guest is idle only when it runs nothing);
- waiting ``WITHDRAW_AFTER_S`` or more when another guest finishes a job: withdrawn and
  handed to a guest with room (so a slow job does not hold it back while others move on);
- on a guest that dies: fails as ``GuestCrashed`` ("before it started"), not counted as a
  crash of its task type, and is retried per its policy like the running one.

Concurrent attempts (a task type with ``concurrency`` N > 1, async handlers only): a job of
such a type goes first to a guest already running attempts of concurrent types and nothing
queued, while they number fewer than the smallest ``concurrency`` among them and it (the most
loaded such guest: packed, not spread). It runs there at once, ``beside`` the guest's first
attempt; only then does it take an idle guest or start one. Every attempt is still one lease
and one of the agent's slots, so the agent's accounting is unchanged: a guest running N
coroutines holds N leases. Each reports under its own task id. Nothing is queued behind a
guest running several. A kill of a concurrent attempt (the cancel grace, a lost lease) asks
the guest to "abort" it: its coroutine is cancelled at the await it waits in, its clean-up
runs, and the others go on. The coroutine may not let go (it blocks the loop, or swallows the
cancellation): after ``ABORT_GRACE_S`` its guest is killed, as for an attempt that runs alone,
and the attempts beside it fail as ``GuestCrashed`` (killed with another attempt; not counted
as crashes of their types) and are retried per their policy, like a queued job of a guest that
died. Waiting for them instead would let one stuck coroutine hold its neighbours' leases past
their own deadlines, and they run on a loop that is stuck too.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import signal
import socket
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any

from conveyor import logs
from conveyor.agents import bwrap
from conveyor.agents.frames import AsyncFrames, FrameError
from conveyor.agents.sandbox import (
    GUEST_CRASHED,
    AttemptResult,
    Hooks,
    Job,
    crashed,
    never_started,
)

log = logging.getLogger("conveyor.agent.pool")

OUTCOMES = frozenset({"SUCCEEDED", "FAILED", "FATAL", "CANCELED", "SLEEP", "FAN_OUT", "WAIT_EVENT"})
EXIT_WAIT_S = 5.0
QUEUED_PER_GUEST = 3  # jobs a busy guest holds to start next (with pipelining)
WITHDRAW_AFTER_S = 0.05  # a queued job waits this long behind a busy guest before it moves
REBALANCE_EVERY_S = 0.02
ABORT_GRACE_S = 2.0  # a concurrent attempt's coroutine has this long to end after an abort


class GuestStartError(Exception):
    """A guest could not start or import the app."""


class GuestProcess:
    """One guest and the attempts handed to it, in the order it runs them."""

    def __init__(self, proc: asyncio.subprocess.Process, serial: int, log_path: Path) -> None:
        self.log_path = str(log_path)  # the guest's stdout/stderr, every attempt appended
        self.proc = proc
        self.pid = proc.pid
        self.serial = serial
        self.tasks_run = 0
        self.attempts: deque[GuestSandbox] = deque()  # the first one is running
        self.beside: list[GuestSandbox] = []  # concurrent attempts running beside the first
        self.retiring = False  # asked not to be reused: nothing new goes to it
        self.hello: asyncio.Future[dict[str, Any] | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.frames: AsyncFrames | None = None

    async def connect(self, sock: socket.socket) -> None:
        self.frames = await AsyncFrames.open(sock, self._on_frame, self._on_close)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not (self.frames is None or self.frames.closed)

    def send(self, frame: dict[str, Any]) -> None:
        if self.frames is None:
            raise ConnectionResetError("the guest is not connected")
        self.frames.send(frame)

    def _on_frame(self, frame: dict[str, Any]) -> None:
        if not self.hello.done():
            self.hello.set_result(frame)
            return
        if frame.get("op") == "withdrawn":
            self._withdrawn(frame.get("task_id"))
            return
        # Rule: only the attempts running now may report; anything else is dropped.
        task_id = frame.get("task_id")
        for sandbox in self.running():
            if sandbox.job.task_id == task_id:
                sandbox.on_frame(frame)
                return
        log.warning("guest %d reported on a task it was not handed", self.pid)

    def running(self) -> list[GuestSandbox]:
        """The attempts it runs now: the first handed, and those beside it."""
        return [self.attempts[0], *self.beside] if self.attempts else []

    def ended(self, sandbox: GuestSandbox, *, reuse: bool) -> bool:
        """``sandbox`` reported done; True when it ran alone (the pool ``release``s the guest:
        it is idle, or starts its next queued job), False while others still run beside."""
        self.retiring = self.retiring or not reuse
        if sandbox in self.beside:
            self.beside.remove(sandbox)
            return False
        self.attempts.popleft()
        if self.beside:  # nothing is queued beside others: one of them is first now
            self.attempts.appendleft(self.beside.pop(0))
            return False
        return True

    def _withdrawn(self, task_id: Any) -> None:
        for sandbox in self.attempts:
            if sandbox.job.task_id == task_id and sandbox.withdrawing:
                self.attempts.remove(sandbox)
                sandbox.pool.moved(sandbox, self)
                if not self.attempts:
                    sandbox.pool.release(self, reuse=True)
                return

    def _on_close(self) -> None:
        if not self.hello.done():
            self.hello.set_result(None)
        for position, sandbox in enumerate(self.attempts):
            sandbox.on_close(started=position == 0)
        for sandbox in self.beside:
            sandbox.on_close(started=True)
        self.attempts.clear()
        self.beside.clear()

    def kill(self) -> None:
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signal.SIGKILL)

    def close(self) -> None:
        if self.frames is not None:
            self.frames.close()

    async def exit(self) -> None:
        """Ask politely, then kill."""
        with contextlib.suppress(OSError):
            self.send({"op": "exit"})
        try:
            await asyncio.wait_for(self.proc.wait(), EXIT_WAIT_S)
        except TimeoutError:
            self.kill()
            await self.proc.wait()
        self.close()


def describe_exit(code: int | None) -> str:
    if code is None:
        return "the guest closed its socket"
    if code < 0:
        try:
            name = signal.Signals(-code).name
        except ValueError:
            name = "unknown signal"
        return f"the guest was killed by signal {name} ({-code})"
    return f"the guest exited with code {code}"


class GuestSandbox:
    """One attempt in one guest process. Its frames come from the guest's protocol
    (``GuestProcess``): no task of its own, except one per step while the agent records it."""

    def __init__(
        self, pool: GuestPool, guest: GuestProcess, job: Job, hooks: Hooks, *, beside: bool
    ) -> None:
        self.pool = pool
        self.guest = guest
        self.job = job
        self.hooks = hooks
        self.pid: int | None = guest.pid
        self._killed: str | None = None
        self._collateral: str | None = None  # killed with another attempt of its guest
        self.concurrency = pool.concurrency_of.get(job.task_type, 1)
        self._cancel_sent = False
        self._started = True  # False: its guest died or it was killed before it started
        self.stopping = False  # asked to stop: no job is queued behind it
        self.withdrawing = False
        self.queued_at: float | None = None  # when it was queued behind a running job
        self._steps: set[asyncio.Task[None]] = set()
        self._done: asyncio.Future[dict[str, Any] | None] = (
            asyncio.get_running_loop().create_future()
        )
        self.place(guest, beside=beside)

    def place(self, guest: GuestProcess, *, beside: bool = False) -> None:
        """Hand the job to ``guest``: it runs it now (``beside`` its running ones, or alone),
        or next when it is busy."""
        # The attempt's output lands in the guest's own log file; the guest reports the byte
        # range it wrote. No file is opened and no descriptor passed per attempt.
        self.guest = guest
        self.pid = guest.pid
        self.withdrawing = False
        beside = beside and bool(guest.attempts)
        self.queued_at = asyncio.get_running_loop().time() if guest.attempts else None
        if beside:
            self.queued_at = None
            guest.beside.append(self)
        else:
            guest.attempts.append(self)
        try:
            guest.send(self._run_frame())
            if self._cancel_sent:
                guest.send({"op": "cancel", "task_id": self.job.task_id})
            guest.tasks_run += 1
        except (OSError, FrameError):
            self.on_close(started=beside or len(guest.attempts) == 1)

    @property
    def done(self) -> bool:
        return self._done.done()

    @property
    def queued(self) -> bool:
        """Handed to a guest that is still running another job first."""
        attempts = self.guest.attempts
        return bool(attempts) and attempts[0] is not self and self in attempts

    async def wait(self) -> AttemptResult:
        frame = await self._done
        if frame is not None:
            return self._result(frame)
        if self._killed is not None and not self._started:
            return never_started(self._killed)
        broken = self.guest.frames.broken if self.guest.frames is not None else None
        if broken is not None:
            self.guest.kill()
            self.pool.forget(self.guest)
            return crashed(f"the guest broke the frame protocol: {broken}", self.guest.log_path)
        return await self._died()

    def cancel(self) -> None:
        self.stopping = True
        self._cancel_sent = True
        self._send({"op": "cancel", "task_id": self.job.task_id})

    def kill(self, reason: str) -> None:
        if self._done.done():
            return
        self._killed = reason
        self.stopping = True
        if self.queued or self not in self.guest.running():
            # Not started (queued, or moving to another guest): take it back, spare the guest.
            # A queued one stays in its guest's line until the guest gives it back, for the
            # guest may start it before the withdraw gets there (``GuestPool.release``).
            if self.queued:
                self.withdraw()
            self._started = False
            self._done.set_result(None)
            return
        if self.concurrency > 1:
            self._abort()
            return
        for queued in list(self.guest.attempts)[1:]:  # not started: they run elsewhere
            self.guest.attempts.remove(queued)
            self.pool.moved(queued, self.guest)
        self.guest.kill()

    def _abort(self) -> None:
        """Stop this concurrent attempt's coroutine alone; its guest too if it will not."""
        self._send({"op": "abort", "task_id": self.job.task_id})
        loop = asyncio.get_running_loop()
        loop.call_later(ABORT_GRACE_S, self._abort_failed)

    def _abort_failed(self) -> None:
        if self._done.done() or not self.guest.alive:
            return
        guest = self.guest
        for other in guest.running():
            if other is not self:
                other._collateral = (
                    f"its guest was killed with task {self.job.task_id}, whose coroutine still "
                    f"ran {ABORT_GRACE_S:g} s after it was stopped ({self._killed})"
                )
        for queued in list(guest.attempts)[1:]:  # not started: they run elsewhere
            guest.attempts.remove(queued)
            self.pool.moved(queued, guest)
        guest.kill()

    def withdraw(self) -> None:
        """Ask the guest to give this queued job back (``moved`` follows its answer)."""
        self.withdrawing = True
        self._send({"op": "withdraw", "task_id": self.job.task_id})

    def _send(self, frame: dict[str, Any]) -> None:
        with contextlib.suppress(OSError, FrameError):
            self.guest.send(frame)

    def _run_frame(self) -> dict[str, Any]:
        job = self.job
        return {
            "op": "run",
            "task_id": job.task_id,
            "task_type": job.task_type,
            "attempt": job.attempt,
            "payload": job.payload,
            "checkpoint": job.checkpoint,
            "steps": job.steps,
            "started_ms": job.started_ms,
            "run_key": job.run_key,
            "compensating": job.compensating,
            "cpu_s": self.pool.cpu_s,
            "cpu_hard": self.pool.fresh_process,
            "concurrent": self.concurrency > 1,
            "trace_context": job.trace_context,
        }

    def on_frame(self, frame: dict[str, Any]) -> None:
        """A frame of this attempt, while it is the one its guest runs."""
        op = frame.get("op")
        if op == "heartbeat":
            self.hooks.on_heartbeat(frame.get("progress"))
        elif op == "checkpoint":
            self.hooks.on_checkpoint(frame.get("value"))
        elif op == "step":
            step = asyncio.get_running_loop().create_task(self._step(frame))
            self._steps.add(step)  # the loop holds tasks weakly
            step.add_done_callback(self._steps.discard)
        elif op == "done" and not self._done.done():
            self._done.set_result(frame)
            guest = self.guest
            if guest.ended(self, reuse=bool(frame.get("reuse", True))):
                self.pool.release(guest, reuse=not guest.retiring)
            else:
                self.pool.room()

    def on_close(self, *, started: bool) -> None:
        """The guest's socket closed (it died, was killed, or broke the framing)."""
        if not self._done.done():
            self._started = started
            self._done.set_result(None)

    async def _step(self, frame: dict[str, Any]) -> None:
        """The guest waits for the answer: the commit is durable before its body goes on."""
        position = frame.get("position")
        ack = await self.hooks.on_step(
            str(frame.get("step_op")),
            str(frame.get("identity")),
            position if isinstance(position, int) else -1,
            frame.get("value"),
        )
        reply = {"op": "step_ack", "task_id": self.job.task_id, "seq": frame.get("seq")}
        reply.update(ok=ack.ok, lost=ack.lost, transient=ack.transient, reason=ack.reason)
        self._send(reply)

    def _result(self, frame: dict[str, Any]) -> AttemptResult:
        outcome = frame.get("outcome")
        if outcome not in OUTCOMES:
            return crashed(f"the guest reported outcome {outcome!r}", self.guest.log_path)
        retry_after = frame.get("retry_after_ms")
        return AttemptResult(
            outcome=str(outcome),
            result=frame.get("result"),
            error_class=_str_or_none(frame.get("error_class")),
            error_message=_str_or_none(frame.get("error_message")),
            error_stack=_str_or_none(frame.get("error_stack")),
            retry_after_ms=int(retry_after) if isinstance(retry_after, int | float) else None,
            log_ref=_log_ref(self.guest.log_path, frame.get("log_range")),
            sleep=_sleep_of(frame.get("sleep")) if outcome == "SLEEP" else None,
            fan_out=_fan_out_of(frame.get("fan_out")) if outcome == "FAN_OUT" else None,
            wait=_wait_of(frame.get("wait")) if outcome == "WAIT_EVENT" else None,
        )

    async def _died(self) -> AttemptResult:
        try:
            code: int | None = await asyncio.wait_for(self.guest.proc.wait(), EXIT_WAIT_S)
        except TimeoutError:  # closed its socket but lives on: not to be trusted
            self.guest.kill()
            code = None
        self.pool.forget(self.guest)
        self.guest.close()
        if self._collateral is not None:  # not this type's crash: the other attempt's
            return AttemptResult(
                outcome="FAILED",
                error_class=GUEST_CRASHED,
                error_message=f"{self._collateral}; {describe_exit(code)}",
                log_ref=self.guest.log_path,
            )
        if self._killed is not None:
            return AttemptResult(
                outcome="FAILED",
                error_class="Killed",
                error_message=f"{self._killed}; {describe_exit(code)}",
                log_ref=self.guest.log_path,
            )
        if not self._started:  # the running job's fault, if anyone's: not a crash of this type
            return AttemptResult(
                outcome="FAILED",
                error_class=GUEST_CRASHED,
                error_message=f"{describe_exit(code)} before this attempt started",
            )
        return crashed(describe_exit(code), self.guest.log_path)


def _log_ref(path: str, raw: Any) -> str | None:
    """``path#start-end`` for the bytes an attempt wrote, None when it wrote nothing."""
    if not (isinstance(raw, list) and len(raw) == 2 and all(isinstance(n, int) for n in raw)):
        return None
    start, end = raw
    return f"{path}#{start}-{end}" if 0 <= start < end else None


# A guest's report of a step signal is reduced to well-typed fields: the guest is not trusted.


def _int(raw: dict[str, Any], name: str) -> int | None:
    value = raw.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _step(raw: dict[str, Any]) -> dict[str, Any]:
    """The step a signal was raised at: identity and position (-1 when it has none)."""
    position = _int(raw, "position")
    return {"identity": str(raw.get("identity")), "position": -1 if position is None else position}


def _sleep_of(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    return {**_step(raw), "sleep_ms": _int(raw, "sleep_ms"), "wake_at_ms": _int(raw, "wake_at_ms")}


def _fan_out_of(raw: Any) -> dict[str, Any] | None:
    """The gateway checks each child."""
    if not isinstance(raw, dict) or not isinstance(raw.get("children"), list):
        return None
    return {**_step(raw), "mode": str(raw.get("mode")), "children": raw["children"]}


def _wait_of(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        return None
    return {**_step(raw), "name": str(raw.get("name")), "timeout_ms": _int(raw, "timeout_ms")}


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


class GuestPool:
    """The ``Executor`` of a host agent: guest processes for one app version."""

    def __init__(
        self,
        app_ref: str,
        *,
        log_dir: str | Path,
        size_max: int = 8,
        warm: int = 1,
        fresh_process: bool = False,
        pipeline: bool = False,
        memory_mb: int | None = None,
        cpu_s: float | None = None,
        start_timeout_s: float = 60.0,
        sandbox: bwrap.SandboxPolicy | None = None,
        hidden: tuple[str, ...] = (),
        concurrency_of: dict[str, int] | None = None,
    ) -> None:
        self.app_ref = app_ref
        # Task types whose attempts run side by side in one guest, and how many at most.
        self.concurrency_of = {t: n for t, n in (concurrency_of or {}).items() if n > 1}
        self.log_dir = Path(log_dir)
        self.size_max = size_max
        self.warm = 0 if fresh_process else min(warm, size_max)
        self.fresh_process = fresh_process
        # One job queued behind the running one per guest (not with one process per task).
        self.queued_per_guest = QUEUED_PER_GUEST if pipeline and not fresh_process else 0
        self.queued_max = size_max * self.queued_per_guest
        self.sandbox = sandbox
        self.hidden = hidden  # paths a sandboxed guest must not see (the agent's home, logs)
        self._view: bwrap.HostView | None = None
        self.memory_mb = memory_mb or (sandbox.memory_mb if sandbox else None)
        self.cpu_s = cpu_s
        self.start_timeout_s = start_timeout_s
        self.idle: list[GuestProcess] = []
        self.guests: dict[int, GuestProcess] = {}  # every live guest, by pid
        self.spawned = 0
        self._spawning = 0
        self._serial = itertools.count(1)
        self._closing = False
        self._exiting: set[asyncio.Task[None]] = set()
        self._moving: set[asyncio.Task[None]] = set()
        self._rebalance_at: asyncio.TimerHandle | None = None
        self._rebalance_after = 0.0  # loop time
        self._room = asyncio.Event()  # set when a guest may have room for a queued job

    async def start(self) -> None:
        (self.log_dir / "guests").mkdir(parents=True, exist_ok=True)
        for guest in await asyncio.gather(*(self._spawn() for _ in range(self.warm))):
            self.idle.append(guest)

    async def launch(self, job: Job, hooks: Hooks) -> GuestSandbox:
        beside = self._beside(job.task_type)
        guest = beside or await self._take()
        return GuestSandbox(self, guest, job, hooks, beside=beside is not None)

    def _beside(self, task_type: str, avoid: GuestProcess | None = None) -> GuestProcess | None:
        """The most loaded guest that may run an attempt of ``task_type`` beside its running
        ones: all of concurrent types, nothing queued, none stopped, fewer than the smallest
        ``concurrency`` among them and this one."""
        room = self.concurrency_of.get(task_type, 1)
        if room <= 1 or self.fresh_process:
            return None
        found: GuestProcess | None = None
        for guest in self.guests.values():
            running = guest.running()
            if guest is avoid or guest.retiring or not guest.alive or len(guest.attempts) != 1:
                continue
            if any(s.concurrency <= len(running) or s.stopping for s in running):
                continue
            if len(running) < room and (found is None or len(running) > len(found.beside) + 1):
                found = guest
        return found

    def room(self) -> None:
        """An attempt ended in a guest that still runs others."""
        self._room.set()

    async def _take(self, avoid: GuestProcess | None = None) -> GuestProcess:
        while True:
            while self.idle:
                guest = self.idle.pop()
                if guest.alive:
                    return guest
                self.forget(guest)
            if not self.queued_max or len(self.guests) + self._spawning < self.size_max:
                return await self._spawn()
            busy = self._room_behind(avoid)
            if busy is not None:
                return busy
            # Every guest is full, or still starting: wait for room rather than start a guest
            # past ``size_max``. A job ending makes room at once; a starting guest taking its
            # first job, or a withdrawn one, by the next look.
            self._room.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._room.wait(), REBALANCE_EVERY_S)
            if self._closing:  # no guest may start after ``close``
                raise GuestStartError("the agent is stopping")

    def _room_behind(self, avoid: GuestProcess | None) -> GuestProcess | None:
        """A busy guest with room in its queue, whose running job was not asked to stop
        (``avoid`` only when no other has room)."""
        room = self.queued_per_guest
        found = None
        for guest in self.guests.values():
            attempts = guest.attempts
            if not 0 < len(attempts) <= room or attempts[0].stopping or not guest.alive:
                continue
            if guest.beside or guest.retiring:  # nothing waits behind several at once
                continue
            if guest is not avoid:
                return guest
            found = guest
        return found

    def release(self, guest: GuestProcess, *, reuse: bool) -> None:
        """``guest`` reported a job done, or gave back the last one in its line."""
        self._room.set()
        if guest.attempts and guest.attempts[0].done:
            # Its next job was killed while queued and is not given back: the withdraw crossed
            # this "done" (the guest answers the ones it got before it reports), so the guest
            # may be running it. Nothing is to run it any more: kill the guest.
            guest.kill()
            reuse = False
        keep = reuse and not self.fresh_process and not self._closing and guest.alive
        if keep and guest.attempts:
            self._rebalance()  # it starts its queued job now, and has room for another
            return
        if keep and len(self.idle) < self.size_max:
            self.idle.append(guest)
            self._rebalance()
            return
        for queued in list(guest.attempts):  # it will not start them: they run elsewhere
            guest.attempts.remove(queued)
            self.moved(queued, guest)
        self.forget(guest)
        task = asyncio.get_running_loop().create_task(guest.exit())
        self._exiting.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self._exiting.discard)

    def moved(self, sandbox: GuestSandbox, old: GuestProcess) -> None:
        """``sandbox``'s job left ``old`` before it started: hand it to another guest."""
        if sandbox.done:  # killed while queued: it runs nowhere
            return
        task = asyncio.get_running_loop().create_task(self._place(sandbox, old))
        self._moving.add(task)  # the loop holds tasks weakly
        task.add_done_callback(self._moving.discard)

    async def _place(self, sandbox: GuestSandbox, old: GuestProcess) -> None:
        if self._closing:
            sandbox.on_close(started=False)
            return
        try:
            beside = self._beside(sandbox.job.task_type, avoid=old)
            guest = beside or await self._take(avoid=old)
        except GuestStartError as exc:
            sandbox.on_close(started=False)
            log.warning("could not move task %s to a new guest: %s", sandbox.job.task_id, exc)
            return
        if sandbox.done:  # killed while it moved
            if not guest.attempts:
                self.release(guest, reuse=True)
            return
        sandbox.place(guest, beside=beside is not None)

    def _rebalance(self) -> None:
        """A guest finished a job: the jobs queued longest (at least ``WITHDRAW_AFTER_S``)
        behind busy guests are withdrawn, one per idle guest (at least one), and go where
        there is room, so a slow running job does not hold the next one back while other
        guests move on. Looks at most every ``REBALANCE_EVERY_S``; a timer looks again while
        younger jobs wait."""
        if not self.queued_max:
            return
        now = asyncio.get_running_loop().time()
        if now < self._rebalance_after:
            self._rebalance_later(self._rebalance_after - now)
            return
        self._rebalance_after = now + REBALANCE_EVERY_S
        idle = sum(1 for guest in self.idle if guest.alive)
        queued = [s for g in self.guests.values() for s in list(g.attempts)[1:]]
        queued = [s for s in queued if not s.withdrawing and s.queued_at is not None]
        queued.sort(key=lambda s: s.queued_at or 0.0)
        for sandbox in queued[: max(1, idle)]:
            waited = now - (sandbox.queued_at or now)
            if waited < WITHDRAW_AFTER_S:
                self._rebalance_later(WITHDRAW_AFTER_S - waited)
                return
            sandbox.withdraw()

    def _rebalance_later(self, delay_s: float) -> None:
        if self._rebalance_at is None:
            loop = asyncio.get_running_loop()
            self._rebalance_at = loop.call_later(delay_s, self._rebalance_timer)

    def _rebalance_timer(self) -> None:
        self._rebalance_at = None
        self._rebalance()

    def forget(self, guest: GuestProcess) -> None:
        self._room.set()
        self.guests.pop(guest.pid, None)
        if guest in self.idle:
            self.idle.remove(guest)

    async def close(self) -> None:
        self._closing = True
        if self._rebalance_at is not None:
            self._rebalance_at.cancel()
        live = list(self.guests.values())
        for guest in live:
            if guest not in self.idle:
                guest.kill()  # still running an attempt at shutdown
        await asyncio.gather(*(g.exit() for g in live), *self._exiting, return_exceptions=True)
        self.idle.clear()
        self.guests.clear()

    def _env(self) -> dict[str, str]:
        # No credentials in a guest; the same import path as the agent, so the app resolves.
        env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
        env["PYTHONPATH"] = os.pathsep.join(import_path())
        return env

    def sandbox_view(self) -> bwrap.HostView:
        """What a sandboxed guest sees of this host (worked out once)."""
        assert self.sandbox is not None
        if self._view is None:
            hidden = (str(self.log_dir), *self.hidden)
            self._view = bwrap.host_view(self.sandbox, import_path(), hidden, os.getcwd())
        return self._view

    async def _command(self, args: list[str]) -> tuple[list[str], dict[str, str], int | None]:
        """The guest's command line and environment, and the user namespace descriptor made
        for it (a root agent's sandbox) that it must inherit."""
        command = [sys.executable, "-m", "conveyor.agents.guest", *args]
        policy = self.sandbox
        if policy is None:
            return command, self._env(), None
        root = bwrap.privileged()
        command += bwrap.guest_args(policy, privileged=root)
        userns = await asyncio.to_thread(bwrap.new_userns, policy.uid, policy.gid) if root else None
        env = bwrap.guest_env(os.environ, import_path())
        argv = bwrap.argv(policy, self.sandbox_view(), command, env, userns_fd=userns)
        return argv, {"PATH": env["PATH"]}, userns

    async def _spawn(self) -> GuestProcess:
        self._spawning += 1  # until its process joins ``guests``: a starting guest counts once
        try:
            proc, serial, out_path, parent = await self._exec()
        finally:
            self._spawning -= 1
        guest = GuestProcess(proc, serial, out_path)
        self.guests[guest.pid] = guest
        self.spawned += 1
        await guest.connect(parent)
        await self._hello(guest, out_path)
        return guest

    async def _exec(self) -> tuple[asyncio.subprocess.Process, int, Path, socket.socket]:
        serial = next(self._serial)
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        args = ["--app", self.app_ref, "--fd", str(child.fileno())]
        if logs.json_wanted():  # guests log as their agent does
            args.append("--log-json")
        if self.memory_mb:
            args += ["--memory-mb", str(self.memory_mb)]
        out_path = self.log_dir / "guests" / f"guest-{os.getpid()}-{serial}.log"
        userns = None
        # The agent opens the log file: the guest writes to it through the descriptors only.
        with open(out_path, "ab") as out:
            try:
                command, env, userns = await self._command(args)
                proc = await asyncio.create_subprocess_exec(
                    *command,
                    pass_fds=[child.fileno()] if userns is None else [child.fileno(), userns],
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                    env=env,
                    start_new_session=True,
                )
            except (OSError, subprocess.SubprocessError) as exc:  # no namespace, no process
                raise GuestStartError(f"could not start a guest: {exc}") from exc
            finally:
                child.close()
                if userns is not None:
                    os.close(userns)
        return proc, serial, out_path, parent

    async def _hello(self, guest: GuestProcess, out_path: Path) -> None:
        try:
            hello = await asyncio.wait_for(asyncio.shield(guest.hello), self.start_timeout_s)
        except TimeoutError:
            hello = None
        if hello is not None and hello.get("ok"):
            return
        guest.kill()
        await guest.proc.wait()
        self.forget(guest)
        guest.close()
        if hello is not None:  # it could not import the app, and said why (startup.py)
            raise GuestStartError(
                f"a guest cannot import the app {self.app_ref}:\n{hello.get('error')}\n"
                f"(the whole traceback: {out_path})"
            )
        raise GuestStartError(
            f"guest for {self.app_ref} failed to start: {describe_exit(guest.proc.returncode)}; "
            f"no hello; see {out_path}"
        )


def import_path() -> list[str]:
    """The agent's import path (its directory first), so a guest resolves the app the same."""
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    return list(dict.fromkeys([os.getcwd(), *paths]))
