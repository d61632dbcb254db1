"""Waiting agents: the long-polls at one node, dealt out slot by slot to its partitions.

Agents long-poll the node with a capacity. Their requests wait in one ``WaitingPool`` per node,
which decides fairness across the node (see the class) and deals each free slot to a
partition's ``Dispatcher`` (``dispatch.py``); the dispatcher proposes the GrantLeases record,
and the leases come back here once it is applied.

Rule: a poll is answered once none of its claims is in flight, or ``ANSWER_LINGER_MS`` after
it first holds a lease, whichever comes first (or at its timeout, maybe empty): one slow
partition's grant no longer holds up the leases the others granted. The leases of its claims
still in flight are granted all the same and go to the agent's next polls through its mailbox
(``mailbox.py``), which also reserves them out of those polls' capacity: no granted lease is
stranded, and no poll returns more than its capacity.
Lanes: an agent serving app version V takes from two ready lanes (``store/lanes.py``), its app's
and V's pinned lane; ready work is counted per lane, and a slot dealt from a lane becomes a
LeaseRequest for that lane.
Task types: a poll names the task types its agent serves now (``task_types``; None: any, for an
agent that does not say). Ready work is counted per type too, and a slot is dealt only where a
ready task of one of the poll's types waits; the request names those types, and the machine
takes only them. So during a rolling deploy a task of a type only the new version has waits for
an agent of the new version instead of being dealt to an old one that would fail it, and an
agent whose circuit breaker is open for a type (``agents/breaker.py``) leaves that type out of
its polls and keeps taking the others.
Why the poll carries the set rather than the node looking it up from the agent's registration:
the set changes without a registration (a breaker opens and closes), registration is per app
(every version's types merged), and a poll is one request per long-poll, not per task. An app's
types are few (at most ``TASK_TYPES_MAX`` names, a few KiB at the worst), and only the types
that have ready work on a partition go into its GrantLeases record.
Slots: every slot a poll declared is counted in the node's ``SlotLedger`` (``slots.py``), the
one structure with a ``check()`` of their invariants; the pool changes counts only through it.
Time: what the pool decides from time (a tenant active for ``ACTIVE_MS``, and the deal again
when that may have lapsed) reads the injected clock. A long-poll's own deadlines (its
``wait_ms``, the linger and the close grace) are the caller's: the event loop's timers, so that
a poll times out on a ``FakeClock`` that nobody advances (``conveyor.testing``) as it does on
the real one.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Protocol

from conveyor.errors import InvariantError
from conveyor.store.lanes import lanes_of
from conveyor.streams.clock import Clock
from conveyor.streams.processor.mailbox import Mailboxes
from conveyor.streams.processor.slots import AgentKey, Entry, Lease, SlotLedger

__all__ = ["Dealer", "Entry", "Lease", "WaitingPool"]

# lane -> tenant -> task type -> ready tasks on a partition (minus the slots dealt there)
ReadyCounts = dict[str, dict[str, dict[str, int]]]


class Dealer(Protocol):
    """What the pool needs of a partition's dispatcher (``dispatch.py``)."""

    @property
    def partition(self) -> int: ...

    @property
    def leading(self) -> bool: ...

    @property
    def ready(self) -> ReadyCounts: ...

    def refresh(self, lane: str) -> None:
        """Recount the ready work in ``lane`` from committed state."""
        ...

    def hand_back(self, tenant: str, lane: str, task_type: str, n: int) -> None:
        """``n`` slots dealt and never proposed: their ready tasks count as ready again."""
        ...

    def wake(self) -> None:
        """Slots were dealt to it: propose them."""
        ...

    def holds(self, lease: Lease) -> bool:
        """The lease is live there: granted by this leader, not ended, not expiring."""
        ...

    def touch(self, lease: Lease) -> None:
        """A late lease reached its agent: its interval starts now."""
        ...


# A poll holding leases while other claims of it are still being written waits this long for
# them before it answers with what it holds (see the module's Rule).
ANSWER_LINGER_MS = 1.0
CLOSE_GRACE_MS = 250.0
# Headroom: a tenant counts as active for an app this long after it last had ready work.
ACTIVE_MS = 1_000.0
# ...and with one tenant active, an agent of at least this many slots keeps one for a newcomer.
NEWCOMER_SLOTS_MIN = 8


