"""One test per lifecycle behaviour of the pure state machine.

Each test drives ``apply`` through the harness and asserts on ``outcome.actions``,
``outcome.events`` and the committed store. "Changes nothing" is checked on the full KV dump
minus the applied offset, which every record moves (the processor writes it with every batch).
"""

from __future__ import annotations

import pytest

from conveyor.schemas.types import (
    RELEASED_CLASS,
    CancelCause,
    Completion,
    EventKind,
    Outcome,
    TaskStatus,
    TimerKind,
    TimerRef,
)
from conveyor.store import keys
from conveyor.store.memory import MemoryKV
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.api import LogRecord
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.machine import CancelLease, LeaseEnded, Offer, Reply, TaskFinished
from conveyor.streams.machine.handlers.cancel import retry_id
from conveyor.streams.machine.lifecycle import backoff_ms
from conveyor.streams.processor.loop import PartitionProcessor

from .harness import Harness, actions_of, grants


def released(h: Harness, task_id: str, lease_id: int):  # type: ignore[no-untyped-def]
    """The agent hands the attempt back before it started (it is stopping)."""
    return h.report(
        Completion(
            task_id=task_id,
            lease_id=lease_id,
            outcome=Outcome.RELEASED,
            error_class="Killed",
            error_message="the agent is stopping; never started",
        )
    )


S = 1_000  # one second in ms


def kinds(outcome) -> list[EventKind]:  # type: ignore[no-untyped-def]
    return [e.kind for e in outcome.events]


def replies(outcome) -> list[Reply]:  # type: ignore[no-untyped-def]
    return actions_of(outcome, Reply)


# -- the harness itself ------------------------------------------------------------------------


def test_harness_commits_exactly_like_the_processor() -> None:
    """The same records through ``PartitionProcessor._apply_batch``, one per batch, give the
    same KV, byte for byte (outbox and applied offset included)."""
    h = Harness()
    spec = h.spec(start_to_close_ms=5 * S, idempotency_key="k")
    h.enqueue(spec, h.spec(tenant="t2", run_at_ms=h.now_ms + S))
    h.announce(1)
    g = h.lease_one(spec.task_id)
    h.checkpoint(spec.task_id, g.lease_id, b"cp")
    h.fire_due(h.now_ms + 5 * S)
    h.canceled(spec.task_id, g.lease_id)
    h.cancel(spec.task_id)
    h.apply(h.history[0].record)  # a duplicate enqueue

    kv = MemoryKV()
    processor = PartitionProcessor(0, MemoryLog(1), kv, clock=FakeClock())
    for applied in h.history:
        processor._apply_batch([LogRecord(applied.meta.offset, applied.raw)])
    assert dict(kv.data.items()) == h.dump()


# -- enqueue ------------------------------------------------------------------------------------


def test_enqueue_creates_ready_task_with_reply_and_event() -> None:
    h = Harness()
    spec = h.spec()
    out = h.enqueue(spec)
    assert replies(out) == [
        Reply(offset=0, index=0, ok=True, task_id=spec.task_id, created=True, status="ENQUEUED")
    ]
    assert kinds(out) == [EventKind.TaskEnqueued]
    assert out.events[0].status == "ENQUEUED" and out.events[0].version == 0
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.ENQUEUED and task.attempt == 1 and task.lease_id == 0
    assert task.ready_seq != 0
    assert h.ready_ids() == [spec.task_id]
    assert h.committed().payload(spec.task_id) == b"payload"
    assert h.committed().spec(spec.task_id) == spec
    assert h.timers() == []
    assert keys.outbox(0) in h.dump()


def test_keyed_enqueue_dedups_within_window() -> None:
    h = Harness()
    first = h.spec(idempotency_key="k1", idempotency_window_ms=10 * S)
    h.enqueue(first)
    h.advance(5 * S)
    again = h.spec(idempotency_key="k1", idempotency_window_ms=10 * S)
    before = h.dump(applied=False)
    out = h.enqueue(again)
    assert replies(out) == [
        Reply(offset=1, index=0, ok=True, task_id=first.task_id, created=False, status="ENQUEUED")
    ]
    assert out.events == []
    assert h.dump(applied=False) == before
    assert h.fresh_task(again.task_id) is None


def test_keyed_enqueue_after_window_creates_new_task() -> None:
    h = Harness()
    first = h.spec(idempotency_key="k1", idempotency_window_ms=10 * S)
    h.enqueue(first)
    h.advance(10 * S)  # expires_ms == now: the window is over
    again = h.spec(idempotency_key="k1", idempotency_window_ms=10 * S)
    out = h.enqueue(again)
    (reply,) = replies(out)
    assert reply.created and reply.task_id == again.task_id
    assert kinds(out) == [EventKind.TaskEnqueued]
    entry = h.committed().idempotency("t1", "app", "k1")
    assert entry is not None and entry.task_id == again.task_id
    # ... and the key dedups to the new task from now on.
    out = h.enqueue(h.spec(idempotency_key="k1"))
    assert replies(out)[0].task_id == again.task_id and not replies(out)[0].created


