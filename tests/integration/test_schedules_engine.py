"""Cron schedules through ``conveyor.testing.Engine``: firings come as ``advance`` moves time."""

from __future__ import annotations

import pytest

import conveyor
import conveyor.testing

pytestmark = pytest.mark.timeout(120)

app = conveyor.App("schedule-tests")
runs: list[int] = []


@app.task
def tick(payload: int) -> int:
    runs.append(payload)
    return payload


def test_advance_over_three_periods_runs_three_tasks() -> None:
    runs.clear()
    with conveyor.testing.Engine(app) as engine:
        info = engine.client.schedule(tick, 7, cron="*/5 * * * *")
        assert info.schedule_id == "tick" and info.next_fire_ms is not None
        # Stand just before the first tick, then cross three of them.
        engine.advance((info.next_fire_ms - engine.now_ms() - 1) / 1000)
        assert runs == []
        for _ in range(3):
            engine.advance("5m")
        assert runs == [7, 7, 7]
        (row,) = engine.client.schedules()
        assert row.fired == 3 and row.last_task_id is not None
        assert engine.client.get(row.last_task_id).status == "SUCCEEDED"
        engine.drain()  # schedules never end: drain plays out tasks only, and returns
        engine.client.unschedule("tick")
        engine.advance("1h")
        assert runs == [7, 7, 7]
        assert engine.client.schedules() == []
        with pytest.raises(conveyor.NotFound):
            engine.client.unschedule("tick")


def test_a_bad_expression_is_refused_with_its_reason() -> None:
    with (
        conveyor.testing.Engine(app, durable=False) as engine,
        pytest.raises(conveyor.ContractError, match="invalid cron expression '61 \\* \\* \\* \\*'"),
    ):
        engine.client.schedule(tick, 1, cron="61 * * * *")


def test_pause_stops_firings_and_resume_skips_the_paused_window() -> None:
    runs.clear()
    with conveyor.testing.Engine(app) as engine:
        info = engine.client.schedule(tick, 3, cron="*/5 * * * *")
        assert info.next_fire_ms is not None
        engine.advance((info.next_fire_ms - engine.now_ms()) / 1000)
        assert runs == [3]
        paused = engine.client.pause_schedule("tick")
        assert paused.paused and paused.next_fire_ms is None and paused.fired == 1
        engine.advance("1h")
        assert runs == [3]  # twelve occurrences passed while paused: none fired
        resumed = engine.client.resume_schedule("tick")
        assert not resumed.paused and resumed.next_fire_ms is not None
        assert 0 < resumed.next_fire_ms - engine.now_ms() <= 5 * 60_000
        engine.advance("1m")
        assert runs == [3]  # resuming does not catch up the paused hour
        engine.advance("5m")
        assert runs == [3, 3]
        (row,) = engine.client.schedules()
        assert (row.fired, row.paused) == (2, False)
        with pytest.raises(conveyor.NotFound):
            engine.client.pause_schedule("nope")


@pytest.mark.parametrize(("catch_up", "fired_for_the_hour"), [("once", 1), ("none", 0)])
def test_an_hour_without_ticks_fires_per_the_catch_up_policy(
    catch_up: str, fired_for_the_hour: int
) -> None:
    """Through the real processor and its timer scanner: the fake clock jumps an hour at once,
    so no timer is proposed inside it, as when the node is down."""
    runs.clear()
    with conveyor.testing.Engine(app) as engine:
        info = engine.client.schedule(tick, 1, cron="* * * * *", catch_up=catch_up)
        assert info.next_fire_ms is not None
        engine.advance((info.next_fire_ms - engine.now_ms()) / 1000)
        for _ in range(4):
            engine.advance("1m")
        assert runs == [1] * 5  # on time: every minute
        engine.advance("1h")  # 60 occurrences pass with no tick
        assert len(runs) == 5 + fired_for_the_hour
        engine.advance("1m")
        assert len(runs) == 6 + fired_for_the_hour  # then every minute again
        (row,) = engine.client.schedules()
        assert row.fired == len(runs)
