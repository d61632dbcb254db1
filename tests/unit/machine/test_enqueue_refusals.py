"""EnqueueTasks refusals: a keyed enqueue that asks for another task than its twin is a
conflict decided by the machine (enqueue rule 2), and every refused item changes nothing."""

from __future__ import annotations

from typing import Any

import pytest

from conveyor.schemas.types import EnqueueTasks
from conveyor.streams.machine import Refusal, Reply

from .harness import Harness

S = 1_000


def replies(outcome: Any) -> list[Reply]:
    return [a for a in outcome.actions if isinstance(a, Reply)]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"task_type": "other"}, "task_type"),
        ({"payload": b'{"n":2}'}, "payload"),
        ({"queue": "slow"}, "queue"),
        ({"priority": 5}, "priority"),
        ({"run_at_ms": 1_800_000_000_000}, "run_at"),
        ({"delay_ms": 60 * S, "run_at_ms": 1_700_000_060_000}, "delay_ms"),
        ({"attempts_max": 9}, "retry.attempts_max"),
        ({"backoff_base_ms": 7}, "retry.backoff_base_ms"),
        ({"backoff_factor": 3.0}, "retry.backoff_factor"),
        ({"backoff_cap_ms": 99 * S}, "retry.backoff_cap_ms"),
        ({"non_retryable": ["KeyError"]}, "retry.non_retryable"),
        ({"schedule_to_start_ms": S}, "timeouts.schedule_to_start_ms"),
        ({"start_to_close_ms": S}, "timeouts.start_to_close_ms"),
        ({"schedule_to_close_ms": S}, "timeouts.schedule_to_close_ms"),
        ({"cancel_grace_ms": 5}, "cancel_grace_ms"),
    ],
)
def test_a_key_asking_for_another_task_is_a_conflict_that_changes_nothing(
    change: dict[str, Any], named: str
) -> None:
    h = Harness()
    first = h.spec(idempotency_key="k", payload=b'{"n":1}')
    h.enqueue(first)
    before = h.dump(applied=False)
    again = h.spec(**{"idempotency_key": "k", "payload": b'{"n":1}', **change})
    (reply,) = replies(h.enqueue(again))
    assert (reply.ok, reply.refusal, reply.twin_id, reply.differing) == (
        False,
        Refusal.CONFLICT,
        first.task_id,
        (named,),
    )
    assert first.task_id in (reply.reason or "") and named in (reply.reason or "")
    assert h.dump(applied=False) == before
    assert h.fresh_task(again.task_id) is None


def test_a_retried_delay_is_the_same_task_though_its_run_at_is_later() -> None:
    h = Harness()
    first = h.spec(idempotency_key="k", delay_ms=10 * S, run_at_ms=h.now_ms + 10 * S)
    h.enqueue(first)
    h.advance(3 * S)  # the client resends after a lost ack: the same delay, from later
    again = h.spec(idempotency_key="k", delay_ms=10 * S, run_at_ms=h.now_ms + 10 * S)
    (reply,) = replies(h.enqueue(again))
    assert (reply.ok, reply.created, reply.task_id) == (True, False, first.task_id)


def test_the_same_request_again_meets_its_twin() -> None:
    h = Harness()
    body = {"idempotency_key": "k", "queue": "q", "priority": 3, "run_at_ms": h.now_ms + S}
    first = h.spec(**body)
    h.enqueue(first)
    (reply,) = replies(h.enqueue(h.spec(**body)))
    assert (reply.ok, reply.created, reply.task_id, reply.refusal) == (
        True,
        False,
        first.task_id,
        None,
    )


def test_an_invalid_spec_and_bytes_that_are_no_spec_are_refused_by_name() -> None:
    h = Harness()
    before = h.dump(applied=False)
    out = h.apply(EnqueueTasks(tasks=[b"\xff\xff\xff"]))
    (junk,) = replies(out)
    assert (junk.ok, junk.refusal) == (False, Refusal.NOT_A_SPEC)
    (bad,) = replies(h.enqueue(h.spec(run_at_ms=-62_135_596_800_000)))  # year 1
    assert (bad.ok, bad.refusal, bad.created, bad.status) == (
        False,
        Refusal.INVALID_SPEC,
        False,
        None,
    )
    assert "0..2^53" in (bad.reason or "")
    assert h.dump(applied=False) == before
