"""``agents/prefetch.py``: the leases an agent holds beyond its guests, fixed or adapted."""

from __future__ import annotations

import pytest

from conveyor.agents.prefetch import TICK_MS, WINDOW_MS, Prefetch
from conveyor.schemas.limits import POLL_CAPACITY_MAX


def run(prefetch: Prefetch, start_ms: float, seconds: float, per_ms: float) -> float:
    """Attempts ending at ``per_ms`` for ``seconds``; the time after the last."""
    step = 1 / per_ms
    now = start_ms
    while now < start_ms + seconds * 1000:
        prefetch.ended(now)
        now += step
    return now


def test_a_fixed_prefetch_is_what_was_asked_whatever_the_pace() -> None:
    prefetch = Prefetch.of(8, 3)
    assert prefetch.fixed and prefetch.size(0) == 3
    end = run(prefetch, 0, 1, per_ms=5)
    assert prefetch.size(end) == 3


def test_an_adapted_prefetch_starts_at_the_guests_and_grows_to_one_full_poll_for_fast_work() -> (
    None
):
    prefetch = Prefetch.of(8, None)
    assert (prefetch.floor, prefetch.cap) == (8, POLL_CAPACITY_MAX - 8)
    assert prefetch.size(0) == 8  # nothing measured yet
    end = run(prefetch, 0, 1, per_ms=1)  # 1,000 attempts a second: 500 in the window
    assert prefetch.size(end) == pytest.approx(WINDOW_MS, rel=0.05)
    end = run(prefetch, end, 1, per_ms=50)  # 50,000 a second: far past one poll
    assert prefetch.size(end) == POLL_CAPACITY_MAX - 8


def test_slow_work_keeps_the_prefetch_at_the_guests() -> None:
    prefetch = Prefetch.of(8, None)
    end = run(prefetch, 0, 5, per_ms=0.008)  # 8 guests on tasks of a second
    assert prefetch.size(end) == 8


def test_a_pause_brings_a_grown_prefetch_back_to_the_guests_within_a_few_ticks() -> None:
    prefetch = Prefetch.of(8, None)
    end = run(prefetch, 0, 1, per_ms=50)
    assert prefetch.size(end) == POLL_CAPACITY_MAX - 8
    assert prefetch.size(end + 12 * TICK_MS) == 8  # halved each tick: 992 / 2^12 < 8


def test_the_rate_follows_a_slowdown_without_a_pause() -> None:
    prefetch = Prefetch.of(4, None)
    end = run(prefetch, 0, 1, per_ms=50)
    end = run(prefetch, end, 2, per_ms=0.5)  # slower work: 250 in the window
    assert prefetch.size(end) == pytest.approx(0.5 * WINDOW_MS, rel=0.1)


def test_more_guests_than_one_poll_takes_hold_nothing_beyond_them() -> None:
    prefetch = Prefetch.of(POLL_CAPACITY_MAX + 5, None)
    assert (prefetch.floor, prefetch.cap) == (0, 0)
    end = run(prefetch, 0, 1, per_ms=50)
    assert prefetch.size(end) == 0


def test_bounds_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="floor <= cap"):
        Prefetch(9, 8)
