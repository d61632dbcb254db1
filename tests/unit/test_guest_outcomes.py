"""A guest reports only what a handler can end in: an outcome meant for the agent alone
(RELEASED: "never started, count nothing") from a guest is a broken guest, counted as a crash,
so user code cannot requeue its task forever without spending attempts."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from conveyor.agents.pool import GuestSandbox
from conveyor.agents.sandbox import GUEST_CRASHED


@pytest.mark.parametrize("outcome", ["RELEASED", "NOPE", None])
def test_a_guest_reporting_an_outcome_it_may_not_report_crashed(outcome: str | None) -> None:
    sandbox = SimpleNamespace(guest=SimpleNamespace(log_path="/tmp/guest.log"))
    result = GuestSandbox._result(sandbox, {"op": "done", "outcome": outcome})  # type: ignore[arg-type]
    assert result.outcome == "FAILED" and result.error_class == GUEST_CRASHED and result.crashed
    assert repr(outcome) in (result.error_message or "")


def test_a_guest_reporting_a_handler_outcome_is_believed() -> None:
    sandbox = SimpleNamespace(guest=SimpleNamespace(log_path="/tmp/guest.log"))
    result = GuestSandbox._result(sandbox, {"op": "done", "outcome": "SUCCEEDED", "result": 1})  # type: ignore[arg-type]
    assert result.outcome == "SUCCEEDED" and result.result == 1 and not result.crashed