def test_a_key_row_is_forgotten_when_its_window_ends() -> None:
    h = Harness()
    first = h.spec(idempotency_key="k1", idempotency_window_ms=10 * S)
    h.enqueue(first)
    h.advance(10 * S)
    again = h.spec(idempotency_key="k1", idempotency_window_ms=10 * S)
    h.enqueue(again)  # the window is over: a new task takes the key over
    # The first task's timer fires, but the row is the second task's now: it stays.
    h.fire_due()
    entry = h.committed().idempotency("t1", "app", "k1")
    assert entry is not None and entry.task_id == again.task_id
    h.advance(10 * S)
    h.fire_due()  # the second window ends: the row goes, whatever the task's state
    assert h.committed().idempotency("t1", "app", "k1") is None
    assert h.timers_of(again.task_id) == []


def test_keyed_enqueue_dedups_within_one_record() -> None:
    h = Harness()
    a, b = h.spec(idempotency_key="k"), h.spec(idempotency_key="k")
    out = h.enqueue(a, b)
    assert [(r.task_id, r.created) for r in replies(out)] == [
        (a.task_id, True),
        (a.task_id, False),
    ]
    assert h.ready_ids() == [a.task_id]


def test_same_task_id_enqueued_twice_dedups() -> None:
    h = Harness()
    spec = h.spec()
    h.enqueue(spec)
    before = h.dump(applied=False)
    out = h.enqueue(spec)
    assert replies(out) == [
        Reply(offset=1, index=0, ok=True, task_id=spec.task_id, created=False, status="ENQUEUED")
    ]
    assert out.events == []
    assert h.dump(applied=False) == before


def test_delayed_enqueue_fires_run_timer_only_when_due() -> None:
    h = Harness()
    run_at = h.now_ms + 60 * S
    spec = h.spec(run_at_ms=run_at)
    out = h.enqueue(spec)
    assert kinds(out) == [EventKind.TaskEnqueued]
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.ENQUEUED and task.ready_seq == 0
    assert h.ready_ids() == []
    assert h.timers() == [TimerRef(fire_at_ms=run_at, task_id=spec.task_id, kind="RUN", token=1)]
    assert grants(h.grant(5)) == []

    early = h.fire_due(run_at - 1)
    assert early.events == [] and h.ready_ids() == []
    out = h.fire_due(run_at)
    assert kinds(out) == [EventKind.TaskRequeued]
    assert h.ready_ids() == [spec.task_id] and h.timers() == []
    assert [g.task_id for g in grants(h.grant(5))] == [spec.task_id]


def test_delayed_timer_fired_twice_does_nothing_the_second_time() -> None:
    h = Harness()
    spec = h.spec(run_at_ms=h.now_ms + S)
    h.enqueue(spec)
    h.advance(S)
    due = h.due()
    h.fire(due)
    before = h.dump(applied=False)
    out = h.fire(due)
    assert out.events == [] and out.actions == []
    assert h.dump(applied=False) == before


# -- grants -------------------------------------------------------------------------------------


def test_grant_respects_capacity() -> None:
    h = Harness()
    specs = [h.spec() for _ in range(5)]
    h.enqueue(*specs)
    out = h.grant(3)
    (offer,) = actions_of(out, Offer)
    assert offer.request_id == "req-1"
    assert [g.task_id for g in offer.grants] == [s.task_id for s in specs[:3]]
    assert all(g.lease_id == 1 and g.attempt == 1 and g.lease_ms == 30_000 for g in offer.grants)
    assert kinds(out) == [EventKind.TaskLeased] * 3
    assert h.leased() == {s.task_id: 1 for s in specs[:3]}
    assert h.ready_ids() == [s.task_id for s in specs[3:]]
    for s in specs[:3]:
        task = h.task(s.task_id)
        assert task.status == TaskStatus.LEASED and task.agent_id == "agent-1"
        assert task.leased_ms == h.now_ms and task.ready_seq == 0


def test_grant_with_zero_capacity_or_nothing_ready_offers_nothing() -> None:
    h = Harness()
    out = h.grant(3)
    assert actions_of(out, Offer) == [Offer(request_id="req-0", grants=[])]
    h.enqueue(h.spec())
    assert grants(h.grant(0)) == []
    assert len(h.ready_ids()) == 1


def test_grant_orders_by_priority_then_age() -> None:
    h = Harness()
    low_old = h.spec(priority=0)
    h.enqueue(low_old)
    high_young = h.spec(priority=5)
    mid = h.spec(priority=3)
    h.enqueue(high_young, mid)
    high_younger = h.spec(priority=5)
    h.enqueue(high_younger)
    out = h.grant(4)
    assert [g.task_id for g in grants(out)] == [
        high_young.task_id,
        high_younger.task_id,
        mid.task_id,
        low_old.task_id,
    ]


def test_grant_orders_across_queues_by_priority_then_age() -> None:
    h = Harness()
    a = h.spec(queue="a", priority=1)
    b = h.spec(queue="b", priority=2)
    c = h.spec(queue="a", priority=2)
    h.enqueue(a)
    h.enqueue(b)
    h.enqueue(c)
    assert [g.task_id for g in grants(h.grant(3))] == [b.task_id, c.task_id, a.task_id]


