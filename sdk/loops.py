"""Long-lived event loops for sync code that runs an async handler.

A guest runs a handler from a plain thread. ``asyncio.run`` per attempt would give every
attempt a new loop and close it after, so anything the handler's module keeps across
attempts that is bound to a loop (an ``aiohttp.ClientSession``, an async database pool, an
``asyncio.Lock``) fails on the second attempt with "Event loop is closed" or "attached to a
different loop". So no attempt gets a loop of its own:

- By default each thread keeps one ``asyncio.Runner`` for its life: every attempt in that
  thread runs on the same loop (what the in-process executor of ``conveyor.testing`` does).
- After ``share_one_loop()`` (what a guest does at start-up) every awaitable of the process
  runs on one ``Lane``: a loop on a thread of its own, running for the life of the process.
  A thread that runs an async handler blocks until it is done; a guest also starts attempts
  of a type with ``concurrency`` > 1 on it without waiting, and they run side by side.

Either way module-level async clients work as they would in a web app. The loops are closed
when the process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextlib
import contextvars
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, Generic, TypeVar

T = TypeVar("T")

_local = threading.local()
_runners: list[asyncio.Runner] = []
_lock = threading.Lock()
_lane: Lane | None = None
_shared = False


class Lane:
    """One event loop running on its own daemon thread until the process exits.

    ``submit`` starts a coroutine there from any thread; it runs with the caller's context
    variables (``conveyor.current_task`` included), each in a task of its own."""

    def __init__(self, name: str = "conveyor-loop") -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit(self, coro: Coroutine[Any, Any, T]) -> Flight[T]:
        """Start ``coro`` on the lane, in a task of its own."""
        return Flight(self.loop, coro)

    def run(self, value: Awaitable[T]) -> T:
        """Await ``value`` on the lane and return its result (not from the lane's thread)."""
        if threading.current_thread() is self.thread:
            raise RuntimeError("Lane.run from the lane's own thread would wait for itself")
        return self.submit(_awaited(value)).future.result()


class Flight(Generic[T]):
    """A coroutine running on a lane. ``future`` is done once its task is (cancelled, when a
    ``cancel`` stopped it): not before, so its clean-up has run by then. It runs with the
    context variables of the thread that started it (``conveyor.current_task`` included)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, T]) -> None:
        self.future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._loop = loop
        self._task: asyncio.Task[T] | None = None
        # The handle copies this thread's context; the task copies the handle's.
        loop.call_soon_threadsafe(self._start, coro, context=contextvars.copy_context())

    def _start(self, coro: Coroutine[Any, Any, T]) -> None:
        self._task = self._loop.create_task(coro)
        self._task.add_done_callback(self._landed)

    def _landed(self, task: asyncio.Task[T]) -> None:
        if task.cancelled():
            self.future.cancel()
        elif (exc := task.exception()) is not None:
            self.future.set_exception(exc)
        else:
            self.future.set_result(task.result())

    def cancel(self) -> None:
        """Ask the coroutine to stop: a ``CancelledError`` at the await it waits in (from any
        thread; after ``_start``, which the loop runs first)."""
        self._loop.call_soon_threadsafe(self._cancel)

    def _cancel(self) -> None:
        if self._task is not None:
            self._task.cancel()


def share_one_loop() -> Lane:
    """From now on ``run_awaitable`` runs every awaitable of this process on one ``Lane``."""
    global _shared
    _shared = True
    return lane()


def lane() -> Lane:
    """The process's lane, started on first use."""
    global _lane
    with _lock:
        if _lane is None:
            _lane = Lane()
        return _lane


def run_awaitable(value: Awaitable[Any]) -> Any:
    """Await ``value`` on this thread's long-lived loop (no loop may be running here), or on
    the process's lane after ``share_one_loop``."""
    if _shared:
        return lane().run(value)
    runner: asyncio.Runner | None = getattr(_local, "runner", None)
    if runner is None:
        runner = asyncio.Runner()
        _local.runner = runner
        with _lock:
            _runners.append(runner)
    return runner.run(_awaited(value))


async def _awaited(value: Awaitable[T]) -> T:
    return await value


@atexit.register
def _close_all() -> None:
    with _lock:
        runners, _runners[:] = list(_runners), []
    for runner in runners:
        with contextlib.suppress(Exception):  # exiting: a loop that cannot close is moot
            runner.close()
