"""Cron arithmetic for schedules: occurrences of an expression in a time zone, in epoch ms.

Rule 1 (why the pure machine may call this): every function here maps (expression, zone,
instant) to an instant. The instant always comes from the caller (a record's ``ts_ms`` or a
stored fire time), never from a clock: nothing here calls ``now()``, and expressions that draw
random values (``R``) or need a seed (``H``) are refused. The zone rules come from the tz
database, a read-only input shipped with the deployment like the code itself; each decision
taken from them is stored (the armed fire time sits in the schedule row), and a record is
applied once, so a tzdata update moves future occurrences only.
Rule 2 (resolution): five fields, minute resolution. The minimum interval between two
firings is one minute; a sixth (seconds) field is refused.
Rule 3 (daylight saving): croniter reads the expression in local wall-clock time. On a
spring-forward day a time inside the gap fires once, at the first instant after the gap. On a
fall-back day the repeated hour fires once for an expression with fixed hours (a daily 01:30
fires at the first 01:30 only), and at every tick for an expression that runs every hour
(``*/30 * * * *`` keeps its 30-minute cadence in real time).

This module sits outside ``streams/machine`` because it converts instants with ``datetime``,
which the machine's import ban (tests/unit/test_purity.py) forbids wholesale; a test checks
that it never reads the clock.
"""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

FIELDS = 5
ALIASES = frozenset(
    {"@yearly", "@annually", "@monthly", "@weekly", "@daily", "@midnight", "@hourly"}
)
EXPRESSION_BYTES_MAX = 256
INTERVAL_MS_MIN = 60_000  # documented: minute resolution, so never more often than this


def problem(expression: str, timezone: str) -> str | None:
    """Why ``expression`` in ``timezone`` cannot be a schedule, or None."""
    shape = _shape_problem(expression)
    if shape is not None:
        return f"invalid cron expression {expression!r}: {shape}"
    try:
        croniter(expression)
    except ValueError as exc:  # every croniter error about an expression is a ValueError
        return f"invalid cron expression {expression!r}: {exc}"
    if _zone(timezone) is None:
        return f"unknown timezone {timezone!r}: expected an IANA zone name like 'Europe/Paris'"
    # Any fixed instant works: an expression that fires at all fires within croniter's search
    # horizon from any start; a fixed one keeps validation a pure function.
    if next_after(expression, timezone, 0) is None:
        return f"cron expression {expression!r} never fires (no date matches all its fields)"
    return None


def _shape_problem(expression: str) -> str | None:
    if not expression.strip():
        return "empty"
    if len(expression.encode()) > EXPRESSION_BYTES_MAX:
        return f"longer than {EXPRESSION_BYTES_MAX} bytes"
    fields = expression.split()
    if len(fields) == 1 and fields[0].lower() in ALIASES:
        return None
    if len(fields) != FIELDS:
        return (
            f"expected {FIELDS} fields (minute hour day-of-month month day-of-week), "
            f"got {len(fields)}; the minimum interval is one minute"
        )
    if any(_drawn(field) for field in fields):
        return "random (R) and hashed (H) fields are not supported"
    return None


def _drawn(field: str) -> bool:
    """A field croniter fills with a random or hashed value (``R``, ``H``, ``H(0-29)/5``)."""
    tokens = field.upper().replace("/", ",").split(",")
    return any(token in ("R", "H") or token.startswith(("R(", "H(")) for token in tokens)


def _zone(name: str) -> ZoneInfo | None:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


def _every_hour(expression: str) -> bool:
    hours = croniter(expression).expanded[1]
    return hours == ["*"] or len(hours) >= 24


def _repeated(at: datetime) -> bool:
    """``at`` is the second occurrence of a wall-clock time that a fall-back repeats."""
    return at.replace(fold=0).utcoffset() != at.utcoffset()


def _ms(at: datetime) -> int:
    return round(at.timestamp() * 1000)


def next_after(expression: str, timezone: str, after_ms: int) -> int | None:
    """The first occurrence strictly after ``after_ms``; None if there is none."""
    zone = _zone(timezone)
    if zone is None:
        return None
    skip_repeats = not _every_hour(expression)
    try:
        it = croniter(expression, datetime.fromtimestamp(after_ms / 1000, zone))
        for _ in range(3):  # a repeated occurrence is skipped at most once in a row
            at: datetime = it.get_next(datetime)
            if not (skip_repeats and _repeated(at)):
                return _ms(at)
    except (CroniterBadDateError, OverflowError, ValueError):  # none before year 10000
        return None
    return None


def last_at_or_before(expression: str, timezone: str, at_ms: int) -> int | None:
    """The latest occurrence at or before ``at_ms``; None if there is none."""
    zone = _zone(timezone)
    if zone is None:
        return None
    skip_repeats = not _every_hour(expression)
    try:
        it = croniter(expression, datetime.fromtimestamp((at_ms + 1) / 1000, zone))
        for _ in range(3):
            at: datetime = it.get_prev(datetime)
            if not (skip_repeats and _repeated(at)):
                return _ms(at)
    except (CroniterBadDateError, OverflowError, ValueError):  # out of datetime's range
        return None
    return None
