"""``conveyor.loops``: sync callers of async handlers get one long-lived loop per thread."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from conveyor.loops import run_awaitable


def test_every_call_in_a_thread_runs_on_the_same_loop_and_loop_bound_objects_survive() -> None:
    kept: dict[str, Any] = {}

    async def first() -> int:
        kept["queue"] = asyncio.Queue()  # bound to the running loop on first use
        await kept["queue"].put(1)
        return id(asyncio.get_running_loop())

    async def second() -> tuple[int, int]:
        return id(asyncio.get_running_loop()), await kept["queue"].get()

    loop_id = run_awaitable(first())
    assert run_awaitable(second()) == (loop_id, 1)

    other: list[int] = []
    thread = threading.Thread(target=lambda: other.append(run_awaitable(first())))
    thread.start()
    thread.join()
    assert other and other[0] != loop_id  # a thread of its own has a loop of its own
