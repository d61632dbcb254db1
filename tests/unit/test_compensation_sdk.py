"""Compensations in the SDK (``conveyor.steps`` rule 6), through the runner a guest uses, with
a recording step channel in place of the platform: the marker step goes before the body, the
compensating replay stops at the first uncommitted step, the compensations run newest first
as ``@undo:`` steps, once, and a failing one is reported naming its step."""

from __future__ import annotations

from typing import Any

import pytest

import conveyor
from conveyor.agents.runner import run_sync
from conveyor.context import Context
from conveyor.steps import StepAck

FUTURE_MS = 4_000_000_000_000
app = conveyor.App("shop")
calls: list[tuple[str, Any]] = []


def refund(charge: Any) -> str:
    calls.append(("refund", charge))
    return f"refunded {charge}"


def release(reservation: Any) -> None:
    calls.append(("release", reservation))


def ship() -> str:
    calls.append(("ship", None))
    return "shipped"


@app.workflow
def checkout(ctx: Context, order: str) -> str:
    ctx.step.run("charge", lambda: f"ch_{order}", compensate=refund)
    ctx.step.run("reserve", lambda: f"res_{order}", compensate=release)
    ctx.step.sleep("1h", name="nap")
    return ctx.step.run("ship", ship)


class Recorder:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str, int, Any]] = []

    def heartbeat(self, progress: Any) -> None: ...

    def checkpoint(self, value: Any) -> None: ...

    def step(self, op: str, identity: str, position: int, value: Any) -> StepAck:
        self.writes.append((op, identity, position, value))
        return StepAck(ok=True)


def row(identity: str, position: int, value: Any = True, wake_at_ms: int | None = None) -> dict:
    return {
        "identity": identity,
        "position": position,
        "claims": 1,
        "committed": True,
        "value": value,
        "wake_at_ms": wake_at_ms,
    }


CHARGED_AND_RESERVED = [
    row("@compensate:charge#0", -1),
    row("charge#0", 0, "ch_7"),
    row("@compensate:reserve#0", -1),
    row("reserve#0", 1, "res_7"),
    row("nap#0", 2, None, wake_at_ms=FUTURE_MS),  # canceled while it slept
]


def attempt(steps: list[dict], *, compensating: bool) -> tuple[Any, Recorder]:
    calls.clear()
    channel = Recorder()
    ctx = Context(
        task_id="t" * 32,
        task_type="checkout",
        attempt=3,
        checkpoint=None,
        channel=channel,
        steps=steps,
        started_ms=1_000,
        compensating=compensating,
    )
    return run_sync(checkout, ctx, "7"), channel


def test_the_marker_is_committed_before_the_step_body_runs() -> None:
    result, channel = attempt([], compensating=False)
    assert result.outcome == "SLEEP"
    assert [(op, identity) for op, identity, _, _ in channel.writes] == [
        ("COMMIT", "@compensate:charge#0"),
        ("CLAIM", "charge#0"),
        ("COMMIT", "charge#0"),
        ("COMMIT", "@compensate:reserve#0"),
        ("CLAIM", "reserve#0"),
        ("COMMIT", "reserve#0"),
    ]
    assert calls == []


def test_a_compensating_attempt_undoes_committed_steps_newest_first_and_stops() -> None:
    result, channel = attempt(CHARGED_AND_RESERVED, compensating=True)
    assert result.outcome == "CANCELED"
    assert calls == [("release", "res_7"), ("refund", "ch_7")]  # ship never ran
    assert channel.writes == [
        ("CLAIM", "@undo:reserve#0", -1, None),
        ("COMMIT", "@undo:reserve#0", -1, None),
        ("CLAIM", "@undo:charge#0", -1, None),
        ("COMMIT", "@undo:charge#0", -1, "refunded ch_7"),
    ]


def test_a_compensation_committed_by_an_earlier_attempt_does_not_run_again() -> None:
    done = [*CHARGED_AND_RESERVED, row("@undo:reserve#0", -1, None)]
    result, _ = attempt(done, compensating=True)
    assert result.outcome == "CANCELED"
    assert calls == [("refund", "ch_7")]


def test_a_failing_compensation_fails_the_attempt_naming_its_step(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(reservation: Any) -> None:
        raise RuntimeError("warehouse down")

    monkeypatch.setitem(checkout.fn.__globals__, "release", broken)
    result, channel = attempt(CHARGED_AND_RESERVED, compensating=True)
    assert (result.outcome, result.error_class) == ("FAILED", "CompensationFailed")
    assert result.error_message == (
        "compensation of step 'reserve#0' failed: RuntimeError: warehouse down"
    )
    assert calls == []  # refund waits for release: newest first, one at a time
    assert [w[:2] for w in channel.writes] == [("CLAIM", "@undo:reserve#0")]

    def fatal(reservation: Any) -> None:
        raise conveyor.FatalError("no such reservation")

    monkeypatch.setitem(checkout.fn.__globals__, "release", fatal)
    result, _ = attempt(CHARGED_AND_RESERVED, compensating=True)
    assert (result.outcome, result.error_class) == ("FATAL", "CompensationFailed")


def test_compensate_takes_a_callable() -> None:
    @app.workflow(name="bad_compensate")
    def bad(ctx: Context, _: Any) -> None:
        ctx.step.run("charge", lambda: 1, compensate="refund")  # type: ignore[arg-type]

    channel = Recorder()
    ctx = Context(task_id="u" * 32, task_type="bad", attempt=1, checkpoint=None, channel=channel)
    result = run_sync(bad, ctx, None)
    assert result.outcome == "FATAL" and "compensate= takes a callable" in result.error_message
    assert channel.writes == []


def test_a_step_committed_before_it_had_a_compensation_gets_its_marker_on_replay() -> None:
    before = [row("charge#0", 0, "ch_7")]  # committed by code without compensate=
    result, channel = attempt(before, compensating=False)
    assert result.outcome == "SLEEP"
    assert [(op, identity) for op, identity, _, _ in channel.writes][:2] == [
        ("COMMIT", "@compensate:charge#0"),
        ("COMMIT", "@compensate:reserve#0"),
    ]
