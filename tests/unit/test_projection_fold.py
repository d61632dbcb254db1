"""The projector's in-memory fold: one row per task, the machine's rules for derived columns."""

from __future__ import annotations

from conveyor.schemas.types import EventKind, ScheduleEvent, StepEvent, TaskEvent
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


def step(identity: str, state: str, version: int, claims: int = 1) -> StepEvent:
    value = b"1" if state == "COMMITTED" else None
    return StepEvent(
        task_id="t1", tenant="a", identity=identity, position=0, state=state, claims=claims,
        value=value, ts_ms=1000 + version, version=version,
    )  # fmt: skip


def test_step_fold_keeps_the_newest_event_per_step() -> None:
    fold = Fold.empty()
    fold.add_step(step("a#0", "CLAIMED", 3))
    fold.add_step(step("a#0", "COMMITTED", 3))  # claim and commit in one record: the later wins
    fold.add_step(step("a#0", "CLAIMED", 2, claims=7))  # a replayed older event: ignored
    fold.add_step(step("b#0", "CLAIMED", 4))
    assert {k: (e.state, e.version) for k, e in fold.steps.items()} == {
        ("t1", "a#0"): ("COMMITTED", 3),
        ("t1", "b#0"): ("CLAIMED", 4),
    }


def test_step_fold_keeps_when_each_step_started() -> None:
    # A claim and its commit in one chunk: the row is the commit's, the start the claim's.
    fold = Fold.empty()
    fold.add_step(step("a#0", "CLAIMED", 3))
    fold.add_step(step("a#0", "COMMITTED", 5))
    fold.add_step(step("b#0", "COMMITTED", 6))  # committed without a claim (a sleep, a wait)
    assert fold.steps[("t1", "a#0")].state == "COMMITTED"
    assert fold.step_started == {("t1", "a#0"): 1003, ("t1", "b#0"): 1006}


def schedule(version: int, *, paused: bool = False, deleted: bool = False) -> ScheduleEvent:
    return ScheduleEvent(
        tenant="a", schedule_id="s", cron="* * * * *", timezone="UTC", app="shop",
        task_type="x", queue="q", overlap="ALLOW", catch_up="ONCE", paused=paused,
        deleted=deleted, fired=version, skipped=0, created_ms=1, updated_ms=version,
        version=version,
    )  # fmt: skip


def test_schedule_fold_keeps_the_newest_row_and_a_deletion_wins_over_older_events() -> None:
    fold = Fold.empty()
    for e in (schedule(5, paused=True), schedule(9, deleted=True), schedule(7)):
        fold.add_schedule(e)
    (only,) = fold.schedules.values()
    assert (only.version, only.deleted) == (9, True)


def test_an_attempt_that_parks_the_workflow_is_closed_and_the_next_one_opens() -> None:
    """TaskWaiting (a fan-out, or a wait for an event) ends the attempt under way, like a
    sleep: the machine has already counted the next one."""
    fold = Fold.empty()
    for e in (
        event(EventKind.TaskLeased, "LEASED", 1, 1, agent_id="ag"),
        event(EventKind.TaskWaiting, "WAITING", 2, 2),
        event(EventKind.TaskRequeued, "ENQUEUED", 2, 3),
        event(EventKind.TaskLeased, "LEASED", 2, 4, agent_id="ag"),
    ):
        fold.add(0, e)
    first, second = fold.attempts[("t1", 1)], fold.attempts[("t1", 2)]
    assert (first.started_ms, first.finished_ms, first.outcome) == (1001, 1002, "PARKED")
    assert (second.started_ms, second.finished_ms) == (1004, None)


def test_a_cancel_into_compensations_closes_the_attempt_it_ended() -> None:
    fold = Fold.empty()
    for e in (
        event(EventKind.TaskLeased, "LEASED", 1, 1, agent_id="ag"),
        event(EventKind.TaskRequeued, "ENQUEUED", 2, 2, error_class="Compensating"),
    ):
        fold.add(0, e)
    first = fold.attempts[("t1", 1)]
    assert (first.finished_ms, first.outcome, first.error_class) == (
        1002,
        "CANCELED",
        "Compensating",
    )
    # A compensation that began from a wait ends nothing: the attempt before had ended.
    fold = Fold.empty()
    fold.add(0, event(EventKind.TaskLeased, "LEASED", 1, 1, agent_id="ag"))
    fold.add(0, event(EventKind.TaskRetryScheduled, "RETRY_WAIT", 2, 2, error_class="E"))
    fold.add(0, event(EventKind.TaskRequeued, "ENQUEUED", 2, 3, error_class="Compensating"))
    assert fold.attempts[("t1", 1)].outcome == "FAILED"


def test_fold_keeps_the_payload_fields_of_the_task_enqueued_only() -> None:
    fold = Fold.empty()
    fields = '{"customer":"acme"}'
    fold.add(0, event(EventKind.TaskEnqueued, "ENQUEUED", 1, 1, payload_fields=fields))
    fold.add(0, event(EventKind.TaskLeased, "LEASED", 1, 2, payload_fields='{"other":1}'))
    assert fold.tasks["t1"].payload_fields == fields  # None in a later chunk keeps the stored
    bad = Fold.empty()
    bad.add(0, event(EventKind.TaskEnqueued, "ENQUEUED", 1, 1, payload_fields='{"a":"\\u0000"}'))
    assert bad.tasks["t1"].payload_fields is None  # jsonb cannot hold it: rule 7
