"""What a canceled handler returns is kept with the CANCELED task, and only then."""

from __future__ import annotations

from conveyor.schemas.types import CancelCause, Completion, EventKind, Outcome, TaskStatus

from .harness import Harness

S = 1_000


def _leased(h: Harness, **spec_kw: object) -> tuple[str, int]:
    spec = h.spec(cancel_grace_ms=10 * S, **spec_kw)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    return spec.task_id, g.lease_id


def _canceled_with(h: Harness, task_id: str, lease_id: int, result: bytes | None):  # type: ignore[no-untyped-def]
    return h.report(
        Completion(
            task_id=task_id,
            lease_id=lease_id,
            outcome=Outcome.CANCELED,
            result=result,
            error_class="Canceled",
            error_message="canceled while running; the handler stopped",
        )
    )


def test_a_canceled_handlers_result_is_kept_with_the_canceled_task() -> None:
    h = Harness()
    task_id, lease_id = _leased(h)
    h.cancel(task_id, reason="stop it")
    assert h.task(task_id).cancel_cause == CancelCause.CANCEL
    out = _canceled_with(h, task_id, lease_id, b'{"stopped_at":40}')
    assert [e.kind for e in out.events] == [EventKind.TaskCanceled]
    task = h.task(task_id)
    assert task.status == TaskStatus.CANCELED
    assert task.result == b'{"stopped_at":40}'
    assert task.error_message == "stop it"
    assert h.timers() == [] and h.leased() == {}


def test_a_canceled_outcome_without_a_cancel_request_keeps_no_result() -> None:
    """A guest cannot cancel its own task: CANCELED unasked is a failed attempt, result dropped."""
    h = Harness()
    task_id, lease_id = _leased(h)
    _canceled_with(h, task_id, lease_id, b'{"stopped_at":1}')
    task = h.task(task_id)
    assert task.status == TaskStatus.RETRY_WAIT
    assert task.result is None


def test_a_stale_lease_cannot_leave_a_result_on_a_canceled_task() -> None:
    h = Harness()
    task_id, lease_id = _leased(h)
    h.cancel(task_id)
    _canceled_with(h, task_id, lease_id, b'"first"')
    out = _canceled_with(h, task_id, lease_id, b'"second"')
    assert out.events == []
    assert h.task(task_id).result == b'"first"'


def test_a_stop_for_schedule_to_close_keeps_no_result() -> None:
    h = Harness()
    task_id, lease_id = _leased(h, schedule_to_close_ms=60 * S)
    h.fire_due(h.now_ms + 60 * S)
    assert h.task(task_id).cancel_cause == CancelCause.SCHEDULE_TO_CLOSE
    _canceled_with(h, task_id, lease_id, b'{"stopped_at":3}')
    task = h.task(task_id)
    assert task.status == TaskStatus.EXPIRED
    assert task.result is None
