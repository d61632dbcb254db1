"""A one-minute cron schedule over a simulated day, on the machine with an injected clock.

The harness plays the partition leader: every ``TICK_MS`` of simulated time it proposes the
timers that are due, as ``FireTimers`` stamped with that time (the leader's clock is the only
clock the machine sees). An outage is a stretch of simulated time with no ticks at all.
"""

from __future__ import annotations

from conveyor.schemas import codec
from conveyor.schemas.types import CatchUp, EventKind, OverlapPolicy, UpsertSchedule
from conveyor.streams.machine.handlers.schedules import firing_task_id

from .harness import START_MS, Harness

MINUTE = 60_000
HOUR = 60 * MINUTE
DAY = 24 * HOUR
TICK_MS = 15_000  # the leader's timer loop: firings are at most this late
DAY_START = (START_MS // DAY + 1) * DAY  # a midnight, so the day holds 1,440 whole minutes


def every_minute(catch_up: CatchUp) -> Harness:
    h = Harness(now_ms=DAY_START - 1)
    template = codec.TASK_SPEC.encode(h.spec(task_id="", payload=b"{}"))
    record = UpsertSchedule(
        tenant="t1",
        schedule_id="minutely",
        cron="* * * * *",
        timezone="UTC",
        template=template,
        overlap=OverlapPolicy.ALLOW,
        catch_up=catch_up,
    )
    h.apply(record)
    return h


def run(h: Harness, until_ms: int, *, down: tuple[int, int] | None = None) -> list[str]:
    """Tick from the harness's now to ``until_ms`` (no ticks inside ``down``); the ids of
    the tasks the firings enqueued, in order."""
    enqueued: list[str] = []
    now = h.now_ms
    while now < until_ms:
        now = min(now + TICK_MS, until_ms)
        if down is not None and down[0] <= now < down[1]:
            continue
        out = h.fire_due(now)
        enqueued += [e.task_id for e in out.events if e.kind == EventKind.TaskEnqueued]
    return enqueued


def test_a_day_fires_exactly_1440_times() -> None:
    h = every_minute(CatchUp.ONCE)
    enqueued = run(h, DAY_START + DAY - 1)
    assert len(enqueued) == 1_440 == len(set(enqueued))
    expected = [firing_task_id(0, "t1", "minutely", DAY_START + i * MINUTE) for i in range(1_440)]
    assert enqueued == expected  # one per minute, in order, none late past its tick
    row = h.committed().schedule("t1", "minutely")
    assert row is not None and (row.fired, row.skipped) == (1_440, 0)
    assert row.next_fire_ms == DAY_START + DAY


def outage_day(catch_up: CatchUp) -> tuple[list[str], list[str]]:
    """A day with the leader down from 10:00:20 to 11:00:35: the hour's 60 occurrences
    10:01..11:00 are missed. (the firings inside the window, the ones after it)"""
    h = every_minute(catch_up)
    down = (DAY_START + 10 * HOUR + 20_000, DAY_START + 11 * HOUR + 35_000)
    before = run(h, down[0] - 1)
    assert len(before) == 10 * 60 + 1  # 00:00 .. 10:00
    inside = run(h, down[1] + TICK_MS, down=down)  # the first tick back, and nothing more
    after = run(h, DAY_START + DAY - 1)
    assert len(after) == 1_440 - 10 * 60 - 1 - 60  # 11:01 .. 23:59, each once
    row = h.committed().schedule("t1", "minutely")
    assert row is not None and row.next_fire_ms == DAY_START + DAY
    return inside, after


def test_after_an_hour_down_catch_up_once_fires_once_for_the_window() -> None:
    inside, after = outage_day(CatchUp.ONCE)
    latest = DAY_START + 11 * HOUR  # the last occurrence of the missed window
    assert inside == [firing_task_id(0, "t1", "minutely", latest)]
    assert firing_task_id(0, "t1", "minutely", latest + MINUTE) == after[0]


def test_after_an_hour_down_catch_up_none_fires_nothing_for_the_window() -> None:
    inside, after = outage_day(CatchUp.NONE)
    assert inside == []
    assert firing_task_id(0, "t1", "minutely", DAY_START + 11 * HOUR + MINUTE) == after[0]
