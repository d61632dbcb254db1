"""The spec's searchable payload fields reach the snapshot on the task's TaskEnqueued only."""

from __future__ import annotations

from conveyor.schemas.types import EventKind

from .harness import Harness


def test_only_the_task_enqueued_carries_the_spec_payload_fields() -> None:
    h = Harness()
    spec = h.spec(payload_fields='{"customer":"acme"}')
    (enqueued,) = h.enqueue(spec).events
    assert (enqueued.kind, enqueued.payload_fields) == (
        EventKind.TaskEnqueued, '{"customer":"acme"}'
    )  # fmt: skip
    (leased,) = h.grant(1).events
    assert (leased.kind, leased.payload_fields) == (EventKind.TaskLeased, None)
    plain = h.spec()
    (without,) = h.enqueue(plain).events
    assert without.payload_fields is None
