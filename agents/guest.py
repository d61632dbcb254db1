"""The in-guest stub: ``python -m conveyor.agents.guest --app module:attr --fd N``.

Rules, from the trust boundary (design Q6):
1. The stub holds no credentials and never sees a lease id. It talks only to its agent, over
   the socket inherited as fd N; the agent maps every report to the lease it handed this guest.
2. Resource limits are set before any user code is imported: RLIMIT_AS for memory for the
   life of the process; RLIMIT_CPU per attempt (a soft budget on top of the CPU already used,
   or a hard one too when the agent runs one process per task); in a sandbox also RLIMIT_NPROC
   and RLIMIT_FSIZE, after the switch to the guest's own user (``--drop-to``, a root agent's
   sandbox: ``agents/bwrap.py``). Soft and hard alike, so user code cannot raise them.
3. Each attempt's stdout/stderr go to the file whose descriptor came with its "run" frame.

A guest runs one attempt at a time, unless the agent hands it attempts of an async task type
with ``concurrency`` > 1 ("run" with ``concurrent``): those start at once on the guest's one
event loop (``conveyor.loops``, where every async handler of the guest runs) and run side by
side, each reporting under its own task id; an attempt handed without ``concurrent`` waits
until they are done. The agent stops one of them with "abort": its coroutine is cancelled at
the await it is stopped at and reported as killed; the others go on.

It has no reader thread: whichever thread needs the next frame reads it (``Inbox``): the main
thread while the guest is idle or runs only concurrent attempts, and while a handler runs,
the thread that reads ``ctx.cancelled`` (a non-blocking look at most every ``POLL_EVERY_S``),
waits in ``ctx.wait_cancelled`` or waits for a step's ack. So a cancel reaches a handler that
looks for it, and a task costs the guest one wakeup, not a wakeup and a hand-off.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import logging
import math
import os
import resource
import socket
import sys
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from conveyor import logs, tracing
from conveyor.agents.frames import BlockingFrames, FrameError
from conveyor.agents.runner import load_app, run_async, run_sync, unknown_type
from conveyor.agents.sandbox import AttemptResult
from conveyor.agents.startup import import_failure
from conveyor.app import App, TaskType
from conveyor.context import Context
from conveyor.loops import Flight, Lane, share_one_loop
from conveyor.process import tune_malloc
from conveyor.steps import StepAck

Run = dict[str, Any]  # a "run" frame

LOST_AGENT = StepAck(ok=False, lost=True, reason="the agent went away")
NEVER_STARTED = AttemptResult(
    outcome="CANCELED", error_class="Canceled", error_message="canceled before it started"
)
POLL_EVERY_S = 0.001  # ctx.cancelled looks at the socket at most this often
IDLE_LOOK_S = 0.01  # how often an attempt waiting for the concurrent ones looks if they ended
ABORTED = AttemptResult(
    outcome="FAILED",
    error_class="Killed",
    error_message="the agent stopped this attempt: its coroutine was cancelled at an await",
)
# What a "done" frame carries of an AttemptResult (None fields are left out).
REPORTED = ("outcome", "result", "error_class", "error_message", "error_stack")
REPORTED_TOO = ("retry_after_ms", "sleep", "fan_out", "wait")


class Inbox:
    """The frames the agent sent, read by whichever thread waits for one (one at a time).

    The reading thread files each frame: a "run" joins ``jobs`` (the agent may hand a busy
    guest a few jobs to start next); a "cancel" reaches the context of the running attempt it
    names, or marks its queued job, which then never starts; an "abort" cancels the coroutine
    of the concurrent attempt it names; a "withdraw" takes a queued job back (answered
    "withdrawn"; a job already started is not answered: the agent learns it started from the
    "done" before it, see ``Guest.run``); a "step_ack" goes to the channel of the running
    attempt it names; "exit" or EOF or a broken frame closes the inbox."""

    def __init__(self, frames: BlockingFrames) -> None:
        self.frames = frames
        self.jobs: deque[Run] = deque()
        self.closed = False
        self._cond = threading.Condition()
        self._reading = False
        self._polled_at = 0.0
        # The attempts running now, by task id: one, or several concurrent ones.
        self._current: dict[str, Context] = {}
        self._channels: dict[str, GuestChannel] = {}
        self._flying: dict[str, Flight[Any]] = {}  # concurrent coroutines
        self._cancels: set[str] = set()  # cancels of jobs queued here, not started yet
        self._replies: list[dict[str, Any]] = []  # to send once the frames are filed

    def wait(self, ready: Callable[[], bool], timeout_s: float | None = None) -> bool:
        """Read frames until ``ready()``, the inbox closes, or ``timeout_s`` passes; another
        thread already reading does it for us meanwhile. Returns ``ready()``."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            with self._cond:
                while True:
                    if self.closed or ready():
                        return ready()
                    left = None if deadline is None else deadline - time.monotonic()
                    if left is not None and left <= 0:
                        return False
                    if not self._reading:
                        self._reading = True
                        break
                    self._cond.wait(left)
            self._read(left)

    def poll(self, *, now_or_never: bool = False) -> None:
        """File the frames already here, without blocking (at most every ``POLL_EVERY_S``,
        unless ``now_or_never``)."""
        now = time.monotonic()
        if now - self._polled_at < POLL_EVERY_S and not now_or_never:
            return
        self._polled_at = now
        with self._cond:
            if self._reading or self.closed:
                return
            self._reading = True
        self._read(0.0)

    def _read(self, timeout_s: float | None) -> None:
        """As the one reading thread: take the frames that come within ``timeout_s`` (None:
        wait for one), then file them and hand the reading over."""
        frames: list[dict[str, Any] | None] = []
        try:
            if timeout_s is None or self.frames.readable(timeout_s):
                frames.append(self.frames.recv())
                while frames[-1] is not None and self.frames.buffered():
                    frames.append(self.frames.recv())
        except (FrameError, OSError):
            frames.append(None)
        finally:
            with self._cond:
                for frame in frames:
                    self._file(frame)
                self._reading = False
                self._cond.notify_all()
                replies, self._replies = self._replies, []
            for reply in replies:
                self.frames.send(reply)

    def _file(self, frame: dict[str, Any] | None) -> None:
        op = frame.get("op") if frame is not None else "exit"
        if frame is None or op == "exit":
            self.closed = True
        elif op == "run":
            self.jobs.append(frame)
        elif op == "cancel":
            task_id = str(frame.get("task_id"))
            if task_id in self._current:
                self._current[task_id].request_cancel()
            elif any(job.get("task_id") == task_id for job in self.jobs):
                self._cancels.add(task_id)
        elif op == "withdraw":
            task_id = str(frame.get("task_id"))
            queued = [job for job in self.jobs if job.get("task_id") == task_id]
            for job in queued:
                self.jobs.remove(job)
                self._cancels.discard(task_id)
            if queued:
                self._replies.append({"op": "withdrawn", "task_id": task_id})
        elif op == "abort":
            flying = self._flying.get(str(frame.get("task_id")))
            if flying is not None:
                flying.cancel()  # the lane cancels the coroutine's task
        elif op == "step_ack":
            channel = self._channels.get(str(frame.get("task_id")))
            if channel is not None:
                channel.acks[frame.get("seq")] = frame

    def begin(self, ctx: Context, channel: GuestChannel) -> bool:
        """``ctx`` is an attempt running now; False when it was canceled while queued."""
        with self._cond:
            self._current[ctx.task_id] = ctx
            self._channels[ctx.task_id] = channel
            if ctx.task_id in self._cancels:
                self._cancels.discard(ctx.task_id)
                ctx.request_cancel()
                return False
            return True

    def flying(self, task_id: str, flight: Flight[Any]) -> None:
        """A concurrent attempt's coroutine is on the lane (an "abort" cancels it)."""
        with self._cond:
            self._flying[task_id] = flight

    def landed(self) -> bool:
        """No concurrent attempt is running."""
        with self._cond:
            return not self._flying

    def end(self, ctx: Context) -> None:
        with self._cond:
            self._current.pop(ctx.task_id, None)
            self._channels.pop(ctx.task_id, None)
            self._flying.pop(ctx.task_id, None)