def test_grant_filters_queues() -> None:
    h = Harness()
    fast = h.spec(queue="fast")
    slow = h.spec(queue="slow", priority=9)
    other = h.spec(queue="other")
    h.enqueue(slow, fast, other)
    out = h.grant(10, queues=["fast", "other"])
    assert [g.task_id for g in grants(out)] == [fast.task_id, other.task_id]
    assert h.ready_ids() == [slow.task_id]


def test_grant_filters_tenants_and_apps() -> None:
    h = Harness()
    a = h.spec(tenant="a")
    b = h.spec(tenant="b")
    c = h.spec(tenant="c")
    elsewhere = h.spec(tenant="a", app="other-app")
    h.enqueue(a, b, c, elsewhere)
    out = h.grant(10, tenants=["a", "c"])
    assert sorted(g.task_id for g in grants(out)) == sorted([a.task_id, c.task_id])
    assert grants(h.grant(10, tenants=["zzz"])) == []
    assert [g.task_id for g in grants(h.grant(10, app="other-app"))] == [elsewhere.task_id]


def test_grant_round_robins_tenants_and_cursor_persists() -> None:
    h = Harness()
    by_tenant = {t: [h.spec(tenant=t) for _ in range(3)] for t in ("a", "b", "c")}
    # One tenant's backlog arrives first; the others must not wait behind it.
    h.enqueue(*by_tenant["a"])
    h.enqueue(*by_tenant["b"])
    h.enqueue(*by_tenant["c"])
    tenant_of = {s.task_id: t for t, specs in by_tenant.items() for s in specs}

    first = [tenant_of[g.task_id] for g in grants(h.grant(4))]
    assert first == ["a", "b", "c", "a"]
    assert h.kv.get(keys.cursor("app")) == b"a"
    # The next record continues after "a": the cursor is state, not memory.
    second = [tenant_of[g.task_id] for g in grants(h.grant(2))]
    assert second == ["b", "c"]
    third = [tenant_of[g.task_id] for g in grants(h.grant(1))]
    assert third == ["a"]
    rest = [tenant_of[g.task_id] for g in grants(h.grant(10))]
    assert rest == ["b", "c"]


def test_grant_takes_more_than_an_even_share_when_others_are_empty() -> None:
    h = Harness()
    many = [h.spec(tenant="a") for _ in range(5)]
    one = h.spec(tenant="b")
    h.enqueue(*many, one)
    got = [g.task_id for g in grants(h.grant(6))]
    assert sorted(got) == sorted([s.task_id for s in many] + [one.task_id])
    assert len(set(got)) == 6


# -- success, fencing ---------------------------------------------------------------------------


def test_success_finishes_task() -> None:
    h = Harness()
    spec = h.spec()
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.advance(S)
    out = h.complete(spec.task_id, g.lease_id, result=b"42")
    assert replies(out) == [
        Reply(offset=2, index=0, ok=True, task_id=spec.task_id, status="SUCCEEDED")
    ]
    assert TaskFinished(task_id=spec.task_id, status=TaskStatus.SUCCEEDED) in out.actions
    assert LeaseEnded(task_id=spec.task_id, lease_id=g.lease_id) in out.actions
    assert kinds(out) == [EventKind.TaskSucceeded]
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.SUCCEEDED and task.result == b"42"
    assert task.finished_ms == h.now_ms
    assert h.leased() == {} and h.timers() == [] and h.ready_ids() == []


def test_stale_lease_completion_and_checkpoint_change_nothing() -> None:
    h = Harness()
    spec = h.spec()
    h.enqueue(spec)
    first = h.lease_one(spec.task_id)
    h.expire(spec.task_id, first.lease_id)
    h.fire_due(h.now_ms + 3_600 * S)
    second = h.lease_one(spec.task_id)
    assert second.lease_id == first.lease_id + 1

    before = h.dump(applied=False)
    out = h.complete(spec.task_id, first.lease_id)
    (reply,) = replies(out)
    assert not reply.ok and "stale lease 1" in (reply.reason or "")
    assert out.events == [] and len(out.actions) == 1
    out = h.checkpoint(spec.task_id, first.lease_id, b"zombie")
    assert not replies(out)[0].ok and out.events == []
    out = h.fail(spec.task_id, first.lease_id)
    assert not replies(out)[0].ok and out.events == []
    out = h.expire(spec.task_id, first.lease_id)
    assert out.events == [] and out.actions == []
    out = h.complete("0000" + "f" * 28, 1)
    assert replies(out)[0].reason == "unknown task"
    assert h.dump(applied=False) == before
    assert h.task(spec.task_id).status == TaskStatus.LEASED


def test_completion_of_a_task_not_leased_is_rejected() -> None:
    h = Harness()
    spec = h.spec()
    h.enqueue(spec)
    before = h.dump(applied=False)
    out = h.complete(spec.task_id, 0)
    assert replies(out)[0].reason == "task is ENQUEUED"
    assert h.dump(applied=False) == before


# -- failures and retries -----------------------------------------------------------------------


