"""One long-lived event loop per thread for sync code that runs an async handler.

A guest runs a handler from a plain thread. ``asyncio.run`` per attempt would give every
attempt a new loop and close it after, so anything the handler's module keeps across
attempts that is bound to a loop (an ``aiohttp.ClientSession``, an async database pool, an
``asyncio.Lock``) fails on the second attempt with "Event loop is closed" or "attached to a
different loop". Here each thread keeps one ``asyncio.Runner`` for its life: every attempt in
that thread runs on the same loop, and module-level async clients work as they would in a web
app. The loop is closed when the thread's runner is collected or the process exits.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import threading
from collections.abc import Awaitable
from typing import Any

_local = threading.local()
_runners: list[asyncio.Runner] = []
_lock = threading.Lock()


def run_awaitable(value: Awaitable[Any]) -> Any:
    """Await ``value`` on this thread's long-lived loop (no loop may be running here)."""
    runner: asyncio.Runner | None = getattr(_local, "runner", None)
    if runner is None:
        runner = asyncio.Runner()
        _local.runner = runner
        with _lock:
            _runners.append(runner)
    return runner.run(_awaited(value))


async def _awaited(value: Awaitable[Any]) -> Any:
    return await value


@atexit.register
def _close_all() -> None:
    with _lock:
        runners, _runners[:] = list(_runners), []
    for runner in runners:
        with contextlib.suppress(Exception):  # exiting: a loop that cannot close is moot
            runner.close()
