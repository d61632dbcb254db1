"""The dispatch slot ledger (``streams/processor/slots.py``), tested like the state machine.

Unit tests show ``check()`` catches each kind of broken count; the hypothesis state machine
drives the ledger through the verbs the pool, the dispatchers and the lease trackers use, in
any order they can come (polls open, slots are dealt and proposed, grants land short, polls
answer with claims in flight, late leases fill reservations, a partition steps down), keeps
its own count of every slot, and after every step asserts ``check()`` passes and the ledger's
``owed``, ``running`` and ``holding`` agree with the model's.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from conveyor.errors import InvariantError
from conveyor.schemas.types import LeaseRequest
from conveyor.streams.processor.slots import AgentKey, Entry, Lease, SlotLedger

LOOP = asyncio.new_event_loop()  # futures need a loop to belong to; none runs here
KEYS: list[AgentKey] = [("a1", "app", None, (), ()), ("a2", "app", None, (), ())]
PARTITIONS = (0, 1)
TENANTS = ("t1", "t2")
TYPES = ("x", "y")
_ids = itertools.count()


def entry(capacity: int, key: AgentKey = KEYS[0]) -> Entry:
    return Entry(
        entry_id=f"{key[0]}/{next(_ids)}",
        agent_id=key[0],
        app="app",
        tenants=[],
        queues=[],
        capacity=capacity,
        lease_ms=1_000,
        future=LOOP.create_future(),
        key=key,
        lanes=["app"],
    )


def lease(partition: int, task_id: str, tenant: str = "t1") -> Lease:
    return Lease(
        partition=partition,
        task_id=task_id,
        lease_id=1,
        attempt=1,
        lease_ms=1_000,
        tenant=tenant,
        app="app",
        queue="default",
        task_type="x",
        payload=b"",
        checkpoint=None,
        start_to_close_ms=None,
        steps=[],
        started_ms=0,
        run_key=task_id,
    )


def propose(ledger: SlotLedger, partition: int) -> list[LeaseRequest]:
    """What ``Dispatcher._requests`` does: one request per (poll, tenant, lane) dealt here."""
    grouped: Counter[tuple[str, str, str]] = Counter()
    polls: dict[str, Entry] = {}
    for e, tenant, lane, _, n in ledger.dealt(partition):
        grouped[(e.entry_id, tenant, lane)] += n
        polls[e.entry_id] = e
    requests = []
    for (entry_id, tenant, lane), n in grouped.items():
        request = LeaseRequest(
            request_id=f"{entry_id}/{tenant}/0/{partition}/{next(_ids)}",
            agent_id=polls[entry_id].agent_id,
            app=lane,
            tenants=[tenant],
            queues=[],
            capacity=n,
            lease_ms=1_000,
        )
        ledger.claim(partition, polls[entry_id], request)
        requests.append(request)
    return requests


# -- unit tests ----------------------------------------------------------------------------


def test_a_slot_goes_free_dealt_claimed_held_and_the_sum_holds_at_each_step() -> None:
    ledger = SlotLedger()
    poll = entry(3)
    ledger.open(poll)
    ledger.deal(poll, 0, "t1", "app", "x")
    ledger.deal(poll, 0, "t1", "app", "y")
    ledger.check()
    assert (poll.remaining, ledger.holding("t1")) == (1, 2)
    (request,) = propose(ledger, 0)
    assert (request.capacity, poll.claimed, ledger.has_dealt(0)) == (2, 2, False)
    ledger.check()
    ledger.settle(0, request.request_id, [lease(0, "task-1")])  # one ready task, not two
    ledger.lease_on(0, "task-1", "t1")
    ledger.check()
    assert (poll.remaining, poll.claimed, len(poll.leases)) == (2, 0, 1)
    assert (ledger.running("t1"), ledger.holding("t1")) == (1, 1)


def test_an_answered_poll_owes_its_claims_in_flight_to_its_agent() -> None:
    ledger = SlotLedger()
    first = entry(2)
    ledger.open(first)
    ledger.deal(first, 1, "t1", "app", "x")
    (request,) = propose(ledger, 1)
    ledger.answer(first)
    ledger.close(first)
    ledger.check()
    assert ledger.owed(KEYS[0]) == 1
    second = entry(4)
    ledger.open(second)  # the agent's next poll reserves the slot owed
    assert (second.reserved, second.remaining) == (1, 3)
    ledger.settle(1, request.request_id, [lease(1, "late")])
    assert ledger.owed(KEYS[0]) == 0
    ledger.reserve_to_held(second, [lease(1, "late")])
    ledger.check()
    assert (second.reserved, len(second.leases)) == (0, 1)


def test_a_lease_is_counted_once_per_task() -> None:
    ledger = SlotLedger()
    ledger.lease_on(0, "task", "t1")
    ledger.lease_on(0, "task", "t1")  # a new lease of the same task replaces the old one
    ledger.lease_on(1, "other", "t1")
    ledger.check()
    assert ledger.running("t1") == 2
    ledger.leases_off(0)
    ledger.lease_off(1, "other")
    ledger.lease_off(1, "other")  # ended twice: counted down once
    ledger.check()
    assert ledger.running("t1") == 0


@pytest.mark.parametrize(
    "corrupt",
    [
        lambda ledger, poll: setattr(poll, "remaining", poll.remaining + 1),  # a slot from nothing
        lambda ledger, poll: setattr(poll, "claimed", poll.claimed + 1),  # a claim counted twice
        lambda ledger, poll: setattr(poll, "reserved", -1),  # negative
        lambda ledger, poll: ledger._owed.__setitem__(KEYS[1], 2),  # owed for no claim
        lambda ledger, poll: ledger._running.__setitem__("t2", 1),  # running, nothing live
    ],
    ids=["free", "claimed", "negative", "owed", "running"],
)
def test_check_names_a_broken_count(corrupt: object) -> None:
    ledger = SlotLedger()
    poll = entry(3)
    ledger.open(poll)
    ledger.deal(poll, 0, "t1", "app", "x")
    propose(ledger, 0)
    ledger.check()
    corrupt(ledger, poll)  # type: ignore[operator]
    with pytest.raises(InvariantError, match="slot ledger"):
        ledger.check()


def test_the_verbs_refuse_what_would_break_a_count() -> None:
    ledger = SlotLedger()
    poll = entry(1)
    ledger.open(poll)
    ledger.deal(poll, 0, "t1", "app", "x")
    with pytest.raises(InvariantError, match="does not have"):
        ledger.deal(poll, 0, "t1", "app", "x")  # its one slot is dealt already
    with pytest.raises(InvariantError, match="more late leases than reserved"):
        ledger.reserve_to_held(poll, [lease(0, "late")])
    (request,) = propose(ledger, 0)
    with pytest.raises(InvariantError, match="more leases than slots"):
        ledger.settle(0, request.request_id, [lease(0, "a"), lease(0, "b")])
    assert ledger.settle(1, request.request_id, []) is None  # another partition's: not ours
    ledger.check()


# -- the state machine ---------------------------------------------------------------------


class LedgerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.ledger = SlotLedger()
        self.polls: list[Entry] = []  # opened and not yet returned
        self.requests: dict[tuple[int, str], LeaseRequest] = {}  # claims in flight
        self.live: dict[tuple[int, str], str] = {}  # (partition, task id) -> tenant
        self.tasks = itertools.count()

    def waiting(self) -> list[Entry]:
        return [p for p in self.polls if not p.answered]

    @rule(capacity=st.integers(1, 4), key=st.sampled_from(KEYS))
    def open_poll(self, capacity: int, key: AgentKey) -> None:
        poll = entry(capacity, key)
        self.ledger.open(poll)
        self.polls.append(poll)

    @precondition(lambda self: any(p.remaining > 0 and not p.closed for p in self.waiting()))
    @rule(
        data=st.data(),
        partition=st.sampled_from(PARTITIONS),
        tenant=st.sampled_from(TENANTS),
        task_type=st.sampled_from(TYPES),
    )
    def deal(self, data: st.DataObject, partition: int, tenant: str, task_type: str) -> None:
        polls = [p for p in self.waiting() if p.remaining > 0 and not p.closed]
        poll = data.draw(st.sampled_from(polls))
        self.ledger.deal(poll, partition, tenant, "app", task_type)

    @rule(partition=st.sampled_from(PARTITIONS))
    def propose(self, partition: int) -> None:
        for request in propose(self.ledger, partition):
            self.requests[(partition, request.request_id)] = request

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def grant(self, data: st.DataObject) -> None:
        """A GrantLeases is applied: up to its capacity granted (fewer: less was ready)."""
        partition, request_id = data.draw(st.sampled_from(sorted(self.requests)))
        request = self.requests.pop((partition, request_id))
        n = data.draw(st.integers(0, request.capacity))
        leases = [
            lease(partition, f"task-{next(self.tasks)}", request.tenants[0]) for _ in range(n)
        ]
        for granted in leases:
            self.ledger.lease_on(partition, granted.task_id, request.tenants[0])
            self.live[(partition, granted.task_id)] = request.tenants[0]
        assert self.ledger.settle(partition, request_id, leases) is not None

    @precondition(lambda self: self.live)
    @rule(data=st.data())
    def lease_ends(self, data: st.DataObject) -> None:
        partition, task_id = data.draw(st.sampled_from(sorted(self.live)))
        del self.live[(partition, task_id)]
        self.ledger.lease_off(partition, task_id)

    @precondition(lambda self: self.waiting())
    @rule(data=st.data(), cancelled=st.booleans())
    def answer(self, data: st.DataObject, cancelled: bool) -> None:
        poll = data.draw(st.sampled_from(self.waiting()))
        if cancelled:
            self.ledger.drop_held(poll)  # its leases go to the mailbox
            poll.closed = True
        self.ledger.answer(poll)

    @precondition(lambda self: [p for p in self.waiting() if not p.closed])
    @rule(data=st.data())
    def close(self, data: st.DataObject) -> None:
        """Timed out with a claim in flight: no new slots, the dealt ones undealt."""
        poll = data.draw(st.sampled_from([p for p in self.waiting() if not p.closed]))
        poll.closed = True
        self.ledger.undeal(entry_id=poll.entry_id)

    @precondition(lambda self: [p for p in self.polls if p.answered])
    @rule(data=st.data())
    def poll_returns(self, data: st.DataObject) -> None:
        poll = data.draw(st.sampled_from([p for p in self.polls if p.answered]))
        self.polls.remove(poll)
        self.ledger.close(poll)

    @rule(key=st.sampled_from(KEYS), arrived=st.integers(0, 3))
    def late_leases(self, key: AgentKey, arrived: int) -> None:
        """What ``WaitingPool._hand_late`` does once late leases reached the mailbox."""
        owed = self.ledger.owed(key)
        for poll in [p for p in self.waiting() if p.key == key]:
            take = min(arrived, poll.reserved)
            arrived -= take
            self.ledger.reserve_to_held(
                poll, [lease(9, f"late-{next(self.tasks)}") for _ in range(take)]
            )
            if poll.reserved > owed:
                self.ledger.reserve_to_free(poll, poll.reserved - owed)
            owed -= poll.reserved

    @rule(partition=st.sampled_from(PARTITIONS))
    def step_down(self, partition: int) -> None:
        """What ``Dispatcher.clear`` and ``LeaseTracker.clear`` do."""
        self.ledger.undeal(partition=partition)
        for _, request in self.ledger.claims(partition):
            del self.requests[(partition, request.request_id)]
            self.ledger.settle(partition, request.request_id, [])
        self.ledger.leases_off(partition)
        self.live = {k: t for k, t in self.live.items() if k[0] != partition}

    @invariant()
    def counts_agree(self) -> None:
        self.ledger.check()
        for key in KEYS:
            in_flight = sum(
                r.capacity
                for (p, rid), r in self.requests.items()
                if rid.startswith(f"{key[0]}/")
                and any(e.answered for e, q in self.ledger.claims(p) if q.request_id == rid)
            )
            assert self.ledger.owed(key) == in_flight
        for tenant in TENANTS:
            running = sum(1 for t in self.live.values() if t == tenant)
            claimed = sum(r.capacity for r in self.requests.values() if r.tenants == [tenant])
            dealt = sum(
                n for p in PARTITIONS for _, t, _, _, n in self.ledger.dealt(p) if t == tenant
            )
            assert self.ledger.running(tenant) == running
            assert self.ledger.holding(tenant) == running + claimed + dealt


TestLedgerMachine = LedgerMachine.TestCase
TestLedgerMachine.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