def test_failure_schedules_retry_with_deterministic_backoff() -> None:
    def run() -> tuple[Harness, int]:
        h = Harness()
        spec = h.spec(task_id="0000" + "a" * 28, backoff_base_ms=2 * S, backoff_factor=3.0)
        h.enqueue(spec)
        g = h.lease_one(spec.task_id)
        h.advance(S)
        out = h.fail(spec.task_id, g.lease_id, "Boom", "it broke")
        assert replies(out)[0].status == TaskStatus.RETRY_WAIT
        assert kinds(out) == [EventKind.TaskRetryScheduled]
        assert out.events[0].error_class == "Boom" and out.events[0].attempt == 2
        assert LeaseEnded(task_id=spec.task_id, lease_id=1) in out.actions
        assert actions_of(out, TaskFinished) == []
        return h, spec.task_id

    h, task_id = run()
    task = h.task(task_id)
    assert task.status == TaskStatus.RETRY_WAIT and task.attempt == 2
    assert task.error_class == "Boom" and task.error_message == "it broke"
    delay = task.run_at_ms - h.now_ms
    assert 0 <= delay <= 2 * S  # attempt 1: base * factor ** 0
    assert delay == backoff_ms(h.committed().spec(task_id), task_id, 1)  # type: ignore[arg-type]
    assert h.timers_of(task_id) == [
        TimerRef(fire_at_ms=task.run_at_ms, task_id=task_id, kind=TimerKind.RUN, token=2)
    ]
    assert h.leased() == {} and h.ready_ids() == []
    (attempt,) = h.committed().attempts(task_id)
    assert attempt.attempt == 1 and attempt.outcome == "FAILED" and attempt.error_class == "Boom"

    # Deterministic: the same log gives the same state, byte for byte.
    again, _ = run()
    assert again.dump() == h.dump()

    # Not before it is due; then back to ENQUEUED and the next lease is lease_id + 1.
    assert h.fire_due(task.run_at_ms - 1).events == []
    out = h.fire_due(task.run_at_ms)
    assert kinds(out) == [EventKind.TaskRequeued]
    assert h.task(task_id).status == TaskStatus.ENQUEUED
    g = h.lease_one(task_id)
    assert g.lease_id == 2 and g.attempt == 2


def test_backoff_stays_within_full_jitter_bounds() -> None:
    h = Harness()
    spec = h.spec(backoff_base_ms=100, backoff_factor=2.0, backoff_cap_ms=1_000)
    for attempt in range(1, 12):
        delay = backoff_ms(spec, spec.task_id, attempt)
        assert 0 <= delay <= min(1_000, 100 * 2 ** (attempt - 1))
        assert delay == backoff_ms(spec, spec.task_id, attempt)
    assert len({backoff_ms(spec, f"{i:032x}", 3) for i in range(50)}) > 10  # it does jitter


def test_exhausted_attempts_fail_into_dead_letters() -> None:
    h = Harness()
    spec = h.spec(attempts_max=2)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.fail(spec.task_id, g.lease_id, "Boom", "first")
    h.fire_due(h.now_ms + 3_600 * S)
    g = h.lease_one(spec.task_id)
    out = h.fail(spec.task_id, g.lease_id, "Boom", "second")
    assert kinds(out) == [EventKind.TaskFailed]
    assert TaskFinished(task_id=spec.task_id, status=TaskStatus.FAILED) in out.actions
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.FAILED and task.attempt == 2
    assert (task.error_class, task.error_message) == ("Boom", "second")
    assert task.error_stack == "Traceback ..."
    assert h.committed().payload(spec.task_id) == b"payload"  # kept for the dead-letter retry
    assert h.dead() == [spec.task_id]
    assert h.timers() == [] and h.leased() == {}
    assert [a.attempt for a in h.committed().attempts(spec.task_id)] == [1, 2]


def test_fatal_fails_at_once() -> None:
    h = Harness()
    spec = h.spec(attempts_max=5)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    out = h.fatal(spec.task_id, g.lease_id)
    assert kinds(out) == [EventKind.TaskFailed]
    assert h.task(spec.task_id).status == TaskStatus.FAILED
    assert h.task(spec.task_id).error_class == "Fatal"
    assert h.dead() == [spec.task_id] and h.timers() == []


def test_non_retryable_error_class_fails_at_once() -> None:
    h = Harness()
    spec = h.spec(non_retryable=["ValueError"])
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    out = h.fail(spec.task_id, g.lease_id, "ValueError", "bad input")
    assert kinds(out) == [EventKind.TaskFailed]
    assert h.task(spec.task_id).status == TaskStatus.FAILED
    assert h.dead() == [spec.task_id]