class WaitingPool:
    """The long-polls waiting at one node, dealt out slot by slot to its partitions.

    Fairness is decided here, across the whole node: each free slot goes to the next tenant,
    round-robin over the tenants with ready work for the entry's app, and then to one of the
    partitions holding that tenant's ready work (rotating from poll to poll; within one poll a
    tenant's slots stay on one partition while it has ready work there, so that they make one
    GrantLeases record, not one per partition). Tenant A's backlog in every partition costs
    tenant B one slot in two, not one partition's turn in eight. Inside a partition the state
    machine still orders by priority, then age.

    Headroom: a poll that says its agent's ``slots`` in all keeps some of them from the
    heaviest tenant while another tenant it serves is active (had ready work in the last
    ``ACTIVE_MS``). The poll's capacity is the agent's free slots; the tenant holding more
    leases on the node than all the other active ones together is dealt only what leaves
    ``1 + (their leases)`` of them free, at most half the agent's slots. So a light tenant's
    next task finds a free slot instead of waiting for the heavy tenant's tasks to end: with
    tasks of equal length started by one poll, those end together, and the wait for a slot is
    up to a whole task's length. The price is slots left idle while the light tenant has
    nothing ready; with no tenant holding more than the rest together, nothing is kept.

    With one tenant active, an agent of ``NEWCOMER_SLOTS_MIN`` slots or more keeps one for a
    newcomer, whose first tasks would otherwise wait for tasks that one poll started, all of
    the one tenant (``conveyor bench fairness``: the first B tasks waited 10-21 ms, the rest
    2-7 ms). That costs one slot of such an agent while one tenant has it to itself. An agent
    that would rather keep all its slots busy leaves ``slots`` out, and one serving a single
    tenant keeps none. Agents behind the gateway serve one tenant each (their API key's), so
    this is for agents serving several.

    Concurrency caps: ``caps(tenant)`` is the most leases the tenant may hold at once on this
    node (None: no cap). A slot goes to a capped tenant only while its live leases plus the
    slots dealt or in flight for it stay under the cap; when one of its leases ends, the pool
    deals again. Counting what is in flight makes the cap hard: it is never exceeded, at the
    price of a slot held back while a grant is being written.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.caps: Callable[[str], int | None] = lambda tenant: None
        self.ledger = SlotLedger()  # every slot's count (``slots.py``)
        self._ids = itertools.count()
        self._turn = 0
        self._last_tenant: dict[str, str] = {}
        self.mail = Mailboxes(self._live, self._touch)
        self._by_partition: dict[int, Dealer] = {}
        self._seen: dict[str, dict[str, float]] = {}  # app -> tenant -> last seen ready
        self._recheck: asyncio.Task[None] | None = None

    @property
    def entries(self) -> dict[str, Entry]:
        """The polls waiting, by entry id."""
        return self.ledger.entries

    @property
    def dispatchers(self) -> list[Dealer]:
        """The dispatchers dealt from: one per partition, the newest registered for it."""
        return list(self._by_partition.values())

    def register(self, dispatcher: Dealer) -> None:
        """A partition's dispatcher joins the deal, in place of any earlier one of the same
        partition: a partition's processor made anew (it moved away and came back, or was
        restored from a snapshot) deals from its new store, and the stopped one's dispatcher
        never reads its closed store again."""
        self._by_partition[dispatcher.partition] = dispatcher

    def apps(self) -> set[str]:
        """The lanes some waiting entry takes from."""
        return {lane for e in self.entries.values() for lane in e.lanes}

    async def poll(
        self,
        *,
        agent_id: str,
        app: str,
        tenants: list[str],
        queues: list[str],
        capacity: int,
        lease_ms: int,
        wait_ms: float,
        app_version: str | None = None,
        slots: int | None = None,
        task_types: frozenset[str] | None = None,
    ) -> list[Lease]:
        """Between 1 and ``capacity`` leases from any partition once there are some (see the
        Rule), or none after ``wait_ms``; ``app_version``: the version the agent serves (see
        Lanes); ``slots``: the agent's slots in all, ``capacity`` of them free (see the
        class's Headroom); ``task_types``: the types it takes (see Task types). Late leases
        of this agent's earlier polls come first (``mailbox.py``)."""
        key: AgentKey = (agent_id, app, app_version, tuple(tenants), tuple(queues))
        self.mail.sweep(self.clock.monotonic_ms())
        late = self.mail.take(key, capacity)
        if late:
            return late
        entry = Entry(
            entry_id=f"{agent_id}/{next(self._ids)}",
            agent_id=agent_id,
            app=app,
            tenants=tenants,
            queues=queues,
            capacity=capacity,
            lease_ms=lease_ms,
            key=key,
            future=asyncio.get_running_loop().create_future(),
            app_version=app_version,
            lanes=lanes_of(app, app_version),
            slots=slots,
            task_types=task_types,
        )
        self.ledger.open(entry)
        for dispatcher in self._by_partition.values():
            for lane in entry.lanes:
                if lane not in dispatcher.ready:  # else kept current by pokes (see poke)
                    dispatcher.refresh(lane)  # O(tenants) reads of the ready counts
        self.deal()
        # The answer resolves the future awaited here directly (no wait_for or shield between:
        # each would add loop steps between a grant and its agent); the timeout closes it.
        timeout = asyncio.get_running_loop().call_later(wait_ms / 1000, self._close, entry)
        try:
            return await entry.future
        except asyncio.CancelledError:
            # The agent went away: what it held and what is in flight for it waits in its
            # mailbox in case it comes back, and lapses otherwise (retried, never lost).
            held = self.ledger.drop_held(entry)
            entry.closed = True
            self._answer(entry)
            self.mail.keep(key, held)
            raise
        finally:
            timeout.cancel()
            self.ledger.close(entry)

    def _close(self, entry: Entry) -> None:
        """No new slots for this entry: it answers now, with what it holds. A poll that would
        answer empty while a claim of it is in flight first waits ``CLOSE_GRACE_MS`` for it
        (a grant takes milliseconds; an agent should not have to poll again for it)."""
        if entry.answered:
            return
        if not entry.closed and entry.claimed and not entry.leases:
            entry.closed = True  # no new slots; the claim in flight settles it (_settle)
            # Slots dealt but not proposed yet will never be: free again, as in _answer.
            self._hand_back(self.ledger.undeal(entry_id=entry.entry_id))
            asyncio.get_running_loop().call_later(CLOSE_GRACE_MS / 1000, self._close, entry)
            return
        entry.closed = True
        self._answer(entry)

    def _settle(self, entry: Entry) -> None:
        if entry.answered:
            return
        if entry.closed or (entry.leases and entry.claimed == 0):
            self._answer(entry)
        elif entry.leases and entry.linger is None:
            loop = asyncio.get_running_loop()
            entry.linger = loop.call_later(ANSWER_LINGER_MS / 1000, self._close, entry)

    def _answer(self, entry: Entry) -> None:
        """Return ``entry.leases``; slots dealt but not proposed go back to the pool, slots in
        flight become the agent's mailbox's ``owed``."""
        if entry.linger is not None:
            entry.linger.cancel()
        self._hand_back(self.ledger.answer(entry))
        if not entry.future.done():  # cancelled with its poll: the leases went to the mailbox
            entry.future.set_result(entry.leases)

    def settled(self, partition: int, request_id: str, leases: list[Lease]) -> None:
        """A claim of ``partition`` was applied with ``leases`` (or dropped: none)."""
        claim = self.ledger.settle(partition, request_id, leases)
        if claim is None:
            return
        entry = claim[0]
        if entry.answered:
            self.mail.keep(entry.key, leases)
            self._hand_late(entry.key)
            return
        self._settle(entry)

    def _hand_back(self, undealt: list[tuple[int, str, str, str, int]]) -> None:
        for partition, tenant, lane, task_type, n in undealt:
            dispatcher = self._by_partition.get(partition)
            if dispatcher is not None:
                dispatcher.hand_back(tenant, lane, task_type, n)

    def _hand_late(self, key: AgentKey) -> None:
        """Late leases fill the slots that waiting polls of ``key`` reserved for them; a
        reservation beyond what is still owed becomes an ordinary slot again."""
        owed = self.ledger.owed(key)
        redeal = False
        for entry in list(self.entries.values()):
            if entry.key != key or entry.answered:
                continue
            self.ledger.reserve_to_held(entry, self.mail.take(key, entry.reserved))
            if entry.reserved > owed:
                self.ledger.reserve_to_free(entry, entry.reserved - owed)
                redeal = True
            owed -= entry.reserved
            self._settle(entry)
        if redeal:
            self.deal()

    def _live(self, lease: Lease) -> bool:
        dispatcher = self._dispatcher(lease)
        return dispatcher is not None and dispatcher.holds(lease)

    def _touch(self, lease: Lease) -> None:
        dispatcher = self._dispatcher(lease)
        if dispatcher is not None:
            dispatcher.touch(lease)

    def _dispatcher(self, lease: Lease) -> Dealer | None:
        return self._by_partition.get(lease.partition)

    def deal(self) -> None:
        woken: set[int] = set()
        room: dict[str, int] = {}  # capped tenants: slots they may still be dealt
        for entry in self.entries.values():
            if entry.remaining <= 0 or entry.closed or entry.answered:
                continue
            holders = self._holders(entry)
            for tenant in holders:
                if tenant not in room and (cap := self.caps(tenant)) is not None:
                    room[tenant] = cap - self.ledger.holding(tenant)
            # What a tenant may still be dealt: node-wide (caps), and from this entry alone
            # (headroom); a tenant leaves the deal when either is spent.
            budgets = (room, self._headroom(entry, holders))
            for tenant in [t for t in holders if any(b.get(t, 1) <= 0 for b in budgets)]:
                del holders[tenant]
            stay: dict[str, tuple[Dealer, str]] = {}
            while entry.remaining > 0 and holders:
                dispatcher, tenant, lane, task_type = self._next(entry, holders, stay)
                self.ledger.deal(entry, dispatcher.partition, tenant, lane, task_type)
                woken.add(id(dispatcher))
                for budget in budgets:
                    if tenant in budget:
                        budget[tenant] -= 1
                        if budget[tenant] <= 0:
                            holders.pop(tenant, None)
        for dispatcher in self._by_partition.values():
            if id(dispatcher) in woken:
                dispatcher.wake()

    def _headroom(
        self, entry: Entry, holders: dict[str, list[tuple[Dealer, str]]]
    ) -> dict[str, int]:
        """{the heaviest tenant: the slots it may be dealt from ``entry``}, or nothing when
        there is no headroom to keep. See Headroom in the class's docstring."""
        if entry.slots is None or entry.slots < 2:
            return {}
        now = self.clock.monotonic_ms()
        seen = self._seen.setdefault(entry.app, {})
        for tenant in holders:
            seen[tenant] = now
        for tenant in [t for t, at in seen.items() if now - at > ACTIVE_MS]:
            del seen[tenant]
        served = [t for t in seen if not entry.tenants or t in entry.tenants]
        held = {t: self.ledger.holding(t) for t in served}
        if not held or len(entry.tenants) == 1:
            return {}  # nobody active, or an agent of one tenant: nobody to keep a slot for
        heaviest = max(held, key=held.__getitem__)
        others = sum(n for t, n in held.items() if t != heaviest)
        if len(held) == 1 and entry.slots < NEWCOMER_SLOTS_MIN:
            return {}  # one slot of a few is too dear to keep for a tenant not yet seen
        if len(held) > 1 and others >= held[heaviest]:
            return {}  # no tenant holds more than the rest together: nothing to keep
        allow = entry.remaining - min(entry.slots // 2, 1 + others)
        if allow <= 0 and heaviest in holders:
            self._recheck_headroom()
        return {heaviest: allow}

    def _recheck_headroom(self) -> None:
        """Deal again once the light tenants may have gone quiet: a poll held back for them
        should not wait out its whole long-poll after they stop."""
        if self._recheck is None:
            self._recheck = asyncio.ensure_future(self._rechecked())

    async def _rechecked(self) -> None:
        await self.clock.sleep_ms(ACTIVE_MS + 1)  # the light tenants' ACTIVE_MS has passed
        self._recheck = None
        self.deal()

    def _holders(self, entry: Entry) -> dict[str, list[tuple[Dealer, str]]]:
        """Tenant -> the (leading partition, lane) pairs with ready work of it for this
        entry."""
        holders: dict[str, list[tuple[Dealer, str]]] = {}
        for d in self._by_partition.values():
            if not d.leading:
                continue
            for lane in entry.lanes:
                for tenant, by_type in d.ready.get(lane, {}).items():
                    if entry.tenants and tenant not in entry.tenants:
                        continue
                    if _served(entry, by_type) is not None:
                        holders.setdefault(tenant, []).append((d, lane))
        return holders

    def _next(
        self,
        entry: Entry,
        holders: dict[str, list[tuple[Dealer, str]]],
        stay: dict[str, tuple[Dealer, str]],
    ) -> tuple[Dealer, str, str, str]:
        """The tenant after the last one served for this app, a partition and lane holding it,
        and a type of the entry's with ready work there; takes one ready task of that type off
        the counts (and the choice off ``holders`` when none the entry serves is left).
        ``stay``: the partition each tenant was last dealt from for this entry; its next slot
        comes from there while it has ready work, so one poll's slots of a tenant make one
        GrantLeases record, not one per partition (the rotation moves on between polls)."""
        app = entry.app
        last = self._last_tenant.get(app)
        tenant = min((t for t in holders if last is None or t > last), default=min(holders))
        self._last_tenant[app] = tenant
        choices = holders[tenant]
        choice = stay.get(tenant)
        if choice is None or choice not in choices:
            self._turn += 1
            choice = choices[self._turn % len(choices)]
            stay[tenant] = choice
        dispatcher, lane = choice
        by_type = dispatcher.ready[lane][tenant]
        task_type = _served(entry, by_type)
        if task_type is None:
            raise InvariantError(f"entry {entry.entry_id}: a holder with no ready work it serves")
        by_type[task_type] -= 1
        if _served(entry, by_type) is None:
            choices.remove(choice)
            if not choices:
                del holders[tenant]
        return dispatcher, tenant, lane, task_type


def _served(entry: Entry, by_type: dict[str, int]) -> str | None:
    """A task type with ready work in ``by_type`` that ``entry`` serves, if any."""
    for task_type, count in by_type.items():
        if count > 0 and (entry.task_types is None or task_type in entry.task_types):
            return task_type
    return None
