"""Compensations in ``conveyor.testing.Engine`` (the real node and an in-process agent on a
fake clock), as users' own tests would check theirs: a canceled workflow undoes its committed
steps newest first and ends CANCELED; one canceled before any compensable step ends at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import conveyor
import conveyor.testing

pytestmark = pytest.mark.timeout(120)

app = conveyor.App("compensation-engine")
done: list[str] = []


@app.workflow
def book_trip(ctx: conveyor.Context, trip: str) -> str:
    if ctx.step.run("check", lambda: trip != "nowhere"):
        ctx.wait_for_event("go", timeout="1d")  # canceled here when there is no step to undo
    flight = ctx.step.run("flight", lambda: f"FL-{trip}", compensate=cancel_flight)
    hotel = ctx.step.run("hotel", lambda: f"HT-{trip}", compensate=cancel_hotel)
    ctx.step.sleep("7d", name="until_departure")
    return f"{flight} {hotel}"


def cancel_flight(flight: Any) -> None:
    done.append(f"cancel {flight}")


def cancel_hotel(hotel: Any) -> None:
    done.append(f"cancel {hotel}")


@app.workflow(retry=conveyor.Retry(attempts=2, base="1s"))
def pay_once(ctx: conveyor.Context, amount: int) -> None:
    ctx.step.run("pay", lambda: amount, compensate=refund_never)
    ctx.step.sleep("1h", name="settle")


def refund_never(amount: Any) -> None:
    done.append(f"refund {amount} tried")
    raise RuntimeError("the bank is down")


@pytest.fixture(scope="module")
def engine() -> Iterator[conveyor.testing.Engine]:
    with conveyor.testing.Engine(app) as running:
        yield running


def test_a_canceled_trip_is_undone_newest_first(engine: conveyor.testing.Engine) -> None:
    done.clear()
    handle = engine.client.enqueue(book_trip, "nowhere")
    engine.run_until_idle()
    assert handle.status() == "SLEEPING"
    handle.cancel()
    engine.run_until_idle()
    info = handle.get()
    assert info.status == "CANCELED", info
    assert done == ["cancel HT-nowhere", "cancel FL-nowhere"]
    assert [a.outcome for a in info.attempts][-1] == "CANCELED"


def test_a_workflow_with_nothing_to_undo_is_canceled_at_once(
    engine: conveyor.testing.Engine,
) -> None:
    done.clear()
    handle = engine.client.enqueue(book_trip, "rome")
    engine.run_until_idle()
    assert handle.status() == "WAITING"  # waits for "go" before booking anything
    assert handle.cancel() == "CANCELED"
    assert done == []


def test_a_compensation_that_keeps_failing_fails_the_workflow_naming_it(
    engine: conveyor.testing.Engine,
) -> None:
    done.clear()
    handle = engine.client.enqueue(pay_once, 30)
    engine.run_until_idle()
    handle.cancel()
    engine.drain()  # the retry's backoff is fake time
    info = handle.get()
    assert info.status == "FAILED", info
    assert info.error is not None and info.error.error_class == "CompensationFailed"
    assert info.error.message == (
        "compensation of step 'pay#0' failed: RuntimeError: the bank is down"
    )
    assert done == ["refund 30 tried"] * 2  # attempts=2: the policy's budget, from the cancel
