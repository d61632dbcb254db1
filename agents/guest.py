"""The in-guest stub: ``python -m conveyor.agents.guest --app module:attr --fd N``.

Rules, from the trust boundary (design Q6):
1. The stub holds no credentials and never sees a lease id. It talks only to its agent, over
   the socket inherited as fd N; the agent maps every report to the lease it handed this guest.
2. Resource limits are set before any user code is imported: RLIMIT_AS for memory for the
   life of the process; RLIMIT_CPU per attempt (a soft budget on top of the CPU already used,
   or a hard one too when the agent runs one process per task).
3. Each attempt's stdout/stderr go to the file whose descriptor came with its "run" frame.

A guest runs one attempt at a time; a reader thread takes frames off the socket so a cancel
reaches ``ctx.cancelled`` while the handler runs.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import queue
import resource
import socket
import sys
import threading
import traceback
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

from conveyor.agents.frames import BlockingFrames, FrameError
from conveyor.agents.runner import load_app, run_sync, unknown_type
from conveyor.app import App
from conveyor.context import Context
from conveyor.steps import StepAck

Run = dict[str, Any]  # a "run" frame


LOST_AGENT = StepAck(ok=False, lost=True, reason="the agent went away")


class GuestChannel:
    """``Context``'s channel inside a guest: frames to the agent. Heartbeats and checkpoints
    never block for long; a step blocks until the agent answers that it is durable."""

    def __init__(self, frames: BlockingFrames, task_id: str) -> None:
        self._frames = frames
        self._task_id = task_id
        self._seq = 0
        self.task_id = task_id
        self.acks: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def step(self, op: str, identity: str, position: int, value: Any) -> StepAck:
        self._seq += 1
        frame = {"op": "step", "task_id": self._task_id, "seq": self._seq, "step_op": op}
        frame.update(identity=identity, position=position, value=value)
        self._frames.send(frame)
        while True:  # steps run one at a time: the next ack is this one's, unless stale
            ack = self.acks.get()
            if ack is None:
                return LOST_AGENT
            if ack.get("seq") == self._seq:
                return StepAck(
                    ok=bool(ack.get("ok")),
                    lost=bool(ack.get("lost")),
                    transient=bool(ack.get("transient")),
                    reason=ack.get("reason"),
                )

    def heartbeat(self, progress: Any) -> None:
        self._frames.send({"op": "heartbeat", "task_id": self._task_id, "progress": progress})

    def checkpoint(self, value: Any) -> None:
        self._frames.send({"op": "checkpoint", "task_id": self._task_id, "value": value})


class Guest:
    def __init__(self, app: App, frames: BlockingFrames) -> None:
        self.app = app
        self.frames = frames
        self.jobs: queue.Queue[Run | None] = queue.Queue()
        self._lock = threading.Lock()
        self._current: Context | None = None
        self._channel: GuestChannel | None = None
        self._cancelled: set[str] = set()  # cancels that came before their run started

    def serve(self) -> None:
        threading.Thread(target=self._read, name="guest-reader", daemon=True).start()
        while (job := self.jobs.get()) is not None:
            if not self.run(job):
                return

    def _read(self) -> None:
        while True:
            try:
                frame = self.frames.recv()
            except (FrameError, OSError):
                frame = None
            op = frame.get("op") if frame else "exit"
            if op == "run" and frame is not None:
                self.jobs.put(frame)
            elif op == "cancel" and frame is not None:
                self._cancel(str(frame.get("task_id")))
            elif op == "step_ack" and frame is not None:
                self._ack(frame)
            elif op == "exit":
                self._ack(None)  # a step waiting for its answer gets "lost"
                self.jobs.put(None)
                return

    def _cancel(self, task_id: str) -> None:
        with self._lock:
            if self._current is not None and self._current.task_id == task_id:
                self._current.request_cancel()
            else:
                self._cancelled.add(task_id)

    def _ack(self, frame: dict[str, Any] | None) -> None:
        with self._lock:
            channel = self._channel
        if channel is not None and (frame is None or frame.get("task_id") == channel.task_id):
            channel.acks.put(frame)

    def run(self, frame: dict[str, Any]) -> bool:
        """Run one attempt and report it; False when this process must not be reused."""
        task_id = str(frame["task_id"])
        channel = GuestChannel(self.frames, task_id)
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
        )
        with self._lock:
            self._current = ctx
            self._channel = channel
            if task_id in self._cancelled:
                self._cancelled.discard(task_id)
                ctx.request_cancel()
        task = self.app.tasks.get(ctx.task_type)
        start = _log_size()
        with _cpu_budget(frame.get("cpu_s"), bool(frame.get("cpu_hard"))):
            if task is None:
                result = unknown_type(self.app, ctx.task_type)
            else:
                result = run_sync(task, ctx, frame.get("payload"))
        log_range = [start, _log_size()]
        with self._lock:
            self._current = None
            self._channel = None
        # After a MemoryError the heap may be half-built: do not run anything else here.
        reuse = result.error_class != "MemoryError"
        report = {k: v for k, v in asdict(result).items() if k not in ("log_ref", "crashed")}
        done = {"op": "done", "task_id": task_id, "reuse": reuse, "log_range": log_range}
        self.frames.send({**done, **report})
        return reuse


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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="conveyor.agents.guest")
    parser.add_argument("--app", required=True)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--memory-mb", type=int, default=None)
    args = parser.parse_args(argv)
    _limit_memory(args.memory_mb)  # rule 2: before the app (user code) is imported
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    frames = BlockingFrames(socket.socket(fileno=args.fd))
    try:
        app = load_app(args.app)
    except BaseException:
        frames.send({"op": "hello", "ok": False, "error": traceback.format_exc()})
        return 2
    frames.send({"op": "hello", "ok": True, "pid": os.getpid(), "version": app.version})
    Guest(app, frames).serve()
    return 0


if __name__ == "__main__":
    sys.exit(main())