class CancelFlag(threading.Event):
    """``ctx.cancelled`` in a guest: asking it files the frames that arrived meanwhile. A plain
    flag under the inbox's lock (no condition of its own per attempt): it is set while frames
    are filed, and the inbox wakes its waiters after filing."""

    def __init__(self, inbox: Inbox) -> None:  # no super().__init__(): no Condition needed
        self._inbox = inbox
        self._flag = False

    def is_set(self) -> bool:
        if not self._flag:
            self._inbox.poll()
        return self._flag

    def set(self) -> None:
        self._flag = True

    def clear(self) -> None:
        self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        return self._inbox.wait(lambda: self._flag, timeout)


class GuestChannel:
    """``Context``'s channel inside a guest: frames to the agent. Heartbeats and checkpoints
    never block for long; a step blocks until the agent answers that it is durable."""

    def __init__(self, inbox: Inbox, task_id: str) -> None:
        self._inbox = inbox
        self._frames = inbox.frames
        self._seq = 0
        self.task_id = task_id
        self.acks: dict[Any, dict[str, Any]] = {}  # by seq, filed by the reading thread

    def step(self, op: str, identity: str, position: int, value: Any) -> StepAck:
        self._seq += 1
        seq = self._seq
        frame = {"op": "step", "task_id": self.task_id, "seq": seq, "step_op": op}
        frame.update(identity=identity, position=position, value=value)
        self._frames.send(frame)
        # Steps run one at a time: an ack of an earlier seq is stale and stays unread.
        if not self._inbox.wait(lambda: seq in self.acks):
            return LOST_AGENT
        ack = self.acks.pop(seq)
        self.acks.clear()
        return StepAck(
            ok=bool(ack.get("ok")),
            lost=bool(ack.get("lost")),
            transient=bool(ack.get("transient")),
            reason=ack.get("reason"),
        )

    def heartbeat(self, progress: Any) -> None:
        self._frames.send({"op": "heartbeat", "task_id": self.task_id, "progress": progress})

    def checkpoint(self, value: Any) -> None:
        self._frames.send({"op": "checkpoint", "task_id": self.task_id, "value": value})


