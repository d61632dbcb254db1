"""Waiting agents and the GrantLeases proposer (a leader duty).

Agents long-poll the node with a capacity. Their requests wait in one ``WaitingPool`` per node.
Each partition's ``Dispatcher`` claims a share of the waiting capacity whenever it may have
ready work (a task was enqueued or came back from backoff, or a new request arrived) and
proposes ONE GrantLeases record for all its claims. The state machine picks tasks fairly; the
offers come back as actions after the batch is committed, and only then reach the agent.

Rule: a poll is answered once none of its claims is in flight, or ``ANSWER_LINGER_MS`` after
it first holds a lease, whichever comes first (or at its timeout, maybe empty): one slow
partition's grant no longer holds up the leases the others granted. The leases of its claims
still in flight are granted all the same and go to the agent's next polls through its mailbox
(``mailbox.py``), which also reserves them out of those polls' capacity: no granted lease is
stranded, and no poll returns more than its capacity.
Lanes: an agent serving app version V takes from two ready lanes (``store/lanes.py``), its app's
and V's pinned lane; ready work is counted per lane, and a slot dealt from a lane becomes a
LeaseRequest for that lane.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conveyor.errors import TransientError
from conveyor.schemas.types import GrantLeases, LeaseRequest, StepRow
from conveyor.store.lanes import lanes_of
from conveyor.streams.clock import Clock
from conveyor.streams.log.api import LogSealed
from conveyor.streams.machine import Grant, Offer
from conveyor.streams.processor.mailbox import AgentKey, Mailboxes
from conveyor.streams.processor.waiting import Poke, back_off

if TYPE_CHECKING:
    from conveyor.streams.processor.loop import PartitionProcessor


@dataclass(frozen=True, slots=True, kw_only=True)
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


@dataclass(slots=True, kw_only=True)
class Entry:
    entry_id: str
    agent_id: str
    app: str
    tenants: list[str]
    queues: list[str]
    capacity: int
    lease_ms: int
    remaining: int
    future: asyncio.Future[list[Lease]]
    key: AgentKey
    app_version: str | None = None
    lanes: list[str] = field(default_factory=list)  # lanes_of(app, app_version)
    claimed: int = 0  # slots in GrantLeases records not yet applied
    reserved: int = 0  # slots kept for late leases of the agent's earlier polls
    closed: bool = False  # timed out or cancelled: no new slots
    answered: bool = False  # what arrives from now on goes to the agent's mailbox
    leases: list[Lease] = field(default_factory=list)
    linger: asyncio.TimerHandle | None = None  # answers with what it holds when it fires


READY_PEEK = 64  # ready tasks counted per (partition, app, tenant): enough to deal a round
# A poll holding leases while other claims of it are still being written waits this long for
# them before it answers with what it holds (see the module's Rule).
ANSWER_LINGER_MS = 1.0
CLOSE_GRACE_MS = 250.0


class WaitingPool:
    """The long-polls waiting at one node, dealt out slot by slot to its partitions.

    Fairness is decided here, across the whole node: each free slot goes to the next tenant,
    round-robin over the tenants with ready work for the entry's app, and then to one of the
    partitions holding that tenant's ready work (rotating from poll to poll; within one poll a
    tenant's slots stay on one partition while it has ready work there, so that they make one
    GrantLeases record, not one per partition). Tenant A's backlog in every partition costs
    tenant B one slot in two, not one partition's turn in eight. Inside a partition the state
    machine still orders by priority, then age.

    Concurrency caps: ``caps(tenant)`` is the most leases the tenant may hold at once on this
    node (None: no cap). A slot goes to a capped tenant only while its live leases plus the
    slots dealt or in flight for it stay under the cap; when one of its leases ends, the pool
    deals again. Counting what is in flight makes the cap hard: it is never exceeded, at the
    price of a slot held back while a grant is being written.
    """

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.caps: Callable[[str], int | None] = lambda tenant: None
        self.entries: dict[str, Entry] = {}
        self.dispatchers: list[Dispatcher] = []
        self._ids = itertools.count()
        self._turn = 0
        self._last_tenant: dict[str, str] = {}
        self.mail = Mailboxes(self._live, self._touch)
        self._by_partition: dict[int, Dispatcher] = {}

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
    ) -> list[Lease]:
        """Between 1 and ``capacity`` leases from any partition once there are some (see the
        Rule), or none after ``wait_ms``; ``app_version``: the version the agent serves (see
        Lanes). Late leases of this agent's earlier polls come first (``mailbox.py``)."""
        key: AgentKey = (agent_id, app, app_version, tuple(tenants), tuple(queues))
        self.mail.sweep(self.clock.monotonic_ms())
        late = self.mail.take(key, capacity)
        if late:
            return late
        reserved = min(self.mail.owed(key), capacity)
        entry = Entry(
            entry_id=f"{agent_id}/{next(self._ids)}",
            agent_id=agent_id,
            app=app,
            tenants=tenants,
            queues=queues,
            capacity=capacity,
            lease_ms=lease_ms,
            remaining=capacity - reserved,
            reserved=reserved,
            key=key,
            future=asyncio.get_running_loop().create_future(),
            app_version=app_version,
            lanes=lanes_of(app, app_version),
        )
        self.entries[entry.entry_id] = entry
        for dispatcher in self.dispatchers:
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
            held, entry.leases = entry.leases, []
            entry.closed = True
            self._answer(entry)
            self.mail.keep(key, held)
            raise
        finally:
            timeout.cancel()
            self.entries.pop(entry.entry_id, None)

    def _close(self, entry: Entry) -> None:
        """No new slots for this entry: it answers now, with what it holds. A poll that would
        answer empty while a claim of it is in flight first waits ``CLOSE_GRACE_MS`` for it
        (a grant takes milliseconds; an agent should not have to poll again for it)."""
        if entry.answered:
            return
        if not entry.closed and entry.claimed and not entry.leases:
            entry.closed = True  # no new slots; the claim in flight settles it (_settle)
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
        entry.answered = True
        if entry.linger is not None:
            entry.linger.cancel()
        for dispatcher in self.dispatchers:
            dispatcher.unclaim(entry.entry_id)
        entry.remaining = entry.reserved = 0
        self.mail.owe(entry.key, entry.claimed)
        if not entry.future.done():  # cancelled with its poll: the leases went to the mailbox
            entry.future.set_result(entry.leases)

    def settled(self, entry: Entry, slots: int, leases: list[Lease]) -> None:
        """A claim of ``slots`` for ``entry`` was applied with ``leases`` (or dropped: none)."""
        entry.claimed -= slots
        if entry.answered:
            self.mail.arrive(entry.key, slots, leases)
            self._hand_late(entry.key)
            return
        entry.leases.extend(leases)
        if not entry.closed:
            entry.remaining += slots - len(leases)
        self._settle(entry)

    def _hand_late(self, key: AgentKey) -> None:
        """Late leases fill the slots that waiting polls of ``key`` reserved for them; a
        reservation beyond what is still owed becomes an ordinary slot again."""
        owed = self.mail.owed(key)
        redeal = False
        for entry in list(self.entries.values()):
            if entry.key != key or entry.answered:
                continue
            late = self.mail.take(key, entry.reserved)
            entry.reserved -= len(late)
            entry.leases.extend(late)
            if entry.reserved > owed:
                entry.remaining += entry.reserved - owed
                entry.reserved = owed
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

    def _dispatcher(self, lease: Lease) -> Dispatcher | None:
        if not self._by_partition:
            self._by_partition = {d.partition: d for d in self.dispatchers}
        return self._by_partition.get(lease.partition)

    def deal(self) -> None:
        woken: set[int] = set()
        room: dict[str, int] = {}  # capped tenants: slots they may still be dealt
        for entry in self.entries.values():
            if entry.remaining <= 0 or entry.closed or entry.answered:
                continue
            holders = self._holders(entry)
            for tenant in list(holders):
                if tenant not in room and (cap := self.caps(tenant)) is not None:
                    room[tenant] = cap - sum(d.holding(tenant) for d in self.dispatchers)
                if room.get(tenant, 1) <= 0:
                    del holders[tenant]
            stay: dict[str, tuple[Dispatcher, str]] = {}
            while entry.remaining > 0 and holders:
                dispatcher, tenant, lane = self._next(entry.app, holders, stay)
                dispatcher.assign(entry, tenant, lane)
                entry.remaining -= 1
                woken.add(id(dispatcher))
                if tenant in room:
                    room[tenant] -= 1
                    if room[tenant] <= 0:
                        holders.pop(tenant, None)
        for dispatcher in self.dispatchers:
            if id(dispatcher) in woken:
                dispatcher.wake()

    def _holders(self, entry: Entry) -> dict[str, list[tuple[Dispatcher, str]]]:
        """Tenant -> the (leading partition, lane) pairs with ready work of it for this
        entry."""
        holders: dict[str, list[tuple[Dispatcher, str]]] = {}
        for d in self.dispatchers:
            if not d.leading:
                continue
            for lane in entry.lanes:
                for tenant, count in d.ready.get(lane, {}).items():
                    if count > 0 and (not entry.tenants or tenant in entry.tenants):
                        holders.setdefault(tenant, []).append((d, lane))
        return holders

    def _next(
        self,
        app: str,
        holders: dict[str, list[tuple[Dispatcher, str]]],
        stay: dict[str, tuple[Dispatcher, str]],
    ) -> tuple[Dispatcher, str, str]:
        """The tenant after the last one served for this app, and a partition and lane
        holding it; takes one ready task off the counts (and off ``holders`` when none is
        left). ``stay``: the partition each tenant was last dealt from for this entry; its
        next slot comes from there while it has ready work, so one poll's slots of a tenant
        make one GrantLeases record, not one per partition (the rotation moves on between
        polls)."""
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
        counts = dispatcher.ready[lane]
        counts[tenant] -= 1
        if counts[tenant] <= 0:
            choices.remove(choice)
            if not choices:
                del holders[tenant]
        return dispatcher, tenant, lane