def test_retry_after_ms_is_honoured() -> None:
    h = Harness()
    spec = h.spec(backoff_base_ms=S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.fail(spec.task_id, g.lease_id, retry_after_ms=90 * S)
    task = h.task(spec.task_id)
    assert task.run_at_ms == h.now_ms + 90 * S
    assert h.fire_due(h.now_ms + 90 * S - 1).events == []
    assert kinds(h.fire_due(h.now_ms + 1)) == [EventKind.TaskRequeued]


def test_lease_expiry_retries_with_lease_expired() -> None:
    h = Harness()
    spec = h.spec()
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    out = h.expire(spec.task_id, g.lease_id)
    assert kinds(out) == [EventKind.LeaseExpired, EventKind.TaskRetryScheduled]
    assert out.events[0].error_class == "LeaseExpired"
    assert LeaseEnded(task_id=spec.task_id, lease_id=g.lease_id) in out.actions
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.RETRY_WAIT and task.error_class == "LeaseExpired"
    assert task.attempt == 2 and h.leased() == {}


def test_checkpoint_persists_into_the_next_attempt() -> None:
    h = Harness()
    spec = h.spec()
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    out = h.checkpoint(spec.task_id, g.lease_id, b"page=7")
    assert kinds(out) == [EventKind.CheckpointSaved] and replies(out)[0].ok
    assert h.fresh_task(spec.task_id).checkpoint == b"page=7"  # type: ignore[union-attr]
    h.fail(spec.task_id, g.lease_id)
    h.fire_due(h.now_ms + 3_600 * S)
    h.lease_one(spec.task_id)
    task = h.fresh_task(spec.task_id)
    assert task is not None and task.checkpoint == b"page=7" and task.attempt == 2


# -- cancel -------------------------------------------------------------------------------------


def test_cancel_enqueued_is_immediate() -> None:
    h = Harness()
    spec = h.spec(schedule_to_start_ms=60 * S)
    h.enqueue(spec)
    out = h.cancel(spec.task_id, reason="user said so")
    assert replies(out)[0].status == TaskStatus.CANCELED
    assert kinds(out) == [EventKind.TaskCanceled]
    assert TaskFinished(task_id=spec.task_id, status=TaskStatus.CANCELED) in out.actions
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.CANCELED and task.error_message == "user said so"
    assert h.ready_ids() == [] and h.timers() == []
    assert grants(h.grant(5)) == []


def test_cancel_delayed_enqueued_removes_its_timer() -> None:
    h = Harness()
    spec = h.spec(run_at_ms=h.now_ms + 60 * S)
    h.enqueue(spec)
    h.cancel(spec.task_id)
    assert h.task(spec.task_id).status == TaskStatus.CANCELED
    assert h.timers() == []


def test_cancel_retry_wait_is_immediate() -> None:
    h = Harness()
    spec = h.spec(schedule_to_close_ms=3_600 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.fail(spec.task_id, g.lease_id)
    assert h.task(spec.task_id).status == TaskStatus.RETRY_WAIT
    out = h.cancel(spec.task_id)
    assert kinds(out) == [EventKind.TaskCanceled]
    assert h.task(spec.task_id).status == TaskStatus.CANCELED
    assert h.timers() == [] and h.ready_ids() == []
    assert h.fire_due(h.now_ms + 10 * 3_600 * S).events == []


def test_cancel_of_unknown_or_foreign_task_is_rejected() -> None:
    h = Harness()
    spec = h.spec(tenant="a")
    h.enqueue(spec)
    before = h.dump(applied=False)
    out = h.cancel(spec.task_id, "0000" + "e" * 28, tenant="b")
    assert [(r.ok, r.reason) for r in replies(out)] == [
        (False, "unknown task"),
        (False, "unknown task"),
    ]
    assert h.dump(applied=False) == before


def _leased_then_cancel(h: Harness, **spec_kw: object) -> tuple[str, int]:
    spec = h.spec(cancel_grace_ms=10 * S, **spec_kw)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    out = h.cancel(spec.task_id, reason="stop it")
    assert replies(out)[0].status == TaskStatus.LEASED
    assert kinds(out) == [EventKind.CancelRequested]
    assert actions_of(out, CancelLease) == [CancelLease(task_id=spec.task_id, lease_id=g.lease_id)]
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.LEASED and task.cancel_cause == CancelCause.CANCEL
    assert TimerRef(
        fire_at_ms=h.now_ms + 10 * S, task_id=spec.task_id, kind=TimerKind.CANCEL_GRACE, token=1
    ) in h.timers_of(spec.task_id)
    return spec.task_id, g.lease_id


def test_cancel_leased_then_handler_stops() -> None:
    h = Harness()
    task_id, lease_id = _leased_then_cancel(h)
    # A second cancel while one is pending changes nothing.
    before = h.dump(applied=False)
    out = h.cancel(task_id)
    assert out.events == [] and replies(out)[0].ok
    assert h.dump(applied=False) == before

    out = h.canceled(task_id, lease_id)
    assert kinds(out) == [EventKind.TaskCanceled]
    task = h.task(task_id)
    assert task.status == TaskStatus.CANCELED and task.error_message == "stop it"
    assert h.timers() == [] and h.leased() == {}


def test_cancel_leased_then_grace_ends_it() -> None:
    h = Harness()
    task_id, _ = _leased_then_cancel(h)
    assert h.fire_due(h.now_ms + 10 * S - 1).events == []
    out = h.fire_due(h.now_ms + 1)
    assert kinds(out) == [EventKind.TaskCanceled]
    assert TaskFinished(task_id=task_id, status=TaskStatus.CANCELED) in out.actions
    assert h.task(task_id).status == TaskStatus.CANCELED
    assert h.timers() == [] and h.leased() == {}


def test_cancel_leased_then_failure_cancels() -> None:
    h = Harness()
    task_id, lease_id = _leased_then_cancel(h)
    out = h.fail(task_id, lease_id)
    assert kinds(out) == [EventKind.TaskCanceled]
    assert h.task(task_id).status == TaskStatus.CANCELED


def test_success_after_cancel_request_succeeds() -> None:
    h = Harness()
    task_id, lease_id = _leased_then_cancel(h)
    out = h.complete(task_id, lease_id)
    assert kinds(out) == [EventKind.TaskSucceeded]
    assert h.task(task_id).status == TaskStatus.SUCCEEDED
    assert h.timers() == []
    assert h.fire_due(h.now_ms + 3_600 * S).events == []


def test_canceled_outcome_without_cancel_request_counts_as_failure() -> None:
    h = Harness()
    spec = h.spec()
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    out = h.canceled(spec.task_id, g.lease_id)
    assert kinds(out) == [EventKind.TaskRetryScheduled]
    assert h.task(spec.task_id).status == TaskStatus.RETRY_WAIT


# -- released (handed back before it started) ---------------------------------------------------


def test_a_released_attempt_is_ready_again_at_once_and_spends_no_attempt() -> None:
    h = Harness()
    spec = h.spec(attempts_max=1, start_to_close_ms=60 * S)
    h.enqueue(spec)
    for _ in range(3):  # with one attempt allowed, a counted release would have FAILED it
        g = h.lease_one(spec.task_id, agent_id="a1")
        out = released(h, spec.task_id, g.lease_id)
        assert replies(out)[0].ok and replies(out)[0].status == TaskStatus.ENQUEUED
        assert kinds(out) == [EventKind.TaskRequeued]
        assert out.events[0].error_class == RELEASED_CLASS
        assert LeaseEnded(task_id=spec.task_id, lease_id=g.lease_id) in out.actions
        task = h.task(spec.task_id)
        assert task.status == TaskStatus.ENQUEUED and task.attempt == 1
        assert h.ready_ids() == [spec.task_id] and h.leased() == {}
        assert h.timers_of(spec.task_id) == []  # its start_to_close timer went with the lease
        assert h.committed().attempts(spec.task_id) == []  # nothing ran: no attempt row
    g = h.lease_one(spec.task_id)
    assert g.attempt == 1 and g.lease_id == 4
    # The old lease is fenced like any stale one.
    before = h.dump(applied=False)
    assert replies(released(h, spec.task_id, 3))[0].ok is False
    assert h.dump(applied=False) == before
    h.complete(spec.task_id, g.lease_id)
    assert h.task(spec.task_id).status == TaskStatus.SUCCEEDED


def test_a_release_after_a_cancel_request_cancels() -> None:
    h = Harness()
    task_id, lease_id = _leased_then_cancel(h)
    out = released(h, task_id, lease_id)
    assert kinds(out) == [EventKind.TaskCanceled]
    assert h.task(task_id).status == TaskStatus.CANCELED
    assert h.ready_ids() == [] and h.timers() == [] and h.leased() == {}


# -- timeouts -----------------------------------------------------------------------------------


def test_schedule_to_start_expires_a_task_never_started() -> None:
    h = Harness()
    spec = h.spec(schedule_to_start_ms=30 * S)
    h.enqueue(spec)
    assert h.fire_due(h.now_ms + 30 * S - 1).events == []
    out = h.fire_due(h.now_ms + 1)
    assert kinds(out) == [EventKind.TaskExpired]
    assert out.events[0].error_class == "ScheduleToStartTimeout"
    assert h.task(spec.task_id).status == TaskStatus.EXPIRED
    assert h.ready_ids() == [] and h.timers() == []


def test_schedule_to_start_counts_from_the_delay() -> None:
    h = Harness()
    spec = h.spec(run_at_ms=h.now_ms + 60 * S, schedule_to_start_ms=30 * S)
    h.enqueue(spec)
    assert h.task(spec.task_id).start_by_ms == h.now_ms + 90 * S
    h.fire_due(h.now_ms + 60 * S)
    assert h.task(spec.task_id).status == TaskStatus.ENQUEUED
    assert kinds(h.fire_due(h.now_ms + 30 * S)) == [EventKind.TaskExpired]


def test_schedule_to_start_does_nothing_once_started() -> None:
    h = Harness()
    spec = h.spec(schedule_to_start_ms=30 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.expire(spec.task_id, g.lease_id)  # back to waiting, but it did start once
    h.fire_due(h.now_ms + 29 * S)
    assert h.task(spec.task_id).status == TaskStatus.ENQUEUED
    out = h.fire_due(h.now_ms + 10 * S)
    assert out.events == []
    assert h.task(spec.task_id).status == TaskStatus.ENQUEUED


def test_start_to_close_requests_cancel_then_fails_the_attempt_after_grace() -> None:
    h = Harness()
    spec = h.spec(start_to_close_ms=60 * S, cancel_grace_ms=5 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    assert TimerRef(
        fire_at_ms=h.now_ms + 60 * S,
        task_id=spec.task_id,
        kind=TimerKind.START_TO_CLOSE,
        token=g.lease_id,
    ) in h.timers_of(spec.task_id)
    out = h.fire_due(h.now_ms + 60 * S)
    assert kinds(out) == [EventKind.CancelRequested]
    assert actions_of(out, CancelLease) == [CancelLease(task_id=spec.task_id, lease_id=1)]
    assert h.task(spec.task_id).cancel_cause == CancelCause.START_TO_CLOSE
    out = h.fire_due(h.now_ms + 5 * S)
    assert kinds(out) == [EventKind.TaskRetryScheduled]
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.RETRY_WAIT and task.error_class == "StartToCloseTimeout"
    assert task.cancel_cause is None and task.attempt == 2


@pytest.mark.parametrize("report", ["canceled", "released"])
def test_start_to_close_then_handler_stops_is_an_attempt_failure(report: str) -> None:
    """The handler obeying the timeout's stop request (or an agent handing the attempt back
    before it started) must not cancel the whole task."""
    h = Harness()
    spec = h.spec(start_to_close_ms=60 * S, cancel_grace_ms=5 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.fire_due(h.now_ms + 60 * S)
    if report == "canceled":
        out = h.canceled(spec.task_id, g.lease_id)
    else:
        out = released(h, spec.task_id, g.lease_id)
    assert kinds(out) == [EventKind.TaskRetryScheduled]
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.RETRY_WAIT
    assert task.error_class == "StartToCloseTimeout"


def test_start_to_close_timer_of_an_old_lease_does_nothing() -> None:
    h = Harness()
    spec = h.spec(start_to_close_ms=60 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    stale = [t for t in h.timers_of(spec.task_id) if t.kind == TimerKind.START_TO_CLOSE]
    h.complete(spec.task_id, g.lease_id)
    assert h.timers() == []
    out = h.fire(stale)
    assert out.events == [] and h.task(spec.task_id).status == TaskStatus.SUCCEEDED


def test_schedule_to_close_expires_a_waiting_task() -> None:
    h = Harness()
    spec = h.spec(schedule_to_close_ms=60 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.fail(spec.task_id, g.lease_id, retry_after_ms=30 * S)
    assert h.task(spec.task_id).status == TaskStatus.RETRY_WAIT
    h.fire_due(h.now_ms + 30 * S)
    assert h.task(spec.task_id).status == TaskStatus.ENQUEUED
    out = h.fire_due(h.now_ms + 30 * S)
    assert kinds(out) == [EventKind.TaskExpired]
    assert h.task(spec.task_id).status == TaskStatus.EXPIRED
    assert h.ready_ids() == [] and h.timers() == []


def test_schedule_to_close_expires_a_leased_task_through_the_grace() -> None:
    h = Harness()
    spec = h.spec(schedule_to_close_ms=60 * S, cancel_grace_ms=5 * S)
    h.enqueue(spec)
    h.lease_one(spec.task_id)
    out = h.fire_due(h.now_ms + 60 * S)
    assert kinds(out) == [EventKind.CancelRequested]
    assert h.task(spec.task_id).cancel_cause == CancelCause.SCHEDULE_TO_CLOSE
    out = h.fire_due(h.now_ms + 5 * S)
    assert kinds(out) == [EventKind.TaskExpired]
    assert out.events[0].error_class == "ScheduleToCloseTimeout"
    assert h.task(spec.task_id).status == TaskStatus.EXPIRED
    assert h.timers() == [] and h.leased() == {}


def test_schedule_to_close_leased_then_handler_stops_expires() -> None:
    h = Harness()
    spec = h.spec(schedule_to_close_ms=60 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.fire_due(h.now_ms + 60 * S)
    out = h.canceled(spec.task_id, g.lease_id)
    assert kinds(out) == [EventKind.TaskExpired]
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.EXPIRED
    # The same error class as when the grace runs out: how it stopped does not matter.
    assert task.error_class == out.events[0].error_class == "ScheduleToCloseTimeout"


def test_schedule_to_close_leased_then_failure_does_not_retry() -> None:
    h = Harness()
    spec = h.spec(schedule_to_close_ms=60 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.fire_due(h.now_ms + 60 * S)
    out = h.fail(spec.task_id, g.lease_id, retry_after_ms=0)
    assert kinds(out) == [EventKind.TaskExpired]
    assert h.task(spec.task_id).status == TaskStatus.EXPIRED


def test_no_retry_is_scheduled_past_schedule_to_close() -> None:
    h = Harness()
    spec = h.spec(schedule_to_close_ms=60 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.advance(10 * S)
    out = h.fail(spec.task_id, g.lease_id, retry_after_ms=50 * S)  # would start at 60 s
    assert kinds(out) == [EventKind.TaskExpired]
    task = h.task(spec.task_id)
    assert task.status == TaskStatus.EXPIRED and task.error_class == "ScheduleToCloseTimeout"
    assert h.timers() == [] and h.leased() == {}


# -- dead-letter retry --------------------------------------------------------------------------


def _failed(h: Harness) -> str:
    spec = h.spec(attempts_max=1, idempotency_key="once")
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.fail(spec.task_id, g.lease_id)
    assert h.task(spec.task_id).status == TaskStatus.FAILED
    return spec.task_id


def test_retry_failed_makes_a_new_task_and_the_original_stays_failed() -> None:
    h = Harness()
    task_id = _failed(h)
    offset = h.offset
    out = h.retry_failed(task_id)
    twin_id = retry_id(task_id, offset)
    assert twin_id != task_id and twin_id[:4] == task_id[:4] and len(twin_id) == 32
    assert kinds(out) == [EventKind.TaskRequeued, EventKind.TaskEnqueued]
    assert [(r.task_id, r.created) for r in replies(out)] == [(twin_id, True)]
    original = h.task(task_id)
    assert original.status == TaskStatus.FAILED
    assert h.dead() == []
    twin = h.task(twin_id)
    assert twin.status == TaskStatus.ENQUEUED and twin.attempt == 1
    twin_spec = h.committed().spec(twin_id)
    assert twin_spec is not None and twin_spec.idempotency_key is None
    assert h.committed().payload(twin_id) == b"payload"
    assert [g.task_id for g in grants(h.grant(5))] == [twin_id]


def test_second_retry_failed_of_the_same_task_does_nothing() -> None:
    h = Harness()
    task_id = _failed(h)
    h.retry_failed(task_id)
    before = h.dump(applied=False)
    out = h.retry_failed(task_id)
    assert out.events == [] and replies(out) == []
    assert h.dump(applied=False) == before


def test_retry_failed_ignores_tasks_not_failed_or_foreign() -> None:
    h = Harness()
    task_id = _failed(h)
    live = h.spec()
    h.enqueue(live)
    before = h.dump(applied=False)
    assert h.retry_failed(live.task_id).events == []
    assert h.retry_failed(task_id, tenant="other").events == []
    assert h.dump(applied=False) == before


# -- fencing ------------------------------------------------------------------------------------


def test_stale_epoch_leader_records_are_ignored() -> None:
    h = Harness()
    spec = h.spec(start_to_close_ms=S)
    h.enqueue(spec)
    h.announce(1)
    g = h.lease_one(spec.task_id)
    h.announce(2)
    h.advance(S)
    due = h.due()
    assert due
    before = h.dump(applied=False)
    for out in (
        h.grant(5, epoch=1),
        h.fire(due, epoch=1),
        h.expire(spec.task_id, g.lease_id, epoch=1),
        h.announce(1),
    ):
        assert out.ignored is not None and "older than the announced epoch 2" in out.ignored
        assert out.actions == [] and out.events == []
    assert h.dump(applied=False) == before
    # The current epoch is obeyed.
    h.epoch = 2
    assert h.expire(spec.task_id, g.lease_id).ignored is None
    assert h.task(spec.task_id).status == TaskStatus.RETRY_WAIT


def test_client_records_are_never_fenced() -> None:
    h = Harness()
    h.announce(7)
    spec = h.spec()
    out = h.enqueue(spec)  # carries epoch 0
    assert out.ignored is None and replies(out)[0].created


# -- terminal states are final ------------------------------------------------------------------


def test_terminal_states_never_change() -> None:
    h = Harness()
    spec = h.spec(schedule_to_close_ms=60 * S, start_to_close_ms=10 * S)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.complete(spec.task_id, g.lease_id)
    before = h.dump(applied=False)
    h.cancel(spec.task_id)
    h.complete(spec.task_id, g.lease_id)
    h.fail(spec.task_id, g.lease_id)
    h.expire(spec.task_id, g.lease_id)
    h.checkpoint(spec.task_id, g.lease_id, b"late")
    h.fire(
        [
            TimerRef(fire_at_ms=h.now_ms, task_id=spec.task_id, kind=kind, token=token)
            for kind in TimerKind
            for token in (0, 1, 2)
        ]
    )
    h.fire_due(h.now_ms + 3_600 * S)
    assert h.grant(5).events == []
    assert h.dump(applied=False) == before
    assert h.task(spec.task_id).status == TaskStatus.SUCCEEDED


def test_schedule_to_close_passed_then_failure_stamped_earlier_still_expires() -> None:
    """C2: the leader's clock steps back after schedule_to_close fired. The deadline passed
    on the log's time base; a failure stamped earlier must not schedule a retry past it (the
    SCHEDULE_TO_CLOSE timer is gone, so nothing would ever expire the task)."""
    h = Harness()
    spec = h.spec(schedule_to_close_ms=60 * S, attempts_max=5)
    h.enqueue(spec)
    g = h.lease_one(spec.task_id)
    h.fire_due(h.now_ms + 60 * S)
    assert h.task(spec.task_id).cancel_cause == CancelCause.SCHEDULE_TO_CLOSE
    out = h.fail(spec.task_id, g.lease_id, retry_after_ms=0, ts_ms=h.now_ms - 3_600 * S)
    assert kinds(out) == [EventKind.TaskExpired]
    assert h.task(spec.task_id).status == TaskStatus.EXPIRED
    assert h.timers() == []
