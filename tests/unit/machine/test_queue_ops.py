"""What the machine tells operators about a queue: a delayed enqueue says when it is due."""

from __future__ import annotations

from conveyor.schemas.types import EventKind

from .harness import Harness

S = 1_000


def test_a_delayed_enqueue_says_when_it_is_due_and_its_requeue_when_it_is() -> None:
    h = Harness()
    now, later = h.spec(), h.spec(run_at_ms=h.now_ms + 90 * 60 * S)
    (a,) = h.enqueue(now).events
    (b,) = h.enqueue(later).events
    assert (a.kind, a.run_at_ms) == (EventKind.TaskEnqueued, None)  # ready at once
    assert (b.kind, b.status, b.run_at_ms) == (EventKind.TaskEnqueued, "ENQUEUED", later.run_at_ms)
    assert h.ready_ids() == [now.task_id]
    (due,) = h.fire_due(later.run_at_ms).events
    assert (due.kind, due.task_id, due.ts_ms, due.run_at_ms) == (
        EventKind.TaskRequeued, later.task_id, later.run_at_ms, None
    )  # fmt: skip