class Guest:
    def __init__(self, app: App, frames: BlockingFrames, lane: Lane | None = None) -> None:
        self.app = app
        self.frames = frames
        self.inbox = Inbox(frames)
        self.lane = lane  # the event loop of every async handler here (``share_one_loop``)
        # Where the next attempt's output starts: the end of the log after the previous one
        # (anything written between two attempts counts for the next one).
        self._log_end = _log_size()

    def serve(self) -> None:
        inbox = self.inbox
        while True:
            if not inbox.jobs:
                inbox.wait(lambda: bool(inbox.jobs))
            if inbox.closed:
                return
            if not inbox.jobs:
                continue  # the queued job was withdrawn meanwhile: wait for the next one
            frame = inbox.jobs.popleft()
            if frame.get("concurrent") and self.start(frame):
                continue
            while not inbox.landed() and not inbox.closed:  # it runs alone: after them
                inbox.wait(inbox.landed, IDLE_LOOK_S)
            if not self.run(frame):
                return

    def start(self, frame: dict[str, Any]) -> bool:
        """Start a concurrent attempt on the lane and return at once (its "done" follows when
        it ends); False when it is not an async handler here: it runs alone instead."""
        task = self.app.tasks.get(str(frame["task_type"]))
        if self.lane is None or task is None or not task.is_async:
            return False
        ctx, channel = self._attempt(frame)
        start = _log_size()
        if not self.inbox.begin(ctx, channel):
            self._done(ctx, NEVER_STARTED, [start, start])
            return True
        flight = self.lane.submit(self._traced(task, ctx, frame))
        self.inbox.flying(ctx.task_id, flight)

        def landed(future: concurrent.futures.Future[AttemptResult]) -> None:
            result = ABORTED if future.cancelled() else future.result()
            self._done(ctx, result, [start, _log_size()])

        # On the lane's thread; at once if it already ended (after ``flying``: ``end`` forgets).
        flight.future.add_done_callback(landed)
        return True

    async def _traced(
        self, task: TaskType[Any, Any], ctx: Context, frame: dict[str, Any]
    ) -> AttemptResult:
        """A concurrent attempt in its span (``conveyor.tracing``), in its own coroutine."""
        with self._span(ctx, frame) as span:
            result = await run_async(task, ctx, frame.get("payload"))
            tracing.ended(span, result.outcome, result.error_class, result.error_message)
            return result

    def _span(self, ctx: Context, frame: dict[str, Any]) -> contextlib.AbstractContextManager[Any]:
        return tracing.attempt_span(
            ctx.task_type,
            task_id=ctx.task_id,
            attempt=ctx.attempt,
            app=self.app.name,
            carrier=frame.get("trace_context"),
        )

    def _attempt(self, frame: dict[str, Any]) -> tuple[Context, GuestChannel]:
        task_id = str(frame["task_id"])
        channel = GuestChannel(self.inbox, task_id)
        ctx = Context(
            task_id=task_id,
            task_type=str(frame["task_type"]),
            attempt=int(frame["attempt"]),
            checkpoint=frame.get("checkpoint"),
            channel=channel,
            steps=list(frame.get("steps") or []),
            started_ms=int(frame.get("started_ms") or 0),
            run_key=frame.get("run_key"),
            compensating=bool(frame.get("compensating")),
            cancel=CancelFlag(self.inbox),
            codec=self.app.codec,
        )
        return ctx, channel

    def run(self, frame: dict[str, Any]) -> bool:
        """Run one attempt and report it; False when this process must not be reused."""
        ctx, channel = self._attempt(frame)
        start_it = self.inbox.begin(ctx, channel)
        task = self.app.tasks.get(ctx.task_type)
        start = self._log_end
        with self._span(ctx, frame) as span:
            with _cpu_budget(frame.get("cpu_s"), bool(frame.get("cpu_hard"))):
                if not start_it:
                    result = NEVER_STARTED
                elif task is None:
                    result = unknown_type(self.app, ctx.task_type)
                else:
                    result = run_sync(task, ctx, frame.get("payload"))
            tracing.ended(span, result.outcome, result.error_class, result.error_message)
        self._log_end = _log_size()
        return self._done(ctx, result, [start, self._log_end])

    def _done(self, ctx: Context, result: AttemptResult, log_range: list[int]) -> bool:
        """Report an attempt; False when this process must not be reused."""
        self.inbox.end(ctx)
        # File the frames that came meanwhile (jobs queued behind this one, their cancels and
        # withdraws) before this report: the agent takes a job it withdrew that is still in
        # line after a "done" as started, and kills this guest for it.
        self.inbox.poll(now_or_never=True)
        # After a MemoryError the heap may be half-built: do not run anything else here.
        reuse = result.error_class != "MemoryError"
        done = {"op": "done", "task_id": ctx.task_id, "reuse": reuse, "log_range": log_range}
        self.frames.send(_report(done, result))
        return reuse


