"""``@app.task(concurrency=N)`` is checked when the decorator runs, and ``conveyor.loops.Lane``
(the guest's one event loop) runs coroutines side by side with their caller's context and
cancels one at its await, reporting it cancelled only once its clean-up ran."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import threading
import time

import pytest

import conveyor
from conveyor.app import CONCURRENCY_MAX
from conveyor.errors import ContractError
from conveyor.loops import Lane

who: contextvars.ContextVar[str] = contextvars.ContextVar("who", default="nobody")


def test_concurrency_is_an_option_of_async_handlers_only() -> None:
    app = conveyor.App("c")

    @app.task(concurrency=5)
    async def fetch(url: str) -> str:
        return url

    assert fetch.options.concurrency == 5
    with pytest.raises(ContractError, match="only an async def handler") as caught:

        @app.task(concurrency=2)
        def sync(payload: int) -> int:
            return payload

    assert caught.value.field == "concurrency" and "sync" not in app.tasks


@pytest.mark.parametrize("bad", [0, -1, CONCURRENCY_MAX + 1, True, 2.0, "4"])
def test_a_concurrency_out_of_range_fails_at_import_time(bad: object) -> None:
    app = conveyor.App("c")
    with pytest.raises(ContractError, match=f"concurrency must be .*1..{CONCURRENCY_MAX}"):
        app.task(concurrency=bad)  # type: ignore[call-overload]


def test_a_lane_runs_coroutines_side_by_side_with_their_callers_context() -> None:
    lane = Lane()

    async def nap(n: int) -> tuple[str, int, int]:
        await asyncio.sleep(0.3)
        return who.get(), n, id(asyncio.get_running_loop())

    flights = []
    began = time.monotonic()
    for n in range(5):
        who.set(f"caller {n}")
        flights.append(lane.submit(nap(n)))
    results = [f.future.result(timeout=5) for f in flights]
    assert time.monotonic() - began < 1.2  # five naps of 0.3 s overlapped
    assert [r[:2] for r in results] == [(f"caller {n}", n) for n in range(5)]
    assert len({r[2] for r in results}) == 1
    assert lane.run(nap(9))[1] == 9  # and a blocking call from another thread


def test_a_cancel_stops_one_coroutine_at_its_await_after_its_clean_up() -> None:
    lane = Lane()
    started, cleaned = threading.Event(), threading.Event()

    async def stuck() -> None:
        started.set()
        try:
            await asyncio.sleep(60)
        finally:
            await asyncio.sleep(0.05)  # clean-up that awaits
            cleaned.set()

    async def other() -> str:
        await asyncio.sleep(0.2)
        return "done"

    flight, bystander = lane.submit(stuck()), lane.submit(other())
    assert started.wait(5)
    flight.cancel()
    with pytest.raises(concurrent.futures.CancelledError):
        flight.future.result(timeout=5)
    assert cleaned.is_set()  # not reported before its clean-up ran
    assert bystander.future.result(timeout=5) == "done"


def test_lane_run_from_the_lane_itself_is_refused() -> None:
    lane = Lane()

    async def inner() -> None:
        nap = asyncio.sleep(0)
        try:
            lane.run(nap)
        finally:
            nap.close()

    with pytest.raises(RuntimeError, match="wait for itself"):
        lane.submit(inner()).future.result(timeout=5)
