"""The dispatch slot ledger: every slot a waiting poll declared, and where it is now.

A poll (``Entry``) declares ``capacity`` free slots of its agent. From then on each of them is
in exactly one place, and this ledger is the one structure that counts them (the waiting pool,
the partitions' dispatchers, the mailboxes and the lease trackers keep no count of their own):

    capacity == free + reserved + dealt + claimed + held      (every poll not yet answered)

    free      not dealt yet (``Entry.remaining``): the pool may deal it to a partition
    reserved  kept for a late lease of the agent's earlier polls (``mailbox.py`` rule 1)
    dealt     dealt to (partition, tenant, lane, task type), not proposed yet
    claimed   in a GrantLeases record of a partition, not applied yet (``Entry.claimed``)
    held      a lease the poll holds, for its answer (``Entry.leases``)

Rule 1: once a poll is answered its free and reserved slots are 0 and none is dealt; its claims
still in flight are ``owed`` to its agent key (their leases go to the agent's mailbox), so
``owed(key)`` is the sum of those claims, and a key owed nothing has no row.
Rule 2: a granted lease is counted once, by (partition, task id), under the tenant of the
request that granted it; ``running(tenant)`` counts them, and ``holding(tenant)`` adds the
tenant's dealt and claimed slots (the concurrency caps read it: in flight counts, so a cap
is never exceeded).
Rule 3: nothing is negative and no row holds a zero.
Rule 4: no I/O, no clock, no event loop: the pool's deadlines are the pool's. ``check()``
verifies rules 1-3 and the sum above, raising ``InvariantError`` with the first one broken;
``tests/unit/test_slot_ledger.py`` drives it with a hypothesis state machine.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

from conveyor.errors import InvariantError
from conveyor.frozen import frozen
from conveyor.schemas.types import LeaseRequest, StepRow

# Who a late lease is for: (agent id, app, app version, tenants, queues) of the poll.
AgentKey = tuple[str, str, "str | None", tuple[str, ...], tuple[str, ...]]
# Where a dealt slot waits to be proposed: (partition, entry id, tenant, lane, task type).
DealtKey = tuple[int, str, str, str, str]


@frozen(kw_only=True)
class Lease:
    """What an agent receives for one granted lease."""

    partition: int
    task_id: str
    lease_id: int
    attempt: int
    lease_ms: int
    tenant: str
    app: str
    queue: str
    task_type: str
    payload: bytes
    checkpoint: bytes | None
    start_to_close_ms: int | None
    # The durable-step snapshot the attempt checks every step call against, loaded once here
    # rather than fetched per step; with the lease's start time (the platform's "now" for a
    # replayed sleep) and the run key step idempotency keys derive from.
    steps: list[StepRow]
    started_ms: int
    run_key: str
    compensating: bool = False  # a canceled workflow: run its compensations, then stop
    trace_context: str | None = None  # the enqueue's W3C trace context (JSON), if any


@dataclass(slots=True, kw_only=True)
class Entry:
    """A waiting poll. Its counts (``remaining``, ``reserved``, ``claimed``, ``leases``) are
    written by the ``SlotLedger`` only."""

    entry_id: str
    agent_id: str
    app: str
    tenants: list[str]
    queues: list[str]
    capacity: int
    lease_ms: int
    future: asyncio.Future[list[Lease]]
    key: AgentKey
    remaining: int = 0  # free slots
    app_version: str | None = None
    task_types: frozenset[str] | None = None  # the types the agent serves; None: any
    lanes: list[str] = field(default_factory=list)  # lanes_of(app, app_version)
    slots: int | None = None  # the agent's slots in all (pool's Headroom); None: not said
    claimed: int = 0  # slots in GrantLeases records not yet applied
    reserved: int = 0  # slots kept for late leases of the agent's earlier polls
    closed: bool = False  # timed out or cancelled: no new slots
    answered: bool = False  # what arrives from now on goes to the agent's mailbox
    leases: list[Lease] = field(default_factory=list)
    linger: asyncio.TimerHandle | None = None  # answers with what it holds when it fires


class SlotLedger:
    """One node's slots (see the module). Verbs, in a slot's order: ``open``, ``deal``,
    ``claim``, ``settle``; ``undeal`` and ``answer`` when a poll no longer wants its slots;
    ``reserve_to_held`` and ``reserve_to_free`` for late leases; ``lease_on`` / ``lease_off``
    for the leases granted."""

    def __init__(self) -> None:
        self.entries: dict[str, Entry] = {}  # the polls waiting, by entry id
        self._dealt: dict[DealtKey, int] = {}
        self._dealt_to: dict[str, Entry] = {}  # entry id -> entry, for the dealt ones
        self._claims: dict[tuple[int, str], tuple[Entry, LeaseRequest]] = {}
        self._owed: dict[AgentKey, int] = {}
        self._live: dict[tuple[int, str], str] = {}  # (partition, task id) -> tenant
        self._running: Counter[str] = Counter()

    # -- a poll's slots -------------------------------------------------------------------

    def open(self, entry: Entry) -> None:
        """A new poll: what its agent is owed is reserved out of its capacity (rule 1)."""
        if entry.entry_id in self.entries or entry.claimed or entry.leases:
            raise InvariantError(f"poll {entry.entry_id} opened twice, or not empty")
        entry.reserved = min(self.owed(entry.key), entry.capacity)
        entry.remaining = entry.capacity - entry.reserved
        self.entries[entry.entry_id] = entry

    def close(self, entry: Entry) -> None:
        """The poll returned: it leaves the deal (its claims in flight stay counted)."""
        self.entries.pop(entry.entry_id, None)

    def deal(self, entry: Entry, partition: int, tenant: str, lane: str, task_type: str) -> None:
        """One free slot of ``entry`` goes to ``partition`` for a ready task there."""
        if entry.remaining <= 0 or entry.closed or entry.answered:
            raise InvariantError(f"poll {entry.entry_id}: a slot dealt it does not have")
        entry.remaining -= 1
        key = (partition, entry.entry_id, tenant, lane, task_type)
        self._dealt[key] = self._dealt.get(key, 0) + 1
        self._dealt_to[entry.entry_id] = entry

    def dealt(self, partition: int) -> Iterator[tuple[Entry, str, str, str, int]]:
        """(entry, tenant, lane, task type, slots) dealt to ``partition``, not proposed."""
        for (p, entry_id, tenant, lane, task_type), n in self._dealt.items():
            if p == partition:
                yield self._dealt_to[entry_id], tenant, lane, task_type, n

    def has_dealt(self, partition: int) -> bool:
        return any(key[0] == partition for key in self._dealt)

    def undeal(
        self, *, entry_id: str | None = None, partition: int | None = None
    ) -> list[tuple[int, str, str, str, int]]:
        """Slots dealt and not proposed (of one entry, or to one partition) go back to their
        entries' free slots; (partition, tenant, lane, task type, slots) of each, so the
        dispatchers count their ready tasks as ready again."""
        back = []
        for key in [
            k
            for k in self._dealt
            if (entry_id is None or k[1] == entry_id) and (partition is None or k[0] == partition)
        ]:
            n = self._dealt.pop(key)
            p, eid, tenant, lane, task_type = key
            self._dealt_to[eid].remaining += n
            back.append((p, tenant, lane, task_type, n))
        self._forget_dealt_entries()
        return back

    def claim(self, partition: int, entry: Entry, request: LeaseRequest) -> None:
        """The slots dealt to ``partition`` for (``entry``, its tenant, its lane) are proposed
        as ``request``: dealt -> claimed."""
        (tenant,) = request.tenants
        keys = [k for k in self._dealt if k[:4] == (partition, entry.entry_id, tenant, request.app)]
        taken = sum(self._dealt[k] for k in keys)
        if taken != request.capacity or (partition, request.request_id) in self._claims:
            raise InvariantError(
                f"request {request.request_id}: claims {request.capacity} slots, "
                f"{taken} were dealt (or it was claimed before)"
            )
        for key in keys:
            del self._dealt[key]
        entry.claimed += taken
        self._claims[(partition, request.request_id)] = (entry, request)
        self._forget_dealt_entries()

    def claims(self, partition: int) -> list[tuple[Entry, LeaseRequest]]:
        return [claim for (p, _), claim in self._claims.items() if p == partition]

    def request(self, partition: int, request_id: str) -> LeaseRequest | None:
        """The request of a claim of ``partition`` in flight, or None (not this node's)."""
        claim = self._claims.get((partition, request_id))
        return None if claim is None else claim[1]

    def settle(
        self, partition: int, request_id: str, leases: list[Lease]
    ) -> tuple[Entry, LeaseRequest] | None:
        """A claim was applied with ``leases`` (or dropped: none): claimed -> held, and the
        slots left over back to free; for an answered poll the claim is no longer owed (the
        caller puts its leases in the agent's mailbox). None: not a claim of this node."""
        claim = self._claims.get((partition, request_id))
        if claim is None:
            return None
        entry, request = claim
        if len(leases) > request.capacity:
            raise InvariantError(f"request {request_id}: more leases than slots")
        del self._claims[(partition, request_id)]
        entry.claimed -= request.capacity
        if entry.answered:
            self._add_owed(entry.key, -request.capacity)
        else:
            entry.leases.extend(leases)
            entry.remaining += request.capacity - len(leases)
        return claim

    def answer(self, entry: Entry) -> list[tuple[int, str, str, str, int]]:
        """The poll answers: nothing more is dealt it, its claims in flight become owed to its
        agent (rule 1); what ``undeal`` returns."""
        back = self.undeal(entry_id=entry.entry_id)
        entry.answered = True
        entry.remaining = entry.reserved = 0
        self._add_owed(entry.key, entry.claimed)
        return back

    def drop_held(self, entry: Entry) -> list[Lease]:
        """A cancelled poll's leases leave it for the agent's mailbox (``mailbox.py`` rule 3):
        their slots are free again (the poll answers next)."""
        held, entry.leases = entry.leases, []
        entry.remaining += len(held)
        return held

    def reserve_to_held(self, entry: Entry, late: list[Lease]) -> None:
        """Late leases fill reserved slots."""
        if len(late) > entry.reserved:
            raise InvariantError(f"poll {entry.entry_id}: more late leases than reserved")
        entry.reserved -= len(late)
        entry.leases.extend(late)

    def reserve_to_free(self, entry: Entry, n: int) -> None:
        """Reserved slots beyond what is still owed become free slots."""
        if not 0 <= n <= entry.reserved:
            raise InvariantError(f"poll {entry.entry_id}: frees {n} of {entry.reserved}")
        entry.reserved -= n
        entry.remaining += n

    def owed(self, key: AgentKey) -> int:
        return self._owed.get(key, 0)

    def _add_owed(self, key: AgentKey, n: int) -> None:
        owed = self._owed.get(key, 0) + n
        if owed < 0:
            raise InvariantError(f"agent {key}: more slots settled than owed")
        if owed:
            self._owed[key] = owed
        else:
            self._owed.pop(key, None)

    def _forget_dealt_entries(self) -> None:
        if len(self._dealt_to) > len(self._dealt):  # cheap most of the time: both small
            still = {key[1] for key in self._dealt}
            for entry_id in [e for e in self._dealt_to if e not in still]:
                del self._dealt_to[entry_id]

    # -- leases granted ------------------------------------------------------------------

    def lease_on(self, partition: int, task_id: str, tenant: str) -> None:
        """A lease is live (granted, or taken over by a new leader); replaces the task's
        earlier one (rule 2)."""
        old = self._live.get((partition, task_id))
        if old is not None:
            self._down(old)
        self._live[(partition, task_id)] = tenant
        self._running[tenant] += 1

    def lease_off(self, partition: int, task_id: str) -> None:
        tenant = self._live.pop((partition, task_id), None)
        if tenant is not None:
            self._down(tenant)

    def leases_off(self, partition: int) -> None:
        """The partition stopped leading: none of its leases is live here any more."""
        for key in [k for k in self._live if k[0] == partition]:
            self._down(self._live.pop(key))

    def _down(self, tenant: str) -> None:
        self._running[tenant] -= 1
        if self._running[tenant] <= 0:
            del self._running[tenant]

    def running(self, tenant: str) -> int:
        return self._running.get(tenant, 0)

    def holding(self, tenant: str) -> int:
        """The tenant's live leases on this node, plus its slots dealt or claimed (rule 2)."""
        dealt = sum(n for key, n in self._dealt.items() if key[2] == tenant)
        claimed = sum(r.capacity for _, r in self._claims.values() if r.tenants == [tenant])
        return self._running.get(tenant, 0) + dealt + claimed

    # -- invariants ------------------------------------------------------------------------

    def check(self) -> None:
        """Every rule of the module; ``InvariantError`` names the first one broken."""
        dealt: Counter[str] = Counter()
        for key, n in self._dealt.items():
            _expect(n > 0, f"dealt {key}: {n} slots")
            _expect(key[1] in self._dealt_to, f"dealt {key}: to an unknown poll")
            dealt[key[1]] += n
        claimed: Counter[str] = Counter()
        owed: Counter[AgentKey] = Counter()
        polls = dict(self.entries)
        for (partition, request_id), (entry, request) in self._claims.items():
            _expect(request.capacity > 0, f"claim {request_id}: {request.capacity} slots")
            _expect(str(partition) in request_id.split("/"), f"claim {request_id}: partition")
            claimed[entry.entry_id] += request.capacity
            polls[entry.entry_id] = entry
            if entry.answered:
                owed[entry.key] += request.capacity
        for entry in polls.values():
            _check_entry(entry, dealt[entry.entry_id], claimed[entry.entry_id])
        _expect(dict(owed) == self._owed, f"owed {self._owed}, claims of answered {dict(owed)}")
        by_tenant = Counter(self._live.values())
        _expect(+by_tenant == self._running, f"running {self._running}, live {by_tenant}")
        _expect(all(n > 0 for n in self._running.values()), f"running {self._running}")


def _check_entry(entry: Entry, dealt: int, claimed: int) -> None:
    name = f"poll {entry.entry_id}"
    counts = (entry.remaining, entry.reserved, dealt, entry.claimed, len(entry.leases))
    _expect(min(counts) >= 0, f"{name}: a count below zero {counts}")
    _expect(entry.claimed == claimed, f"{name}: claimed {entry.claimed}, claims {claimed}")
    if entry.answered:
        _expect(entry.remaining == entry.reserved == dealt == 0, f"{name}: answered {counts}")
    else:
        _expect(sum(counts) == entry.capacity, f"{name}: {counts} != {entry.capacity}")


def _expect(ok: bool, broken: str) -> None:
    if not ok:
        raise InvariantError(f"slot ledger: {broken}")
