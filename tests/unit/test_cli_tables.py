"""The CLI's task tables at a plain terminal's 80 columns: ids, states and times are never
cut; durations and times of day read at a glance."""

from __future__ import annotations

import time
from typing import Any

from rich.console import Console

from conveyor.cli.common import fmt_clock, fmt_took
from conveyor.cli.tasks import _attempts_table, _task_table

NOW_MS = int(time.time() * 1000)
TASK_ID = "0007451ace266fadccba8dbcd8d5a837"


def render(table: Any) -> list[str]:
    console = Console(width=80, record=True, color_system=None)
    with console.capture() as captured:
        console.print(table)
    return [line.rstrip() for line in captured.get().splitlines()]


def attempt(n: int, outcome: str | None, error: dict[str, str] | None) -> dict[str, Any]:
    return {
        "attempt": n,
        "worker": "vm-30396-367d81",
        "started_ms": NOW_MS,
        "finished_ms": NOW_MS + 219 if outcome else None,
        "outcome": outcome,
        "error": error,
    }


def test_an_attempt_row_shows_when_how_long_how_it_ended_and_why() -> None:
    timeout = {"class": "RetryableError", "message": "gateway timed out\nTraceback ..."}
    lines = render(_attempts_table([attempt(1, "FAILED", timeout), attempt(2, None, None)]))
    assert lines[0].split() == ["#", "started", "took", "outcome", "error", "worker"]
    first = lines[1].split()
    assert first[0] == "1" and first[1] == fmt_clock(NOW_MS, millis=True)
    assert first[2:5] == ["219", "ms", "FAILED"] and "RetryableError:" in first
    assert "Traceback" not in "\n".join(lines)  # the first line of the message only
    running = next(line for line in lines if line.startswith("2 "))
    assert "running" in running.split()


def test_a_task_row_keeps_its_id_and_state_whole() -> None:
    task = {"task_id": TASK_ID, "app": "shop", "task_type": "charge_card", "queue": "default"}
    rows = [{**task, "status": "SUCCEEDED", "attempt": 3, "created_ms": NOW_MS}]
    header, row = render(_task_table(rows))
    # One app and the default queue only: neither column is shown.
    assert header.split() == ["task_id", "task", "status", "att", "created"]
    assert row.split() == [TASK_ID, "charge_card", "SUCCEEDED", "3", fmt_clock(NOW_MS)]
    other = {**rows[0], "app": "crm", "queue": "email"}
    header, first, second = render(_task_table([*rows, other]))
    assert header.split() == ["task_id", "task", "queue", "status", "att", "created"]
    assert first.split()[1:3] == ["shop:charge_card", "default"], first
    assert second.split()[1:3] == ["crm:charge_card", "email"], second


def test_a_long_task_name_folds_with_nothing_lost() -> None:
    name = "reconcile_every_ledger_of_the_quarter"
    rows = [{"task_id": TASK_ID, "app": "shop", "task_type": name, "queue": "default"}]
    header, *lines = render(
        _task_table([{**rows[0], "status": "FAILED", "attempt": 1, "created_ms": NOW_MS}])
    )
    start, end = header.index("task "), header.index("status")
    assert "".join(line[start:end].strip() for line in lines) == name
    assert lines[0].split()[0] == TASK_ID and "FAILED" in lines[0].split()


def test_durations_and_times_of_day() -> None:
    assert [fmt_took(ms) for ms in (8, 999, 1_000, 12_400, 185_000)] == [
        "8 ms",
        "999 ms",
        "1.0 s",
        "12.4 s",
        "3 min 05 s",
    ]
    assert len(fmt_clock(NOW_MS)) == 8 and len(fmt_clock(NOW_MS, millis=True)) == 12
    assert fmt_clock(NOW_MS - 3 * 86_400_000).count("-") == 2  # another day: the date too
    assert fmt_clock(None) == "-"
