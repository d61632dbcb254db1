"""Durations as users write them, turned into the wire's integer milliseconds.

Accepted: seconds as ``int``/``float``, ``datetime.timedelta``, or a string of number+unit
parts with no spaces: ``"250ms"``, ``"10s"``, ``"10m"``, ``"1h30m"``, ``"2d"``, ``"1.5h"``.
A bare number string (``"10"``) is seconds. Anything else is a ``ContractError`` that names the
option, so a typo in a decorator fails at import time, not at 3 a.m.
"""

from __future__ import annotations

import math
import re
from datetime import timedelta
from typing import TypeAlias

from conveyor.errors import ContractError

Duration: TypeAlias = int | float | timedelta | str

_UNIT_MS = {"ms": 1.0, "s": 1_000.0, "m": 60_000.0, "h": 3_600_000.0, "d": 86_400_000.0}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
_BARE = re.compile(r"\d+(?:\.\d+)?")


def to_ms(value: Duration, *, field: str = "duration") -> int:
    """``value`` in whole milliseconds (rounded); never negative."""
    if isinstance(value, bool):  # bool is an int subclass: True is surely a mistake
        raise ContractError(f"{field}: expected a duration, got {value!r}", field=field)
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1000.0
    elif isinstance(value, int | float):
        ms = float(value) * 1000.0
    elif isinstance(value, str):
        ms = _parse(value, field)
    else:
        raise ContractError(
            f"{field}: expected seconds, a timedelta or a string like '10m', got "
            f"{type(value).__name__}",
            field=field,
        )
    if not math.isfinite(ms) or ms < 0:
        raise ContractError(f"{field}: must be a finite duration >= 0, got {value!r}", field=field)
    return round(ms)


def to_ms_or_none(value: Duration | None, *, field: str = "duration") -> int | None:
    return None if value is None else to_ms(value, field=field)


def _parse(text: str, field: str) -> float:
    raw = text.strip().lower()
    if _BARE.fullmatch(raw):
        return float(raw) * 1000.0
    total, pos = 0.0, 0
    for match in _PART.finditer(raw):
        if match.start() != pos:
            break
        total += float(match.group(1)) * _UNIT_MS[match.group(2)]
        pos = match.end()
    if pos == 0 or pos != len(raw):
        raise ContractError(
            f"{field}: cannot read {text!r} as a duration; write seconds (30), a timedelta, "
            "or number+unit parts such as '250ms', '10s', '10m', '1h30m', '2d'",
            field=field,
        )
    return total
