"""Async handlers with async step bodies in ``conveyor.testing.Engine`` (the real node and an
in-process agent whose async handlers share the engine's event loop): a step's body runs once
across a retry, and a canceled workflow runs its async compensation."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest

import conveyor
import conveyor.testing

pytestmark = pytest.mark.timeout(120)

app = conveyor.App("async-steps-engine")
ran: list[str] = []


async def reserve(item: str) -> str:
    await asyncio.sleep(0.01)
    ran.append(f"reserve {item}")
    return f"R-{item}"


async def release(reservation: Any) -> None:
    await asyncio.sleep(0.01)
    ran.append(f"release {reservation}")


@app.workflow(retry=conveyor.Retry(attempts=3, base="1s"))
async def flaky_order(ctx: conveyor.Context, item: str) -> str:
    async def body() -> str:
        return await reserve(item)

    reservation = await ctx.step.run("reserve", body, compensate=release)
    if ctx.attempt == 1:
        raise RuntimeError("the shipping service is down")
    if item == "slow":
        ctx.step.sleep("1d", name="wait_for_stock")
    return reservation


@pytest.fixture(scope="module")
def engine() -> Iterator[conveyor.testing.Engine]:
    with conveyor.testing.Engine(app) as running:
        yield running


def test_an_async_step_runs_once_across_a_retry(engine: conveyor.testing.Engine) -> None:
    ran.clear()
    handle = engine.client.enqueue(flaky_order, "book")
    engine.run_until_idle()
    engine.advance(5)  # past the backoff
    engine.run_until_idle()
    info = handle.get()
    assert info.status == "SUCCEEDED", info
    assert info.result == "R-book"
    assert ran == ["reserve book"]  # the second attempt's step was a memo hit
    assert len(info.attempts) == 2


def test_a_canceled_async_workflow_runs_its_async_compensation(
    engine: conveyor.testing.Engine,
) -> None:
    ran.clear()
    handle = engine.client.enqueue(flaky_order, "slow")
    engine.run_until_idle()
    engine.advance(5)
    engine.run_until_idle()
    assert handle.status() == "SLEEPING"
    handle.cancel()
    engine.run_until_idle()
    assert handle.get().status == "CANCELED"
    assert ran == ["reserve slow", "release R-slow"]
