"""W1 at CI size: fan-in barriers while the node, agents and guests are killed with -9; and
the W1 checker itself, fed a node view with each fault it must catch."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import pytest

from conveyor.schemas.types import Task, TaskStatus
from conveyor_devtools.chaos import app as chaos_app
from conveyor_devtools.chaos.fanin import FanInConfig, NodeView, Plan, _check, run_fan_in
from conveyor_devtools.chaos.history import History
from conveyor_devtools.chaos.runner import Run


@pytest.mark.timeout(240)
def test_fan_in_barriers_fire_once_with_every_result_under_kill9() -> None:
    # Seed 5: three workflows of 573, 88 and 1,098 children; the last one spills.
    config = FanInConfig(workflows=3, children=(50, 1_100), seconds=20, seed=5, drain_s=120)
    result = asyncio.run(run_fan_in(config))
    assert result["valid"] is True, result
    assert result["workflows"]["spilled"] == 1, result
    assert result["faults"]["node_kills_with_barriers_open"] >= 1, result
    assert result["barriers"]["fired_once"] == 3, result
    assert result["children"]["total"] == 573 + 88 + 1_098, result


def _task(task_id: str, task_type: str, status: TaskStatus, result: object = None) -> Task:
    return Task(
        task_id=task_id,
        tenant="t",
        app="chaos",
        queue="default",
        task_type=task_type,
        priority=0,
        status=status,
        attempt=1,
        budget_base=0,
        lease_id=1,
        created_ms=0,
        run_at_ms=0,
        updated_ms=0,
        ready_seq=0,
        version=0,
        cancel_grace_ms=0,
        finished_ms=1,
        result=None if result is None else json.dumps(result).encode(),
    )


def _view(n: int, fail: list[int], *, result: object, fires: int) -> NodeView:
    """A node that ran workflow "k" with ``n`` children, ``fail`` of them FAILED."""
    view = NodeView()
    view.tasks["wf"] = _task("wf", "fan_in", TaskStatus.SUCCEEDED, result)
    view.payloads["wf"] = None
    for i in range(n):
        status = TaskStatus.FAILED if i in fail else TaskStatus.SUCCEEDED
        view.tasks[f"c{i}"] = _task(f"c{i}", "child", status)
        view.payloads[f"c{i}"] = {"wf": "k", "i": i, "fail": i in fail}
    view.fires["wf"] = set(range(fires))
    return view


def _judge(view: NodeView, tmp_path: Path) -> dict[str, object]:
    history = History(tmp_path / "history.jsonl")
    run = Run(cluster=None, history=history, journal=tmp_path / "j")  # type: ignore[arg-type]
    run.acked["k"] = "wf"
    try:
        return _check([Plan(key="k", n=4, fail=[2])], run, {}, view, Counter(), history)
    finally:
        history.close()


def test_the_checker_passes_a_right_run_and_catches_each_fault(tmp_path: Path) -> None:
    right = chaos_app.expected(4, [2])
    ok = _judge(_view(4, [2], result=right, fires=1), tmp_path)
    assert ok["valid"] == "unknown"  # safe, but nothing was killed: not a pass
    early = chaos_app.summary([0, 3, None, 9])  # fired before child 2 landed
    assert _judge(_view(4, [2], result=early, fires=1), tmp_path)["valid"] is False
    assert _judge(_view(4, [2], result=right, fires=2), tmp_path)["valid"] is False
    assert _judge(_view(3, [2], result=right, fires=1), tmp_path)["valid"] is False  # lost one
    wrong_state = _view(4, [], result=right, fires=1)  # child 2 SUCCEEDED; it must fail
    assert _judge(wrong_state, tmp_path)["valid"] is False
