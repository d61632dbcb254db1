"""Cron schedules in the pure machine: UpsertSchedule, DeleteSchedule, SCHEDULE timers."""

from __future__ import annotations

import ast
from datetime import UTC, datetime
from pathlib import Path
from zoneinfo import ZoneInfo

from conveyor.schemas import codec
from conveyor.schemas.types import (
    CatchUp,
    DeleteSchedule,
    OverlapPolicy,
    PauseSchedule,
    Schedule,
    Task,
    TaskStatus,
    TimerKind,
    TimerRef,
    UpsertSchedule,
)
from conveyor.streams import cron
from conveyor.streams.machine import CancelLease, Reply
from conveyor.streams.machine.handlers.schedules import MISFIRE_GRACE_MS, firing_task_id
from conveyor.streams.machine.outcome import Outcome

from .harness import START_MS, Harness, actions_of

MINUTE = 60_000
HOUR = 60 * MINUTE
FIVE = 5 * MINUTE


def next_five(ms: int) -> int:
    """The first multiple of five minutes strictly after ``ms``."""
    return (ms // FIVE + 1) * FIVE


def upsert(
    h: Harness,
    schedule_id: str = "s1",
    expression: str = "*/5 * * * *",
    *,
    timezone: str = "UTC",
    overlap: OverlapPolicy = OverlapPolicy.ALLOW,
    catch_up: CatchUp = CatchUp.ONCE,
    ts_ms: int | None = None,
) -> Outcome:
    template = codec.TASK_SPEC.encode(h.spec(task_id="", payload=b'{"n":1}'))
    record = UpsertSchedule(
        tenant="t1",
        schedule_id=schedule_id,
        cron=expression,
        timezone=timezone,
        template=template,
        overlap=overlap,
        catch_up=catch_up,
    )
    return h.apply(record, ts_ms=ts_ms)


def row(h: Harness, schedule_id: str = "s1") -> Schedule:
    found = h.committed().schedule("t1", schedule_id)
    assert found is not None
    return found


def schedule_timers(h: Harness) -> list[TimerRef]:
    return [t for t in h.timers() if t.kind == TimerKind.SCHEDULE]


def tasks(h: Harness) -> list[Task]:
    return sorted(h.committed().tasks(), key=lambda t: t.created_ms)


def reply(outcome: Outcome) -> Reply:
    (only,) = actions_of(outcome, Reply)
    assert isinstance(only, Reply)
    return only


# -- arming ---------------------------------------------------------------------------------


def test_upsert_arms_only_the_next_occurrence() -> None:
    h = Harness()
    r = reply(upsert(h))
    assert (r.ok, r.created, r.task_id) == (True, True, "s1")
    (timer,) = schedule_timers(h)
    assert timer.fire_at_ms == next_five(START_MS) == row(h).next_fire_ms
    assert timer.token == row(h).generation == 1
    assert tasks(h) == []


def test_firing_enqueues_with_the_schedule_key_and_rearms() -> None:
    h = Harness(partition=3)
    upsert(h)
    first = next_five(START_MS)
    out = h.fire_due(first)
    (task,) = tasks(h)
    assert task.task_id == firing_task_id(3, "t1", "s1", first)
    assert task.task_id.startswith("0003")  # the schedule's partition owns the task
    assert task.status == TaskStatus.ENQUEUED
    spec = h.committed().spec(task.task_id)
    assert spec is not None and spec.idempotency_key == f"s1@{first}"
    assert spec.payload == b'{"n":1}' and spec.tenant == "t1"
    assert [e.kind.value for e in out.events] == ["TaskEnqueued"]
    assert [t.fire_at_ms for t in schedule_timers(h)] == [first + FIVE]
    assert (row(h).last_task_id, row(h).last_fire_ms, row(h).fired) == (task.task_id, first, 1)


def test_a_refire_of_the_same_time_meets_its_twin() -> None:
    h = Harness()
    upsert(h)
    first = next_five(START_MS)
    h.fire_due(first)
    # A gateway whose clock lags stamps an identical upsert before the tick that just fired:
    # the tick is armed again, and firing it again must not create a second task.
    upsert(h, ts_ms=first - 1_000)
    assert [t.fire_at_ms for t in schedule_timers(h)] == [first]
    h.now_ms = first + 10
    out = h.fire_due()
    assert len(tasks(h)) == 1
    assert out.events == []
    assert row(h).next_fire_ms == first + FIVE


def test_a_timer_proposed_twice_fires_once() -> None:
    h = Harness()
    upsert(h)
    first = next_five(START_MS)
    h.now_ms = first
    due = h.due()
    h.fire(due)
    h.fire(due)
    assert len(tasks(h)) == 1


# -- overlap ----------------------------------------------------------------------------------


def test_overlap_allow_enqueues_while_the_previous_runs() -> None:
    h = Harness()
    upsert(h, overlap=OverlapPolicy.ALLOW)
    h.fire_due(next_five(START_MS))
    h.fire_due(next_five(START_MS) + FIVE)
    assert [t.status for t in tasks(h)] == [TaskStatus.ENQUEUED, TaskStatus.ENQUEUED]


def test_overlap_skip_drops_the_firing_while_the_previous_is_not_terminal() -> None:
    h = Harness()
    upsert(h, overlap=OverlapPolicy.SKIP)
    first = next_five(START_MS)
    h.fire_due(first)
    (task,) = tasks(h)
    grant = h.lease_one(task.task_id)
    h.fire_due(first + FIVE)  # still LEASED: skipped
    assert len(tasks(h)) == 1 and row(h).skipped == 1
    h.complete(task.task_id, grant.lease_id)
    h.fire_due(first + 2 * FIVE)  # finished: this one runs
    assert [t.status for t in tasks(h)] == [TaskStatus.SUCCEEDED, TaskStatus.ENQUEUED]
    assert row(h).next_fire_ms == first + 3 * FIVE


def test_overlap_cancel_previous_cancels_a_waiting_task_in_the_same_record() -> None:
    h = Harness()
    upsert(h, overlap=OverlapPolicy.CANCEL_PREVIOUS)
    first = next_five(START_MS)
    h.fire_due(first)
    out = h.fire_due(first + FIVE)
    assert [e.kind.value for e in out.events] == ["TaskCanceled", "TaskEnqueued"]
    old, new = tasks(h)
    assert (old.status, new.status) == (TaskStatus.CANCELED, TaskStatus.ENQUEUED)
    assert old.error_message is not None and "schedule 's1'" in old.error_message


def test_overlap_cancel_previous_asks_a_running_task_to_stop() -> None:
    h = Harness()
    upsert(h, overlap=OverlapPolicy.CANCEL_PREVIOUS)
    first = next_five(START_MS)
    h.fire_due(first)
    (task,) = tasks(h)
    grant = h.lease_one(task.task_id)
    out = h.fire_due(first + FIVE)
    assert actions_of(out, CancelLease) == [
        CancelLease(task_id=task.task_id, lease_id=grant.lease_id)
    ]
    assert len(tasks(h)) == 2


# -- misfires ---------------------------------------------------------------------------------


def test_catch_up_once_fires_once_for_a_long_outage() -> None:
    h = Harness()
    upsert(h)
    first = next_five(START_MS)
    back = first + 10 * HOUR + 7 * MINUTE  # 120 ticks missed
    h.fire_due(back)
    (task,) = tasks(h)
    latest = back - 2 * MINUTE  # the last tick of the missed window
    assert task.task_id == firing_task_id(0, "t1", "s1", latest)
    assert row(h).last_fire_ms == latest
    assert [t.fire_at_ms for t in schedule_timers(h)] == [latest + FIVE]
    assert h.fire_due(back + MINUTE).events == []  # nothing else due


def test_catch_up_none_skips_the_missed_window() -> None:
    h = Harness()
    upsert(h, catch_up=CatchUp.NONE)
    first = next_five(START_MS)
    h.fire_due(first + MISFIRE_GRACE_MS)  # late but within the grace: fires
    assert len(tasks(h)) == 1
    back = first + 3 * HOUR + 3 * MINUTE
    h.fire_due(back)
    assert len(tasks(h)) == 1 and row(h).skipped == 1
    assert [t.fire_at_ms for t in schedule_timers(h)] == [next_five(back)]


# -- upsert and delete ------------------------------------------------------------------------


def test_delete_disarms_and_a_stale_timer_does_nothing() -> None:
    h = Harness()
    upsert(h)
    (timer,) = schedule_timers(h)
    assert reply(h.apply(DeleteSchedule(tenant="t1", schedule_id="s1"))).ok
    assert schedule_timers(h) == [] and h.committed().schedule("t1", "s1") is None
    h.now_ms = timer.fire_at_ms
    h.fire([timer])
    assert tasks(h) == []
    again = reply(h.apply(DeleteSchedule(tenant="t1", schedule_id="s1")))
    assert (again.ok, again.reason) == (False, "unknown schedule")


def test_deletes_are_tenant_scoped() -> None:
    h = Harness()
    upsert(h)
    assert not reply(h.apply(DeleteSchedule(tenant="t2", schedule_id="s1"))).ok
    assert len(schedule_timers(h)) == 1


def test_an_upsert_replaces_the_armed_timer() -> None:
    h = Harness()
    upsert(h)
    (old,) = schedule_timers(h)
    r = reply(upsert(h, expression="0 * * * *"))
    assert (r.ok, r.created) == (True, False)
    (new,) = schedule_timers(h)
    assert new.token == 2 and new.fire_at_ms == (START_MS // HOUR + 1) * HOUR
    h.now_ms = new.fire_at_ms
    h.fire([old])  # the replaced timer: gone, and stale by generation anyway
    assert tasks(h) == []


# -- pause and resume -------------------------------------------------------------------------


def pause(h: Harness, paused: bool = True, schedule_id: str = "s1", tenant: str = "t1") -> Reply:
    return reply(h.apply(PauseSchedule(tenant=tenant, schedule_id=schedule_id, paused=paused)))


def test_pause_keeps_the_row_and_disarms_its_timer() -> None:
    h = Harness()
    upsert(h)
    first = next_five(START_MS)
    h.fire_due(first)
    (armed,) = schedule_timers(h)
    assert pause(h).ok
    paused = row(h)
    assert paused.paused and paused.next_fire_ms is None and schedule_timers(h) == []
    assert (paused.fired, paused.last_fire_ms, paused.generation) == (1, first, 2)
    h.now_ms = armed.fire_at_ms
    h.fire([armed])  # proposed before the pause landed: stale
    h.fire_due(first + 3 * HOUR)
    assert len(tasks(h)) == 1 and row(h).fired == 1


def test_resume_arms_the_next_occurrence_after_now_without_catch_up() -> None:
    h = Harness()
    upsert(h, catch_up=CatchUp.ONCE)
    pause(h)
    back = START_MS + 2 * HOUR + 7 * MINUTE  # 25 occurrences passed while paused
    h.now_ms = back
    assert pause(h, paused=False).ok
    resumed = row(h)
    assert not resumed.paused and resumed.generation == 3
    assert [t.fire_at_ms for t in schedule_timers(h)] == [next_five(back)] == [resumed.next_fire_ms]
    assert h.fire_due(back + MINUTE).events == []  # the paused window never fires
    h.fire_due(next_five(back))
    (task,) = tasks(h)
    assert task.task_id == firing_task_id(0, "t1", "s1", next_five(back))


def test_pause_and_resume_are_idempotent_and_scoped() -> None:
    h = Harness()
    upsert(h)
    assert pause(h).ok
    before = h.dump(applied=False)
    assert pause(h).ok  # already paused: acknowledged, nothing changes
    assert h.dump(applied=False) == before
    assert pause(h, paused=False).ok
    (timer,) = schedule_timers(h)
    assert pause(h, paused=False).ok
    assert schedule_timers(h) == [timer]
    assert not pause(h, tenant="t2").ok
    missing = pause(h, schedule_id="nope")
    assert (missing.ok, missing.reason) == (False, "unknown schedule")
    assert not row(h).paused


def test_an_upsert_of_a_paused_schedule_stays_paused() -> None:
    h = Harness()
    upsert(h)
    pause(h)
    assert reply(upsert(h, expression="0 * * * *")).ok
    assert row(h).paused and row(h).cron == "0 * * * *" and schedule_timers(h) == []
    pause(h, paused=False)
    assert [t.fire_at_ms for t in schedule_timers(h)] == [(START_MS // HOUR + 1) * HOUR]


def test_invalid_records_are_refused_without_state() -> None:
    h = Harness()
    before = h.dump(applied=False)
    r = reply(upsert(h, expression="61 * * * *"))
    assert not r.ok and r.reason is not None
    assert r.reason.startswith("invalid cron expression '61 * * * *': ")
    assert not reply(upsert(h, timezone="Mars/Olympus")).ok
    assert "never fires" in str(reply(upsert(h, expression="0 0 30 2 *")).reason)
    bad = UpsertSchedule(
        tenant="t1",
        schedule_id="s1",
        cron="* * * * *",
        timezone="UTC",
        template=b"\xff\xff",
        overlap=OverlapPolicy.ALLOW,
        catch_up=CatchUp.ONCE,
    )
    assert not reply(h.apply(bad)).ok
    assert h.dump(applied=False) == before


# -- time zones and daylight saving ------------------------------------------------------------

NEW_YORK = ZoneInfo("America/New_York")


def local(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, NEW_YORK).isoformat()


def fire_through(h: Harness, until: datetime) -> list[str]:
    """Fire every schedule timer up to ``until``; the local times of the firings."""
    end = int(until.timestamp() * 1000)
    fired: list[str] = []
    while True:
        timers = schedule_timers(h)
        if not timers or timers[0].fire_at_ms > end:
            return fired
        h.fire_due(max(h.now_ms, timers[0].fire_at_ms))
        last = row(h).last_fire_ms
        assert last is not None
        fired.append(local(last))


def test_spring_forward_fires_a_time_in_the_gap_once_after_it() -> None:
    start = datetime(2024, 3, 9, 12, tzinfo=NEW_YORK)
    h = Harness(now_ms=int(start.timestamp() * 1000))
    upsert(h, expression="30 2 * * *", timezone="America/New_York")
    fired = fire_through(h, datetime(2024, 3, 11, 12, tzinfo=NEW_YORK))
    # 02:30 does not exist on 10 March: it fires once, at 03:00 EDT.
    assert fired == ["2024-03-10T03:00:00-04:00", "2024-03-11T02:30:00-04:00"]


def test_fall_back_fires_a_fixed_time_once() -> None:
    start = datetime(2024, 11, 2, 12, tzinfo=NEW_YORK)
    h = Harness(now_ms=int(start.timestamp() * 1000))
    upsert(h, expression="30 1 * * *", timezone="America/New_York")
    fired = fire_through(h, datetime(2024, 11, 4, 12, tzinfo=NEW_YORK))
    assert fired == ["2024-11-03T01:30:00-04:00", "2024-11-04T01:30:00-05:00"]
    assert len(tasks(h)) == 2


def test_fall_back_keeps_an_interval_schedule_s_cadence() -> None:
    start = datetime(2024, 11, 3, 0, 50, tzinfo=NEW_YORK)
    h = Harness(now_ms=int(start.timestamp() * 1000))
    upsert(h, expression="*/30 * * * *", timezone="America/New_York")
    fired = fire_through(h, datetime(2024, 11, 3, 2, 0, tzinfo=NEW_YORK))
    assert fired == [
        "2024-11-03T01:00:00-04:00",
        "2024-11-03T01:30:00-04:00",
        "2024-11-03T01:00:00-05:00",
        "2024-11-03T01:30:00-05:00",
        "2024-11-03T02:00:00-05:00",
    ]


# -- the cron module ---------------------------------------------------------------------------


def test_cron_validation_names_the_problem() -> None:
    assert cron.problem("*/5 * * * *", "Europe/Paris") is None
    assert cron.problem("0 9 * * MON-FRI", "UTC") is None
    assert cron.problem("@daily", "UTC") is None
    assert str(cron.problem("61 * * * *", "UTC")).startswith("invalid cron expression '61 * * * *'")
    assert "5 fields" in str(cron.problem("* * * * * *", "UTC"))  # no seconds: 1 minute minimum
    assert "not supported" in str(cron.problem("H * * * *", "UTC"))
    assert "unknown timezone 'Nowhere/Else'" in str(cron.problem("* * * * *", "Nowhere/Else"))
    assert "never fires" in str(cron.problem("0 0 31 4 *", "UTC"))


def test_cron_arithmetic_is_strictly_after_and_at_or_before() -> None:
    t0 = int(datetime(2024, 1, 1, 0, 5, tzinfo=UTC).timestamp() * 1000)
    assert cron.next_after("*/5 * * * *", "UTC", t0) == t0 + FIVE
    assert cron.last_at_or_before("*/5 * * * *", "UTC", t0) == t0
    assert cron.last_at_or_before("*/5 * * * *", "UTC", t0 - 1) == t0 - FIVE


def test_the_cron_module_never_reads_the_clock() -> None:
    source = Path(cron.__file__).read_text()
    calls = {
        node.func.attr
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
    }
    assert not calls & {"now", "today", "utcnow", "time", "monotonic", "random"}
