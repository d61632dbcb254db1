"""Workflows through ``conveyor.testing.Engine``: ``@app.workflow`` and ``ctx.parallel`` on the
real node, agent and machine, handlers in this process, a fake clock."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import conveyor
from conveyor.streams.machine.handlers.workflows import SPILL_AFTER, child_id
from conveyor.testing import Engine

pytestmark = pytest.mark.timeout(120)

app = conveyor.App("workflow-tests")
calls: list[str] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine(app, durable=False) as e:
        yield e


@app.task(retry=conveyor.Retry(attempts=1))
def square(n: int) -> int:
    calls.append(f"square {n}")
    if n < 0:
        raise conveyor.FatalError(f"{n} is negative")
    return n * n


@app.task
def park(ctx: conveyor.Context, _: Any) -> str:
    ctx.step.sleep("1h")  # stays away until the clock moves
    return "woke"


@app.workflow
def squares(ctx: conveyor.Context, payload: dict[str, Any]) -> list[Any]:
    calls.append("workflow body")
    ctx.step.run("before", lambda: calls.append("before ran") or "b")
    results = ctx.parallel(
        "squares", [(square, n) for n in payload["numbers"]], mode=payload.get("mode", "collect")
    )
    ctx.step.run("after", lambda: calls.append("after ran") or "a")
    return [r if not isinstance(r, conveyor.ChildError) else r.error_class for r in results]


@app.workflow
def waits_on_sleepers(ctx: conveyor.Context, n: int) -> list[Any]:
    return ctx.parallel("park", [conveyor.Enqueue(park, i) for i in range(n)])


@app.workflow
def bad_child(ctx: conveyor.Context, _: Any) -> Any:
    return ctx.parallel("x", [("no_such_type", 1)])


@app.workflow
def nested(ctx: conveyor.Context, _: Any) -> Any:
    inner = ctx.parallel(
        "inner", [conveyor.Enqueue(squares, {"numbers": [1, 2]}), (squares, {"numbers": [3]})]
    )
    return sum(sum(r) for r in inner)


@app.workflow
def wide(ctx: conveyor.Context, n: int) -> Any:
    return ctx.parallel("wide", [(square, i) for i in range(n)])


@app.workflow
def fast_with_sleepers(ctx: conveyor.Context, _: Any) -> Any:
    children = [conveyor.Enqueue(park, 0), conveyor.Enqueue(park, 1), (square, -1)]
    return ctx.parallel("mixed", children, mode="fail_fast")


def test_collect_resumes_with_results_in_order_and_errors_in_place(engine: Engine) -> None:
    handle = engine.client.enqueue(squares, {"numbers": [3, -1, 2, 5]})
    engine.run_until_idle()
    assert handle.result() == [9, "FatalError", 4, 25]
    # the body ran twice (fan-out, then resume); the memoized steps ran once each
    assert calls.count("workflow body") == 2
    assert calls.count("before ran") == 1 and calls.count("after ran") == 1
    assert sorted(c for c in calls if c.startswith("square")) == [
        "square -1",
        "square 2",
        "square 3",
        "square 5",
    ]
    info = handle.get()
    assert [a.outcome for a in info.attempts] == ["FANNED_OUT", "SUCCEEDED"]


def test_fail_fast_raises_child_failed_and_fails_the_workflow_without_retries(
    engine: Engine,
) -> None:
    handle = engine.client.enqueue(squares, {"numbers": [-7], "mode": "fail_fast"})
    engine.run_until_idle()
    info = handle.get()
    assert info.status == "FAILED"
    assert info.error is not None and info.error.error_class == "ChildFailed"
    assert "ended FAILED: FatalError: -7 is negative" in (info.error.message or "")
    assert calls.count("workflow body") == 2 and "after ran" not in calls


def test_fail_fast_cancels_the_siblings_still_running(engine: Engine) -> None:
    handle = engine.client.enqueue(fast_with_sleepers, None)
    engine.run_until_idle()
    assert handle.get().status == "FAILED"
    page = engine.client.list(task_type="park")
    assert sorted(t.status for t in page.tasks) == ["CANCELED", "CANCELED"]


def test_cancel_of_a_waiting_workflow_cascades_to_its_children(engine: Engine) -> None:
    handle = engine.client.enqueue(waits_on_sleepers, 3)
    engine.run_until_idle()
    assert handle.get().status == "WAITING"
    assert engine.client.cancel(handle.id) == "CANCELED"
    engine.run_until_idle()
    page = engine.client.list(task_type="park")
    assert [t.status for t in page.tasks] == ["CANCELED"] * 3
    engine.advance("2h")  # the children's sleeps are gone with them
    assert handle.get().status == "CANCELED"


def test_children_that_sleep_wake_the_workflow_when_the_last_one_is_done(engine: Engine) -> None:
    handle = engine.client.enqueue(waits_on_sleepers, 2)
    engine.run_until_idle()
    assert handle.get().status == "WAITING"
    engine.advance("1h")
    engine.run_until_idle()
    assert handle.result() == ["woke", "woke"]


def test_an_unknown_child_task_type_fails_the_workflow_loudly(engine: Engine) -> None:
    handle = engine.client.enqueue(bad_child, None)
    engine.run_until_idle()
    info = handle.get()
    assert info.status == "FAILED" and info.error is not None
    assert info.error.error_class == "BadFanOut"
    assert "no_such_type" in (info.error.message or "")


def test_a_fan_out_past_1000_children_spills_to_the_other_partition(engine: Engine) -> None:
    handle = engine.client.enqueue(wide, 1_050)
    engine.run_until_idle()
    assert handle.result() == [i * i for i in range(1_050)]
    assert [a.outcome for a in handle.get().attempts] == ["FANNED_OUT", "SUCCEEDED"]
    (parallel,) = engine.client.get_workflow(handle.id).parallel
    assert parallel.counts == {"SUCCEEDED": 1_050}
    for index in (0, 999, 1_000, 1_049):  # the engine's node has two partitions
        task = engine.client.get(child_id(handle.id, "wide#0", index, 2))
        assert task.status == "SUCCEEDED"
        assert (task.task_id[:4] == handle.id[:4]) == (index < SPILL_AFTER)


def test_workflows_nest(engine: Engine) -> None:
    handle = engine.client.enqueue(nested, None)
    engine.run_until_idle()
    assert handle.result() == 1 + 4 + 9


def test_bad_parallel_calls_are_refused_in_the_sdk() -> None:
    channel: Any = None
    ctx = conveyor.Context(
        task_id="t" * 32, task_type="x", attempt=1, checkpoint=None, channel=channel
    )
    with pytest.raises(conveyor.ContractError, match="mode must be"):
        ctx.parallel("p", [(square, 1)], mode="all")
    with pytest.raises(conveyor.ContractError, match=r"1\.\.10000 children"):
        ctx.parallel("q", [])
    with pytest.raises(conveyor.ContractError, match=r"child 0: give conveyor\.Enqueue"):
        ctx.parallel("r", [square])


@app.workflow
def approval(ctx: conveyor.Context, nap: str | None) -> Any:
    if nap:
        ctx.step.sleep(nap)
    try:
        decision = ctx.wait_for_event("approved", timeout="1h")
    except conveyor.EventTimeout as exc:
        return f"timed out waiting for {exc.name}"
    return {"decision": decision}


def test_wait_for_event_resumes_with_the_events_payload(engine: Engine) -> None:
    handle = engine.client.enqueue(approval, None)
    engine.run_until_idle()
    assert handle.get().status == "WAITING"
    assert engine.client.send_event(handle.id, "rejected", 1) == "WAITING"  # kept, not for it
    engine.client.send_event(handle.id, "approved", {"by": "ann"})
    engine.run_until_idle()
    assert handle.result() == {"decision": {"by": "ann"}}


def test_an_event_sent_before_the_wait_is_kept_for_it(engine: Engine) -> None:
    handle = engine.client.enqueue(approval, "10m")
    engine.run_until_idle()
    assert handle.get().status == "SLEEPING"
    assert engine.client.send_event(handle.id, "approved", "early") == "SLEEPING"
    engine.advance("10m")
    engine.run_until_idle()
    assert handle.result() == {"decision": "early"}


def test_wait_for_event_times_out_with_event_timeout(engine: Engine) -> None:
    handle = engine.client.enqueue(approval, None)
    engine.run_until_idle()
    engine.advance("1h")
    engine.run_until_idle()
    assert handle.result() == "timed out waiting for approved"
    with pytest.raises(conveyor.ContractError, match="workflow is SUCCEEDED"):
        engine.client.send_event(handle.id, "approved", "too late")


def test_the_engine_client_reads_workflows_like_the_http_client(engine: Engine) -> None:
    handle = engine.client.enqueue(waits_on_sleepers, 2)
    engine.run_until_idle()
    wf = engine.client.get_workflow(handle.id)
    assert wf.workflow.status == "WAITING"
    assert [(s.identity, s.state) for s in wf.steps] == [("park#0", "WAITING")]
    assert [c.status for c in wf.parallel[0].children] == ["SLEEPING", "SLEEPING"]
    child = wf.parallel[0].children[0].task_id
    page = engine.client.workflow_history(child, limit=1)
    assert [s.identity for s in page.steps] == ["sleep#0"] and page.next_cursor is None


@app.workflow(retry=conveyor.Retry(attempts=3, base="1s"))
def too_big(ctx: conveyor.Context, _: Any) -> Any:
    return ctx.parallel("big", [(square, "x" * 3_000_000), (square, "y" * 2_000_000)])


def test_a_refused_fan_out_fails_the_workflow_without_retries(engine: Engine) -> None:
    handle = engine.client.enqueue(too_big, None)
    engine.run_until_idle()
    info = handle.get()
    assert info.status == "FAILED" and len(info.attempts) == 1
    assert info.error is not None and info.error.error_class == "WorkflowRefused"
    assert "a fan-out carries at most 4194304" in (info.error.message or "")


def test_the_engine_client_reruns_a_finished_workflow_afresh(engine: Engine) -> None:
    handle = engine.client.enqueue(approval, None)
    engine.run_until_idle()
    wait = engine.client.get_workflow(handle.id).workflow.waiting_for_event
    assert wait is not None and wait.name == "approved" and wait.deadline_ms is not None, wait
    with pytest.raises(conveyor.ContractError, match="only a finished task can be re-run"):
        engine.client.rerun(handle.id)
    engine.client.send_event(handle.id, "approved", "yes")
    engine.run_until_idle()
    assert handle.result() == {"decision": "yes"}

    again = engine.client.rerun(handle.id)  # a new task: its wait is not the old one's
    engine.run_until_idle()
    assert again != handle.id and engine.client.get(again).status == "WAITING"
    engine.client.send_event(again, "approved", "again")
    engine.run_until_idle()
    assert engine.client.get(again).result == {"decision": "again"}
    assert handle.result() == {"decision": "yes"}  # the old one is as it was


def test_the_engine_client_runs_a_schedule_now(engine: Engine) -> None:
    schedule = engine.client.schedule(square, 7, cron="0 4 1 1 *", schedule_id="yearly")
    task_id = engine.client.run_schedule("yearly")
    engine.run_until_idle()
    assert engine.client.get(task_id).result == 49
    after = engine.client.schedules()[0]
    assert (after.next_fire_ms, after.fired) == (schedule.next_fire_ms, 0)
    with pytest.raises(conveyor.NotFound):
        engine.client.run_schedule("no-such-schedule")
