"""The projector's in-memory fold: one row per task, the machine's rules for derived columns."""

from __future__ import annotations

from conveyor.schemas.types import EventKind, TaskEvent
from conveyor.store.postgres.projection import Fold


def event(kind: EventKind, status: str, attempt: int, version: int, **kw: object) -> TaskEvent:
    return TaskEvent(
        kind=kind, task_id="t1", tenant="a", app="shop", task_type="x", queue="q",
        status=status, attempt=attempt, ts_ms=1000 + version, version=version, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def test_fold_keeps_created_error_and_finish_times() -> None:
    fold = Fold.empty()
    for e in (
        event(EventKind.TaskEnqueued, "ENQUEUED", 1, 1),
        event(EventKind.TaskLeased, "LEASED", 1, 2, agent_id="ag"),
        event(EventKind.TaskRetryScheduled, "RETRY_WAIT", 2, 3, error_class="E", error_message="m"),
        event(EventKind.CancelRequested, "RETRY_WAIT", 2, 4, error_message="not an error"),
        event(EventKind.TaskSucceeded, "SUCCEEDED", 2, 5),
    ):
        fold.add(0, e)
    row = fold.tasks["t1"]
    assert (row.created_ms, row.finished_ms, row.version, row.status) == (
        1001,
        1005,
        5,
        "SUCCEEDED",
    )
    assert (row.error_class, row.error_message) == ("E", "m")
    first = fold.attempts[("t1", 1)]
    assert (first.started_ms, first.finished_ms, first.outcome) == (1002, 1003, "FAILED")
    assert fold.attempts[("t1", 2)].started_ms is None  # never leased: the writer skips it


def test_an_older_replayed_event_inside_a_chunk_changes_nothing() -> None:
    fold = Fold.empty()
    fold.add(0, event(EventKind.TaskEnqueued, "ENQUEUED", 1, 1))
    fold.add(0, event(EventKind.TaskLeased, "LEASED", 1, 2))
    fold.add(0, event(EventKind.TaskEnqueued, "ENQUEUED", 1, 1))
    assert (fold.tasks["t1"].status, fold.tasks["t1"].version) == ("LEASED", 2)
