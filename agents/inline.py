"""An in-process ``Executor`` for ``conveyor.testing``: handlers run in the agent's process.

Async handlers run as tasks on the agent's loop; sync handlers on a small thread pool, so a
handler that waits for ``ctx.cancelled`` does not stall the engine. Each attempt runs in its
span, as in a guest (``conveyor.tracing``). Breakpoints work. ``kill``
cannot stop a thread: the attempt is reported killed and whatever the thread returns later is
ignored.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from typing import Any

from conveyor import tracing
from conveyor.agents.runner import run_async, run_sync, unknown_type
from conveyor.agents.sandbox import AttemptResult, Hooks, Job
from conveyor.app import App, TaskType
from conveyor.codecs import PayloadCodec
from conveyor.context import Context
from conveyor.signals import StepRefused
from conveyor.steps import StepAck


class _LoopChannel:
    """Reports from any thread, delivered on the agent's loop in the order they were made."""

    def __init__(self, loop: asyncio.AbstractEventLoop, hooks: Hooks) -> None:
        self._loop = loop
        self._hooks = hooks

    def heartbeat(self, progress: Any) -> None:
        self._loop.call_soon_threadsafe(self._hooks.on_heartbeat, progress)

    def checkpoint(self, value: Any) -> None:
        self._loop.call_soon_threadsafe(self._hooks.on_checkpoint, value)

    def step(self, op: str, identity: str, position: int, value: Any) -> StepAck:
        """Blocks the calling thread until the agent's loop has the step recorded."""
        try:
            on_loop = asyncio.get_running_loop() is self._loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            # A step waits for its commit; an async handler here runs on the agent's own loop,
            # which would then never get to record it.
            raise StepRefused(
                "an async handler in conveyor.testing shares the engine's event loop, which a "
                "blocking step write would stall: give ctx.step.run an async def and await it"
            )
        call = self._hooks.on_step(op, identity, position, value)
        return asyncio.run_coroutine_threadsafe(call, self._loop).result()


class InlineSandbox:
    pid: int | None = None
    queued = False  # a thread of its own from the start

    def __init__(
        self,
        app: App,
        job: Job,
        hooks: Hooks,
        threads: ThreadPoolExecutor,
        codec: PayloadCodec | None = None,
    ) -> None:
        loop = asyncio.get_running_loop()
        self.ctx = Context(
            task_id=job.task_id,
            task_type=job.task_type,
            attempt=job.attempt,
            checkpoint=job.checkpoint,
            channel=_LoopChannel(loop, hooks),
            steps=job.steps,
            started_ms=job.started_ms,
            run_key=job.run_key,
            compensating=job.compensating,
            codec=codec,
        )
        self._killed: str | None = None
        task = app.tasks.get(job.task_type)
        self._future: asyncio.Future[AttemptResult]
        if task is None:
            self._future = loop.create_future()
            self._future.set_result(unknown_type(app, job.task_type))
        elif task.is_async:
            attempt = run_async(task, self.ctx, job.payload)
            self._future = loop.create_task(_traced_async(self._span(app, job), attempt))
        else:
            self._future = loop.run_in_executor(
                threads, _traced_sync, self._span(app, job), task, self.ctx, job.payload
            )

    @staticmethod
    def _span(app: App, job: Job) -> Callable[[], AbstractContextManager[Any]]:
        """The attempt's span, as a guest makes it (``conveyor.tracing``), to open where the
        handler runs (its thread, or its task on the loop)."""
        return functools.partial(
            tracing.attempt_span,
            job.task_type,
            task_id=job.task_id,
            attempt=job.attempt,
            app=app.name,
            carrier=job.trace_context,
        )

    async def wait(self) -> AttemptResult:
        try:
            result = await self._future
        except asyncio.CancelledError:
            if self._killed is None:
                raise  # the agent itself is being cancelled
        if self._killed is not None:
            return AttemptResult(outcome="FAILED", error_class="Killed", error_message=self._killed)
        return result

    def cancel(self) -> None:
        self.ctx.request_cancel()

    def kill(self, reason: str) -> None:
        self._killed = reason
        self.ctx.request_cancel()  # a thread cannot be killed: at least let it notice
        self._future.cancel()


async def _traced_async(
    span: Callable[[], AbstractContextManager[Any]], attempt: Awaitable[AttemptResult]
) -> AttemptResult:
    with span() as current:
        result = await attempt
        tracing.ended(current, result.outcome, result.error_class, result.error_message)
        return result


def _traced_sync(
    span: Callable[[], AbstractContextManager[Any]],
    task: TaskType[Any, Any],
    ctx: Context,
    payload: Any,
) -> AttemptResult:
    with span() as current:
        result = run_sync(task, ctx, payload)
        tracing.ended(current, result.outcome, result.error_class, result.error_message)
        return result


class InlineExecutor:
    queued_max = 0

    def __init__(self, app: App, *, threads: int = 8, codec: PayloadCodec | None = None) -> None:
        self.app = app
        self.codec = codec if codec is not None else app.codec  # conveyor.codecs
        self._threads = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="conveyor-task")

    async def start(self) -> None:
        return None

    async def launch(self, job: Job, hooks: Hooks) -> InlineSandbox:
        return InlineSandbox(self.app, job, hooks, self._threads, self.codec)

    async def close(self) -> None:
        # Threads still running a killed handler are left to finish on their own.
        self._threads.shutdown(wait=False, cancel_futures=True)