def _report(done: dict[str, Any], result: AttemptResult) -> dict[str, Any]:
    for name in REPORTED:
        done[name] = getattr(result, name)
    for name in REPORTED_TOO:
        value = getattr(result, name)
        if value is not None:
            done[name] = value
    return done


def _log_size() -> int:
    """End of this guest's log (its stdout and stderr are that file, opened for append)."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return os.fstat(1).st_size
    except OSError:
        return 0


@contextlib.contextmanager
def _cpu_budget(cpu_s: Any, hard: bool) -> Iterator[None]:
    """RLIMIT_CPU counts the whole process, so a warm guest's budget starts at what it has
    already used. Past the soft limit the kernel sends SIGXCPU, which kills the guest."""
    if not cpu_s:
        yield
        return
    usage = resource.getrusage(resource.RUSAGE_SELF)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + float(cpu_s))
    _, old_hard = resource.getrlimit(resource.RLIMIT_CPU)
    if old_hard != resource.RLIM_INFINITY:
        soft = min(soft, old_hard)
    # One process per task: lower the hard limit too, so user code cannot raise the soft one.
    resource.setrlimit(resource.RLIMIT_CPU, (soft, soft + 1 if hard else old_hard))
    try:
        yield
    finally:
        _, now_hard = resource.getrlimit(resource.RLIMIT_CPU)
        resource.setrlimit(resource.RLIMIT_CPU, (now_hard, now_hard))


def _limit_memory(memory_mb: int | None) -> None:
    if memory_mb:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def _drop_to(user: str | None) -> None:
    """Become ``uid:gid`` for good (no supplementary groups, no capability left)."""
    if not user:
        return
    uid, _, gid = user.partition(":")
    os.setgroups([])
    os.setgid(int(gid))
    os.setuid(int(uid))
    if os.getuid() != int(uid) or os.geteuid() != int(uid):
        raise SystemExit(f"could not switch to user {user}")


def _confine(args: argparse.Namespace) -> None:
    """Rule 2, before the app (user code) is imported."""
    _drop_to(args.drop_to)
    _limit_memory(args.memory_mb)
    if args.processes:
        resource.setrlimit(resource.RLIMIT_NPROC, (args.processes, args.processes))
    if args.file_mb:
        size = args.file_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conveyor.agents.guest")
    parser.add_argument("--app", required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, default=None)
    parser.add_argument("--processes", type=int, default=None)
    parser.add_argument("--file-mb", type=int, default=None)
    parser.add_argument("--drop-to", default=None, metavar="UID:GID")
    parser.add_argument("--log-json", action="store_true")  # as its agent logs (conveyor.logs)
    args = parser.parse_args(argv)
    _confine(args)
    tune_malloc()
    logs.configure(logging.INFO, as_json=args.log_json)
    frames = BlockingFrames(socket.socket(fileno=args.fd))
    try:
        app = load_app(args.app)
    except BaseException as exc:
        traceback.print_exc()  # the whole of it, in this guest's log; the agent shows the gist
        frames.send({"op": "hello", "ok": False, "error": import_failure(exc)})
        return 2
    frames.send({"op": "hello", "ok": True, "pid": os.getpid(), "version": app.version})
    Guest(app, frames, share_one_loop()).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
