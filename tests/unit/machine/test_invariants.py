"""Hypothesis stateful test of the task state machine (tests/PLAN.md).

Random client, agent and leader records go through the harness; after every step the model
checks what the machine promised:

(a) every status change seen in events is an edge of ``transitions.TRANSITIONS``, and the stored
    status is the status of the task's last event (no silent change);
(b) a task that reached a terminal status never changes again, and finishes exactly once;
(c) a rejected or ignored record leaves the KV (minus the applied offset) unchanged;
(d) no Offer grants more than its request's capacity, nor a task twice; a task is never leased
    while an earlier lease of it is live, and its lease ids strictly increase;
(e) a row decoded from a fresh ``Tables(kv)`` equals the cached row, field by field;
(f) the ``leased`` index is exactly the LEASED tasks, the ready index exactly the ENQUEUED
    tasks with ``ready_seq != 0`` (with its counts and queue head cursors consistent), and
    every waiting task that is not ready has its RUN timer;
    plus: no timer outlives its task, a pending cancel has its grace timer, the dead letters are
    the FAILED tasks not yet retried.
At teardown the model drains: every acknowledged task must reach a terminal status (I10).

Profiles: ``CONVEYOR_HYPOTHESIS=long`` runs many more and longer examples.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from conveyor.schemas import codec
from conveyor.schemas.types import (
    TERMINAL,
    AnnounceEpoch,
    CancelCause,
    CancelTasks,
    Checkpoint,
    CompleteAttempts,
    Completion,
    EnqueueTasks,
    ExpireLeases,
    FanOut,
    FireTimers,
    GrantLeases,
    LeaseRef,
    LeaseRequest,
    Outcome,
    ParallelMode,
    Record,
    RetryFailed,
    SaveCheckpoints,
    SendEvents,
    TaskSpec,
    TaskStatus,
    TimerKind,
    TimerRef,
    WaitStep,
    WorkflowEvent,
)
from conveyor.store import keys
from conveyor.store.tables import Tables
from conveyor.streams.machine import LeaseEnded, Offer, Refusal, Reply, TaskFinished
from conveyor.streams.machine import Outcome as MachineOutcome
from conveyor.streams.machine.handlers.workflows import child_id, event_timer
from conveyor.streams.machine.lifecycle import grace_timer, run_timer
from conveyor.streams.machine.transitions import TRANSITIONS

from .harness import Harness

S = 1_000
TENANTS = ["a", "b", "c"]
QUEUES = ["q1", "q2"]
KEYS = [None, None, "k1", "k2"]
LONG = os.environ.get("CONVEYOR_HYPOTHESIS") == "long"
pytestmark = pytest.mark.timeout(3_600 if LONG else 300)

pick = st.integers(min_value=0, max_value=1 << 16)  # an index into a dynamic list
options = st.fixed_dictionaries(  # one task's spec, from small pools so that things collide
    {
        "tenant": st.sampled_from(TENANTS),
        "queue": st.sampled_from(QUEUES),
        "priority": st.integers(0, 2),
        "delay_ms": st.sampled_from([None, None, 0, S, 5 * S]),
        "attempts_max": st.integers(1, 3),
        "schedule_to_start_ms": st.sampled_from([None, None, 2 * S, 10 * S]),
        "start_to_close_ms": st.sampled_from([None, 3 * S, 20 * S]),
        "schedule_to_close_ms": st.sampled_from([None, None, 8 * S, 30 * S]),
        "cancel_grace_ms": st.sampled_from([S, 2 * S]),
        "idempotency_key": st.sampled_from(KEYS),
        "idempotency_window_ms": st.sampled_from([5 * S, 60 * S]),
    }
)


def choose(items: list, index: int):  # type: ignore[no-untyped-def]
    return items[index % len(items)]


class MachineModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.h = Harness()
        self.status: dict[str, TaskStatus] = {}  # from events
        self.finished: dict[str, TaskStatus] = {}  # from TaskFinished actions
        self.leases: dict[str, list[int]] = {}  # every lease id granted, per task
        self.live: dict[str, int] = {}  # granted and not ended
        self.retried: set[str] = set()
        self.epoch = 0
        self.midway = False

    # -- the one way records go in -------------------------------------------------------------

    def _apply(self, record: Record, *, epoch: int | None = None) -> MachineOutcome:
        self.midway = True  # until the model caught up: teardown must not judge a broken run
        before = self.h.dump(applied=False)
        out = self.h.apply(record, epoch=epoch)
        self._check_outcome(record, out)
        if out.ignored is not None:
            assert out.actions == [] and out.events == []
        for e in out.events:
            event(f"event {e.kind}")
        if out.ignored is not None or self._rejected(record, out):
            event(f"unchanged by {type(record).__name__}")
            assert self.h.dump(applied=False) == before, f"rejected {record} changed state"
        self.midway = False
        return out

    @staticmethod
    def _rejected(record: Record, out: MachineOutcome) -> bool:
        """Nothing of the record applied: every reply refused, or nothing happened at all."""
        if out.events:
            return False
        if isinstance(record, ExpireLeases):
            return not out.actions
        if isinstance(record, GrantLeases):
            return all(isinstance(a, Offer) and not a.grants for a in out.actions)
        if isinstance(record, FireTimers | AnnounceEpoch):
            return False  # a stale timer is deleted, an epoch is stored: changes, no events
        if isinstance(record, SendEvents):  # a kept event changes state without an event
            return all(isinstance(a, Reply) and not a.ok for a in out.actions)
        # Client and agent records: refused items, enqueue twins, cancels of finished tasks.
        replies = [a for a in out.actions if isinstance(a, Reply)]
        return len(replies) == len(out.actions) and all(not r.created for r in replies)

    def _check_outcome(self, record: Record, out: MachineOutcome) -> None:
        # (a) + (b) from the events
        for e in out.events:
            old = self.status.get(e.task_id)
            new = TaskStatus(e.status)
            if old != new:
                assert (old, new) in TRANSITIONS, f"illegal {old} -> {new}: {e}"
                assert old not in TERMINAL, f"terminal {old} changed to {new}"
            self.status[e.task_id] = new
        for action in out.actions:
            if isinstance(action, TaskFinished):
                assert action.task_id not in self.finished, f"{action.task_id} finished twice"
                assert action.status in TERMINAL
                assert self.status[action.task_id] == action.status
                self.finished[action.task_id] = action.status
            elif isinstance(action, LeaseEnded):
                assert self.live.get(action.task_id) == action.lease_id, action
                del self.live[action.task_id]
        # (d) offers
        if isinstance(record, GrantLeases) and out.ignored is None:
            capacity = {r.request_id: r.capacity for r in record.requests}
            offers = [a for a in out.actions if isinstance(a, Offer)]
            assert sorted(o.request_id for o in offers) == sorted(capacity)
            seen: set[str] = set()
            for offer in offers:
                assert len(offer.grants) <= max(0, capacity[offer.request_id])
                for grant in offer.grants:
                    assert grant.task_id not in seen, f"{grant.task_id} granted twice"
                    seen.add(grant.task_id)
                    assert grant.task_id not in self.live, f"{grant.task_id} leased twice"
                    earlier = self.leases.setdefault(grant.task_id, [])
                    if earlier:
                        event("re-leased")
                    assert not earlier or grant.lease_id > earlier[-1]
                    earlier.append(grant.lease_id)
                    self.live[grant.task_id] = grant.lease_id

    # -- client rules ------------------------------------------------------------------------

    @initialize(batch=st.lists(options, min_size=2, max_size=8))
    def seed_tasks(self, batch: list[dict[str, Any]]) -> None:
        self._enqueue(batch, reuse=False, index=0)

    @rule(batch=st.lists(options, min_size=1, max_size=3), reuse=st.booleans(), index=pick)
    def enqueue(self, batch: list[dict[str, Any]], reuse: bool, index: int) -> None:
        self._enqueue(batch, reuse=reuse, index=index)

    def _enqueue(self, batch: list[dict[str, Any]], *, reuse: bool, index: int) -> None:
        specs = []
        for i, opts in enumerate(batch):
            opts = dict(opts)
            task_id = self.h.new_id()
            if reuse and self.status and i == 0:
                task_id = choose(sorted(self.status), index)  # the same id again: a twin
            delay_ms = opts.pop("delay_ms")
            specs.append(
                self.h.spec(
                    task_id=task_id,
                    run_at_ms=None if delay_ms is None else self.h.now_ms + delay_ms,
                    backoff_base_ms=S // 2,
                    backoff_cap_ms=4 * S,
                    non_retryable=["Permanent"],
                    **opts,
                )
            )
        raws = [codec.TASK_SPEC.encode(s) for s in specs]
        out = self._apply(EnqueueTasks(tasks=raws))
        replies = [a for a in out.actions if isinstance(a, Reply)]
        assert [r.index for r in replies] == list(range(len(specs)))
        for spec, reply in zip(specs, replies, strict=True):
            if reply.refusal == Refusal.CONFLICT:  # its key names a task that differs
                event("conflict")
                assert spec.idempotency_key is not None and reply.differing
                assert reply.task_id == reply.twin_id and reply.twin_id in self.status
                continue
            assert reply.ok
            if reply.created:
                assert reply.task_id == spec.task_id and self.status[spec.task_id]
            else:
                assert reply.task_id in self.status  # the twin it met
            if spec.idempotency_key is not None and reply.created:
                entry = self.h.committed().idempotency(spec.tenant, "app", spec.idempotency_key)
                assert entry is not None and entry.task_id == reply.task_id

    @rule(index=pick, unknown=st.booleans())
    def cancel(self, index: int, unknown: bool) -> None:
        if unknown or not self.status:
            task_id = "0000" + "e" * 28
        else:
            task_id = choose(sorted(self.status), index)
        tenant = self.h.committed().task(task_id).tenant if not unknown and self.status else "a"  # type: ignore[union-attr]
        self._apply(CancelTasks(tenant=tenant, task_ids=[task_id], reason="test"))

    @precondition(lambda self: TaskStatus.FAILED in self.finished.values())
    @rule(index=pick)
    def retry_failed(self, index: int) -> None:
        failed = sorted(t for t, s in self.finished.items() if s == TaskStatus.FAILED)
        if not failed:
            return
        task_id = choose(failed, index)
        tenant = self.h.committed().task(task_id).tenant  # type: ignore[union-attr]
        out = self._apply(RetryFailed(tenant=tenant, task_ids=[task_id]))
        if task_id in self.retried:
            assert out.events == []
        elif out.events:
            self.retried.add(task_id)

    # -- agent rules -------------------------------------------------------------------------

    def _lease(self, index: int, stale: int) -> tuple[str, int] | None:
        """A (task, lease) pair: the live lease, or with ``stale`` > 0 an older or bogus one."""
        if not self.leases:
            return None
        task_id = choose(sorted(self.leases), index)
        ids = self.leases[task_id]
        if stale == 0:
            return task_id, ids[-1]
        if stale == 1 and len(ids) > 1:
            return task_id, ids[-2]
        return task_id, ids[-1] + stale

    @precondition(lambda self: self.leases)
    @rule(
        index=pick,
        stale=st.sampled_from([0, 0, 0, 1, 2]),
        outcome=st.sampled_from(["SUCCEEDED", "FAILED", "FAILED", "FATAL", "CANCELED", "RELEASED"]),
        error_class=st.sampled_from(["Boom", "Boom", "Permanent"]),
        retry_after_ms=st.sampled_from([None, None, 0, 3 * S]),
    )
    def report(
        self, index: int, stale: int, outcome: str, error_class: str, retry_after_ms: int | None
    ) -> None:
        lease = self._lease(index, stale)
        if lease is None:
            return
        item = Completion(
            task_id=lease[0],
            lease_id=lease[1],
            outcome=Outcome(outcome),
            result=b"r" if outcome == "SUCCEEDED" else None,
            error_class=None if outcome == "SUCCEEDED" else error_class,
            error_message="msg",
            retry_after_ms=retry_after_ms,
        )
        self._apply(CompleteAttempts(items=[item]))

    @precondition(lambda self: self.leases)
    @rule(index=pick, stale=st.sampled_from([0, 0, 1, 2]), value=st.binary(max_size=8))
    def checkpoint(self, index: int, stale: int, value: bytes) -> None:
        lease = self._lease(index, stale)
        if lease is None:
            return
        out = self._apply(
            SaveCheckpoints(items=[Checkpoint(task_id=lease[0], lease_id=lease[1], value=value)])
        )
        reply = out.actions[0]
        if isinstance(reply, Reply) and reply.ok:
            assert self.h.committed().task(lease[0]).checkpoint == value  # type: ignore[union-attr]

    @precondition(lambda self: self.live)
    @rule(
        outcomes=st.lists(
            st.sampled_from(["SUCCEEDED", "FAILED", "FATAL", "CANCELED", "Permanent", "expire"]),
            min_size=1,
            max_size=4,
        ),
    )
    def work(self, outcomes: list[str]) -> None:
        """The agent finishes its live leases in one batch (the common case)."""
        items = []
        for (task_id, lease_id), outcome in zip(sorted(self.live.items()), outcomes, strict=False):
            if outcome == "expire":
                self._apply(ExpireLeases(items=[LeaseRef(task_id=task_id, lease_id=lease_id)]))
                continue
            failed = outcome not in ("SUCCEEDED",)
            items.append(
                Completion(
                    task_id=task_id,
                    lease_id=lease_id,
                    outcome=Outcome.FAILED if outcome == "Permanent" else Outcome(outcome),
                    error_class=outcome if failed else None,
                    error_message="msg" if failed else None,
                )
            )
        if items:
            out = self._apply(CompleteAttempts(items=items))
            replies = [a for a in out.actions if isinstance(a, Reply)]
            assert len(replies) == len(items)

    @precondition(lambda self: self.leases)
    @rule(
        index=pick,
        stale=st.sampled_from([0, 0, 0, 1, 2]),
        width=st.integers(1, 3),
        mode=st.sampled_from(ParallelMode),
        identity=st.sampled_from(["fan#0", "fan#1"]),
    )
    def fan_out(
        self, index: int, stale: int, width: int, mode: ParallelMode, identity: str
    ) -> None:
        """A workflow attempt ends in ``ctx.parallel`` (a stale lease's is refused)."""
        live = sorted(self.live.items())
        lease = choose(live, index) if stale == 0 and live else self._lease(index, stale)
        if lease is None:
            return
        kids = [
            codec.TASK_SPEC.encode(
                TaskSpec(task_id="", tenant="", app="", task_type="child", attempts_max=2)
            )
            for _ in range(width)
        ]
        step = FanOut(identity=identity, position=0, mode=mode, children=kids)
        item = Completion(
            task_id=lease[0], lease_id=lease[1], outcome=Outcome.FAN_OUT, fan_out=step
        )
        self._apply(CompleteAttempts(items=[item]))

    @precondition(lambda self: self.live)
    @rule(
        index=pick,
        name=st.sampled_from(["go", "stop"]),
        timeout_ms=st.sampled_from([None, S, 10 * S]),
    )
    def wait_event(self, index: int, name: str, timeout_ms: int | None) -> None:
        """A workflow attempt ends in ``ctx.wait_for_event``."""
        task_id, lease_id = choose(sorted(self.live.items()), index)
        step = WaitStep(identity=f"event:{name}#0", position=0, name=name, timeout_ms=timeout_ms)
        item = Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.WAIT_EVENT, wait=step)
        self._apply(CompleteAttempts(items=[item]))

    @precondition(lambda self: self.status)
    @rule(index=pick, name=st.sampled_from(["go", "stop"]), tenant=st.sampled_from(TENANTS))
    def send_event(self, index: int, name: str, tenant: str) -> None:
        """An event for any task, of any tenant (a foreign or finished one is refused)."""
        task_id = choose(sorted(self.status), index)
        item = WorkflowEvent(task_id=task_id, name=name, payload=b"1")
        self._apply(SendEvents(tenant=tenant, items=[item]))

    # -- leader rules ------------------------------------------------------------------------

    @rule(
        capacities=st.lists(st.integers(0, 4), min_size=1, max_size=2),
        tenants=st.lists(st.sampled_from(TENANTS), max_size=2, unique=True),
        queues=st.lists(st.sampled_from(QUEUES), max_size=2, unique=True),
    )
    def grant(self, capacities: list[int], tenants: list[str], queues: list[str]) -> None:
        requests = [
            LeaseRequest(
                request_id=f"r{self.h.offset}/{i}",
                agent_id=f"agent-{i}",
                app="app",
                tenants=tenants,
                queues=queues,
                capacity=c,
            )
            for i, c in enumerate(capacities)
        ]
        self._apply(GrantLeases(requests=requests))

    @precondition(lambda self: self.leases)
    @rule(index=pick, stale=st.sampled_from([0, 0, 1, 2]))
    def expire(self, index: int, stale: int) -> None:
        lease = self._lease(index, stale)
        if lease is None:
            return
        self._apply(ExpireLeases(items=[LeaseRef(task_id=lease[0], lease_id=lease[1])]))

    @rule(ms=st.sampled_from([0, 100, S, 3 * S, 10 * S, 40 * S]), twice=st.booleans())
    def advance_and_fire(self, ms: int, twice: bool) -> None:
        self.h.advance(ms)
        due = self.h.due()
        if not due:
            return
        self._apply(FireTimers(timers=due))
        if twice:  # a leader that proposed the same timers again: harmless
            self._apply(FireTimers(timers=due))

    @precondition(lambda self: self.status)
    @rule(
        index=pick,
        kind=st.sampled_from(list(TimerKind)),
        token=st.integers(0, 3),
    )
    def fire_made_up_timer(self, index: int, kind: TimerKind, token: int) -> None:
        """A timer that was never armed (a buggy or replayed proposal) does nothing."""
        if not self.status:
            return
        task_id = choose(sorted(self.status), index)
        ref = TimerRef(fire_at_ms=self.h.now_ms - 1, task_id=task_id, kind=kind, token=token)
        if self.h.tables.timer_exists(ref):
            return
        before = self.h.dump(applied=False)
        out = self._apply(FireTimers(timers=[ref]))
        assert out.events == [] and out.actions == []
        assert self.h.dump(applied=False) == before

    @rule(
        which=st.sampled_from(["grant", "fire", "expire", "announce"]),
        index=pick,
    )
    def new_epoch_then_stale_record(self, which: str, index: int) -> None:
        self.epoch += 1
        self.h.announce(self.epoch)
        stale = self.epoch - 1
        record: Record
        if which == "grant":
            request = LeaseRequest(
                request_id="zombie", agent_id="z", app="app", tenants=[], queues=[], capacity=4
            )
            record = GrantLeases(requests=[request])
        elif which == "fire":
            record = FireTimers(timers=self.h.due(self.h.now_ms + 3_600 * S))
        elif which == "expire":
            lease = self._lease(index, 0)
            refs = [] if lease is None else [LeaseRef(task_id=lease[0], lease_id=lease[1])]
            record = ExpireLeases(items=refs)
        else:
            record = AnnounceEpoch(leader_id="zombie")
        out = self._apply(record, epoch=stale)
        assert out.ignored is not None

    # -- invariants over the store -----------------------------------------------------------

    @invariant()
    def store_matches_events_and_indexes(self) -> None:
        h = self.h
        fresh = Tables(h.kv)
        tasks = {t.task_id: t for t in fresh.tasks()}
        assert set(tasks) == set(self.status), "a task exists without its TaskEnqueued event"
        for task_id, task in tasks.items():
            # (a) no silent status change
            assert task.status == self.status[task_id], (task_id, task.status)
            # (e) the head/state/detail split round-trips, and the cache holds the same row
            cached = h.cache.get(task_id)
            if cached is not None:
                for f in dataclasses.fields(task):
                    if f.name == "detail_written":
                        continue
                    assert getattr(cached, f.name) == getattr(task, f.name), (task_id, f.name)
                assert cached.detail_written == codec.TASK.detail_of(cached)
            # (b) terminal tasks finished exactly once, with that status
            if task.status in TERMINAL:
                assert self.finished.get(task_id) == task.status
                assert task.finished_ms is not None
                # ... and dropped its step rows with that transition (handlers/steps.py rule 5)
                assert next(h.kv.scan(keys.steps_of(task_id)), None) is None, task_id
            else:
                assert task_id not in self.finished
        # (f) the leased index is exactly the LEASED tasks, at their current lease
        leased = {task_id: lease_id for task_id, lease_id, _ in fresh.leased()}
        assert leased == {
            t.task_id: t.lease_id for t in tasks.values() if t.status == TaskStatus.LEASED
        }
        assert leased == self.live
        # ... the ready index exactly the ENQUEUED tasks with a ready_seq
        ready = {k: v.decode() for k, v in h.kv.scan(keys.READY)}
        expected = {
            keys.ready(t.app, t.tenant, t.task_type, t.queue, t.priority, t.ready_seq): t.task_id
            for t in tasks.values()
            if t.status == TaskStatus.ENQUEUED and t.ready_seq != 0
        }
        assert ready == expected
        # ... its counts per (app, tenant) and per queue match it, absent when zero, and no live
        # ready key sorts below its queue's head cursor
        by_tenant: dict[bytes, int] = {}
        by_queue: dict[bytes, int] = {}
        for t in tasks.values():
            if t.status == TaskStatus.ENQUEUED and t.ready_seq != 0:
                for key, counts in (
                    (keys.ready_count(t.app, t.tenant), by_tenant),
                    (keys.queue_count(t.app, t.tenant, t.task_type, t.queue), by_queue),
                ):
                    counts[key] = counts.get(key, 0) + 1
                head = h.kv.get(keys.queue_head(t.app, t.tenant, t.task_type, t.queue))
                ready_key = keys.ready(
                    t.app, t.tenant, t.task_type, t.queue, t.priority, t.ready_seq
                )
                assert head is None or ready_key >= head, f"{t.task_id} is below its queue head"
        assert {k: keys.read_u64(v) for k, v in h.kv.scan(keys.READY_COUNTS)} == by_tenant
        assert {k: keys.read_u64(v) for k, v in h.kv.scan(keys.QUEUE_COUNTS)} == by_queue
        timers = set(h.timers())
        for t in tasks.values():
            if t.status == TaskStatus.RETRY_WAIT or (
                t.status == TaskStatus.ENQUEUED and t.ready_seq == 0
            ):
                assert t.ready_seq == 0
                assert run_timer(t) in timers, f"{t.task_id} {t.status} has no RUN timer"
            if t.status != TaskStatus.ENQUEUED:
                assert t.ready_seq == 0
            if t.status == TaskStatus.LEASED and t.cancel_cause is not None:
                assert grace_timer(t) in timers
                assert t.cancel_cause in set(CancelCause)
        # (g) a WAITING workflow has exactly one open barrier and it still waits for a child;
        # a fired barrier's step is committed unless its workflow ended first
        for t in tasks.values():
            barriers = fresh.barriers(t.task_id)
            open_ = [b for b in barriers if not b.fired]
            wait = fresh.event_wait(t.task_id)
            if t.status == TaskStatus.WAITING and wait is not None:  # ctx.wait_for_event
                assert not open_, (t.task_id, barriers)
                timer = event_timer(t.task_id, wait)
                assert timer is None or timer in timers, f"{t.task_id} waits without its timer"
            elif t.status == TaskStatus.WAITING:
                assert len(open_) == 1, (t.task_id, barriers)
                b = open_[0]
                kids = [tasks[child_id(t.task_id, b.identity, i)] for i in range(b.total)]
                assert any(k.status not in TERMINAL for k in kids), "the fan-in never fired"
            else:
                assert wait is None, (t.task_id, t.status, wait)
                assert t.status in TERMINAL or not open_, (t.task_id, t.status, open_)
            for b in barriers:
                if b.fired and t.status not in TERMINAL:
                    assert fresh.step(t.task_id, b.identity) is not None
        # no timer outlives its task, but the one that forgets its idempotency key
        for ref in timers:
            assert ref.task_id in tasks, ref
            if ref.kind != TimerKind.FORGET_KEY:
                assert tasks[ref.task_id].status not in TERMINAL, (ref, tasks[ref.task_id].status)
        # every key row is forgotten when its window ends
        for t in tasks.values():
            spec = fresh.spec(t.task_id)
            assert spec is not None
            if spec.idempotency_key is None:
                continue
            entry = fresh.idempotency(t.tenant, t.app, spec.idempotency_key)
            if entry is not None and entry.task_id == t.task_id:
                forget = TimerRef(
                    fire_at_ms=entry.expires_ms,
                    task_id=t.task_id,
                    kind=TimerKind.FORGET_KEY,
                    token=0,
                )
                assert forget in timers, f"{t.task_id}'s key is never forgotten"
        # the dead letters are the FAILED tasks not retried yet
        dead = {task_id for tenant in TENANTS for task_id in fresh.dead(tenant)}
        assert dead == {
            t.task_id
            for t in tasks.values()
            if t.status == TaskStatus.FAILED and t.task_id not in self.retried
        }

    # -- liveness after the faults stop ------------------------------------------------------

    def teardown(self) -> None:
        if not hasattr(self, "h") or self.midway:
            return
        h = self.h
        for _ in range(200):
            open_ = [t for t, s in self.status.items() if s not in TERMINAL]
            if not open_:
                return
            for task_id, lease_id in sorted(self.live.items()):
                done = Completion(task_id=task_id, lease_id=lease_id, outcome=Outcome.SUCCEEDED)
                self._apply(CompleteAttempts(items=[done]))
            for task_id in open_:  # a workflow waiting for an event gets it
                wait = h.committed().event_wait(task_id)
                if wait is not None and self.status[task_id] == TaskStatus.WAITING:
                    task = h.committed().task(task_id)
                    assert task is not None
                    item = WorkflowEvent(task_id=task_id, name=wait.name, payload=b"1")
                    self._apply(SendEvents(tenant=task.tenant, items=[item]))
            self.grant([4, 4], [], [])
            h.advance(60 * S)
            due = h.due()
            if due:
                self._apply(FireTimers(timers=due), epoch=self.epoch)
        raise AssertionError(f"tasks never finished: {open_}")


MachineModel.TestCase.settings = settings(
    max_examples=2_000 if LONG else 150,
    stateful_step_count=100 if LONG else 50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestMachine = MachineModel.TestCase