class Dispatcher:
    def __init__(self, processor: PartitionProcessor, pool: WaitingPool) -> None:
        self._p = processor
        self._pool = pool
        self._poke = Poke(processor.clock)
        # app -> tenant -> ready tasks here (counted up to READY_PEEK, minus slots dealt).
        self.ready: dict[str, dict[str, int]] = {}
        # (entry id, tenant, lane) -> slots dealt, not yet proposed
        self._dealt: dict[tuple[str, str, str], tuple[Entry, int]] = {}
        self._claims: dict[str, tuple[Entry, LeaseRequest]] = {}  # proposed, not yet applied
        self.granted = 0
        pool.dispatchers.append(self)

    @property
    def leading(self) -> bool:
        return self._p.leader

    @property
    def partition(self) -> int:
        return self._p.partition

    def touch(self, lease: Lease) -> None:
        """A late lease reached its agent: its interval starts now (``mailbox.py`` rule 4)."""
        self._p.leases.heartbeat(lease.task_id, lease.lease_id)

    def holds(self, lease: Lease) -> bool:
        """The lease is live here: granted by this leader, not ended, not expiring."""
        live = self._p.leases.live.get(lease.task_id)
        return (
            self._p.leader
            and live is not None
            and live.lease_id == lease.lease_id
            and not live.expiring
        )

    def refresh(self, lane: str) -> None:
        """Recount this partition's ready work in ``lane`` from committed state."""
        tables = self._p.reader()
        counts = {
            tenant: min(READY_PEEK, tables.count_ready(lane, tenant))
            for tenant in tables.ready_tenants(lane)
        }
        for (_, tenant, dealt_lane), (_, n) in self._dealt.items():
            if dealt_lane == lane and tenant in counts:
                counts[tenant] -= n
        self.ready[lane] = counts

    def poke(self) -> None:
        """Ready work changed here (enqueued, back from backoff, leased): recount and deal.

        Counts of apps nobody polls for are dropped; the next poll recounts them. Every way a
        task becomes ready emits TaskEnqueued or TaskRequeued, and a lease TaskLeased, so
        the counts kept stay current; one that leaves the ready queue silently (canceled,
        expired) leaves a count too high until a grant comes back short (``deliver``)."""
        apps = self._pool.apps()
        for app in [a for a in self.ready if a not in apps]:
            del self.ready[app]
        for app in apps:
            self.refresh(app)
        self._pool.deal()

    def holding(self, tenant: str) -> int:
        """Leases of ``tenant`` live here, plus slots dealt or in flight for it."""
        dealt = sum(n for (_, t, _), (_, n) in self._dealt.items() if t == tenant)
        claimed = sum(r.capacity for _, r in self._claims.values() if r.tenants == [tenant])
        return self._p.leases.running[tenant] + dealt + claimed

    def assign(self, entry: Entry, tenant: str, lane: str) -> None:
        key = (entry.entry_id, tenant, lane)
        _, n = self._dealt.get(key, (entry, 0))
        self._dealt[key] = (entry, n + 1)

    def unclaim(self, entry_id: str) -> None:
        """Slots dealt to an entry that no longer wants them: the ready work is free again."""
        for key in [k for k in self._dealt if k[0] == entry_id]:
            _, n = self._dealt.pop(key)
            _, tenant, lane = key
            counts = self.ready.get(lane)
            if counts is not None:
                counts[tenant] = counts.get(tenant, 0) + n

    def wake(self) -> None:
        if self._dealt:
            self._poke.poke()

    def deliver(self, offer: Offer) -> None:
        claim = self._claims.pop(offer.request_id, None)
        if claim is None:
            return  # not ours (a replayed record of an earlier leader): leases lapse
        entry, request = claim
        leases = [self._lease(g, request.lease_ms) for g in offer.grants]
        self.granted += len(leases)
        self._p.leases.track_all(offer.grants, request.tenants[0])
        if len(leases) < request.capacity:
            self.refresh(request.app)  # fewer ready than counted: recount before dealing again
        self._pool.settled(entry, request.capacity, leases)

    def _lease(self, grant: Grant, lease_ms: int) -> Lease:
        tables = self._p.reader()
        task = tables.task(grant.task_id)
        payload = tables.payload(grant.task_id)
        assert task is not None and payload is not None
        return Lease(
            partition=self._p.partition,
            task_id=grant.task_id,
            lease_id=grant.lease_id,
            attempt=grant.attempt,
            lease_ms=lease_ms,
            tenant=task.tenant,
            app=task.app,
            queue=task.queue,
            task_type=task.task_type,
            payload=payload,
            checkpoint=task.checkpoint,
            start_to_close_ms=task.start_to_close_ms,
            # A first attempt has no committed steps yet: skip the scan on the hot path.
            steps=tables.steps(grant.task_id) if task.attempt > 1 else [],
            started_ms=task.leased_ms or 0,
            run_key=task.run_key or task.task_id,
            compensating=task.compensating,
        )

    def clear(self) -> None:
        for entry, n in self._dealt.values():
            if not (entry.closed or entry.answered):
                entry.remaining += n
        self._dealt.clear()
        self.ready.clear()
        claims, self._claims = list(self._claims.values()), {}
        for entry, request in claims:  # the grants may land, but this leader hands out none
            self._pool.settled(entry, request.capacity, [])
        self._pool.deal()

    async def run(self) -> None:
        while self._p.leader:
            await self._poke.wait(None)
            requests = self._requests()
            if not requests:
                continue
            try:
                offset = await self._p.propose(GrantLeases(requests=requests))
                await self._p.wait_applied(offset)
            except LogSealed:
                pass
            except TransientError as exc:  # nothing was written: hand the slots back
                self._release(requests)
                await back_off(self._p.clock, exc, f"partition {self._p.partition} dispatch")
            # Slots this partition could not fill went back to their entries: deal them again.
            self._pool.deal()

    def _release(self, requests: list[LeaseRequest]) -> None:
        """Claims whose GrantLeases was never written: their slots go back to the entries."""
        for request in requests:
            claim = self._claims.pop(request.request_id, None)
            if claim is not None:
                self._pool.settled(claim[0], request.capacity, [])

    def _requests(self) -> list[LeaseRequest]:
        requests = []
        for (entry_id, tenant, lane), (entry, n) in self._dealt.items():
            if entry.closed or entry.answered:
                continue
            lane_no = entry.lanes.index(lane)  # request ids stay printable and unique
            request = LeaseRequest(
                request_id=f"{entry_id}/{tenant}/{lane_no}/{self._p.partition}/{self._p.applied}",
                agent_id=entry.agent_id,
                app=lane,
                tenants=[tenant],
                queues=entry.queues,
                capacity=n,
                lease_ms=entry.lease_ms,
                app_version=entry.app_version,
            )
            entry.claimed += n
            self._claims[request.request_id] = (entry, request)
            requests.append(request)
        self._dealt.clear()
        return requests
