"""The GrantLeases proposer (a leader duty).

Each partition's ``Dispatcher`` claims the slots the node's waiting pool (``pool.py``) dealt to
it whenever it may have ready work (a task was enqueued or came back from backoff, or a new
request arrived) and proposes ONE GrantLeases record for all its claims. The state machine
picks tasks fairly; the offers come back as actions after the batch is committed, and only
then reach the agents, through the pool.

Ready work is counted per (lane, tenant, task type), so the pool deals a slot only where a
ready task of a type the poll serves waits, and each LeaseRequest names the types the machine
may take for it (the poll's types that have ready work here: a few names, not the agent's
whole list).

The slots themselves (dealt here and not proposed, claimed in a record not yet applied) are
counted by the node's slot ledger (``slots.py``); the dispatcher reaches its partition through
the ``Partition`` protocol (``duties.py``) and the live leases through its ``LeaseTracker``.
"""

from __future__ import annotations

from conveyor.errors import InvariantError, TransientError
from conveyor.schemas.types import GrantLeases, LeaseRequest
from conveyor.streams.log.api import LogSealed
from conveyor.streams.machine import Grant, Offer
from conveyor.streams.processor.duties import Partition
from conveyor.streams.processor.leases import LeaseTracker
from conveyor.streams.processor.pool import ReadyCounts, WaitingPool
from conveyor.streams.processor.slots import Entry, Lease
from conveyor.streams.processor.waiting import Poke, back_off

READY_PEEK = 64  # ready tasks counted per (partition, lane, tenant, type): enough for a round


class Dispatcher:
    def __init__(self, partition: Partition, pool: WaitingPool, leases: LeaseTracker) -> None:
        self._p = partition
        self._pool = pool
        self._ledger = pool.ledger
        self._leases = leases
        self._poke = Poke(partition.clock)
        self._ready: ReadyCounts = {}
        self.granted = 0
        pool.register(self)

    @property
    def ready(self) -> ReadyCounts:
        """lane -> tenant -> task type -> ready tasks here (up to READY_PEEK, minus the slots
        dealt here)."""
        return self._ready

    @property
    def leading(self) -> bool:
        return self._p.leader

    @property
    def partition(self) -> int:
        return self._p.partition

    def touch(self, lease: Lease) -> None:
        """A late lease reached its agent: its interval starts now (``mailbox.py`` rule 4)."""
        self._leases.heartbeat(lease.task_id, lease.lease_id)

    def holds(self, lease: Lease) -> bool:
        """The lease is live here: granted by this leader, not ended, not expiring."""
        live = self._leases.live.get(lease.task_id)
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
            tenant: {t: min(READY_PEEK, n) for t, n in tables.ready_types(lane, tenant).items()}
            for tenant in tables.ready_tenants(lane)
        }
        for _, tenant, dealt_lane, task_type, n in self._ledger.dealt(self._p.partition):
            by_type = counts.get(tenant) if dealt_lane == lane else None
            if by_type is not None and task_type in by_type:
                by_type[task_type] -= n
        self._ready[lane] = counts

    def poke(self) -> None:
        """Ready work changed here (enqueued, back from backoff, leased): recount and deal.

        Counts of apps nobody polls for are dropped; the next poll recounts them. Every way a
        task becomes ready emits TaskEnqueued or TaskRequeued, and a lease TaskLeased, so
        the counts kept stay current; one that leaves the ready queue silently (canceled,
        expired) leaves a count too high until a grant comes back short (``deliver``)."""
        apps = self._pool.apps()
        for app in [a for a in self._ready if a not in apps]:
            del self._ready[app]
        for app in apps:
            self.refresh(app)
        self._pool.deal()

    def hand_back(self, tenant: str, lane: str, task_type: str, n: int) -> None:
        """``n`` slots dealt here and never proposed: their ready tasks count as ready again
        (dealing took them off the count, and no grant will bring a recount for them)."""
        counts = self._ready.get(lane)
        if counts is not None:
            by_type = counts.setdefault(tenant, {})
            by_type[task_type] = by_type.get(task_type, 0) + n

    def wake(self) -> None:
        if self._ledger.has_dealt(self._p.partition):
            self._poke.poke()

    def deliver(self, offer: Offer) -> None:
        request = self._ledger.request(self._p.partition, offer.request_id)
        if request is None:
            return  # not ours (a replayed record of an earlier leader): leases lapse
        leases = [self._lease(g, request.lease_ms) for g in offer.grants]
        self.granted += len(leases)
        self._leases.track_all(offer.grants, request.tenants[0])
        if len(leases) < request.capacity:
            self.refresh(request.app)  # fewer ready than counted: recount before dealing again
        self._pool.settled(self._p.partition, offer.request_id, leases)

    def _lease(self, grant: Grant, lease_ms: int) -> Lease:
        tables = self._p.reader()
        task = tables.task(grant.task_id)
        payload = tables.payload(grant.task_id)
        if task is None or payload is None:
            raise InvariantError(f"granted task {grant.task_id} has no row or no payload")
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
            trace_context=tables.trace_context(grant.task_id),
        )

    def clear(self) -> None:
        """Stepped down: the slots dealt here go back to their polls, the claims in flight
        are settled empty (the grants may land, but this leader hands out none)."""
        partition = self._p.partition
        self._ledger.undeal(partition=partition)
        self._ready.clear()
        for _, request in self._ledger.claims(partition):
            self._pool.settled(partition, request.request_id, [])
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
        """Claims whose GrantLeases was never written: their slots go back to the entries,
        and their ready tasks back to the count (``_hand_back``). Left off it, a partition
        with no more events never dealt them again. Not on a halted partition (its record
        may be written but is never applied): it would only draw more slots to grant none."""
        for request in requests:
            if self._ledger.request(self._p.partition, request.request_id) is not None:
                self._pool.settled(self._p.partition, request.request_id, [])
                if self._p.halted is None:
                    self.refresh(request.app)  # their tasks are still ready in committed state

    def _requests(self) -> list[LeaseRequest]:
        requests = []
        # No entry here is closed or answered: pool._close and pool._answer unclaim first.
        for (entry_id, tenant, lane), (entry, n, dealt) in self._grouped().items():
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
                task_types=self._types_for(entry, tenant, lane, dealt),
            )
            self._ledger.claim(self._p.partition, entry, request)
            requests.append(request)
        return requests

    def _grouped(self) -> dict[tuple[str, str, str], tuple[Entry, int, set[str]]]:
        """The slots dealt per (entry, tenant, lane), and the types they were counted on: one
        request each, in which the machine picks by priority, then age, across the types."""
        grouped: dict[tuple[str, str, str], tuple[Entry, int, set[str]]] = {}
        for entry, tenant, lane, task_type, n in self._ledger.dealt(self._p.partition):
            _, before, types = grouped.get((entry.entry_id, tenant, lane), (entry, 0, set()))
            types.add(task_type)
            grouped[(entry.entry_id, tenant, lane)] = (entry, before + n, types)
        return grouped

    def _types_for(self, entry: Entry, tenant: str, lane: str, dealt: set[str]) -> list[str] | None:
        """The types a request of ``entry`` may take: those it serves with ready work here
        (None: it serves any)."""
        if entry.task_types is None:
            return None
        ready = self._ready.get(lane, {}).get(tenant, {})
        return sorted(dealt | {t for t in ready if t in entry.task_types})
