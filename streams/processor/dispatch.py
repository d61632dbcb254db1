"""Waiting agents and the GrantLeases proposer (a leader duty).

Agents long-poll the node with a capacity. Their requests wait in one ``WaitingPool`` per node.
Each partition's ``Dispatcher`` claims a share of the waiting capacity whenever it may have
ready work (a task was enqueued or came back from backoff, or a new request arrived) and
proposes ONE GrantLeases record for all its claims. The state machine picks tasks fairly; the
offers come back as actions after the batch is committed, and only then reach the agent.

Rule: a request is answered only when none of its claims is in flight, so no granted lease is
ever stranded in a request that already returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conveyor.schemas.types import GrantLeases, LeaseRequest
from conveyor.streams.clock import Clock
from conveyor.streams.log.api import LogSealed
from conveyor.streams.machine import Grant, Offer
from conveyor.streams.processor.waiting import Poke

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
    in_flight: int = 0
    closed: bool = False  # the poll timed out: answer as soon as nothing is in flight
    leases: list[Lease] = field(default_factory=list)

    def settle(self) -> None:
        if self.in_flight == 0 and (self.leases or self.closed) and not self.future.done():
            self.future.set_result(self.leases)


class WaitingPool:
    """The long-polls waiting at one node, shared by its partitions' dispatchers."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.entries: dict[str, Entry] = {}
        self.dispatchers: list[Dispatcher] = []
        self._ids = itertools.count()

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
    ) -> list[Lease]:
        """Up to ``capacity`` leases from any partition, or none after ``wait_ms``."""
        entry = Entry(
            entry_id=f"{agent_id}/{next(self._ids)}",
            agent_id=agent_id,
            app=app,
            tenants=tenants,
            queues=queues,
            capacity=capacity,
            lease_ms=lease_ms,
            remaining=capacity,
            future=asyncio.get_running_loop().create_future(),
        )
        self.entries[entry.entry_id] = entry
        for dispatcher in self.dispatchers:
            dispatcher.poke(new_request=True)
        try:
            return await asyncio.wait_for(asyncio.shield(entry.future), wait_ms / 1000)
        except TimeoutError:
            entry.remaining = 0  # no new claims; wait out the ones in flight
            entry.closed = True
            entry.settle()
            return await entry.future
        finally:
            self.entries.pop(entry.entry_id, None)

    def active(self) -> int:
        return max(1, sum(1 for d in self.dispatchers if d.maybe_ready))

    def claim(self) -> list[tuple[Entry, LeaseRequest]]:
        claims = []
        active = self.active()
        for entry in self.entries.values():
            if entry.remaining <= 0 or entry.future.done():
                continue
            n = min(entry.remaining, -(-entry.capacity // active))
            entry.remaining -= n
            entry.in_flight += 1
            request = LeaseRequest(
                request_id=entry.entry_id,
                agent_id=entry.agent_id,
                app=entry.app,
                tenants=entry.tenants,
                queues=entry.queues,
                capacity=n,
                lease_ms=entry.lease_ms,
            )
            claims.append((entry, request))
        return claims


class Dispatcher:
    def __init__(self, processor: PartitionProcessor, pool: WaitingPool) -> None:
        self._p = processor
        self._pool = pool
        self._poke = Poke(processor.clock)
        self.maybe_ready = True
        self._claims: dict[str, tuple[Entry, LeaseRequest]] = {}
        self.granted = 0
        pool.dispatchers.append(self)

    def poke(self, *, new_request: bool = False) -> None:
        if not new_request:
            self.maybe_ready = True
        self._poke.poke()

    def deliver(self, offer: Offer) -> None:
        claim = self._claims.pop(offer.request_id, None)
        if claim is None:
            return  # not ours (a replayed record of an earlier leader): leases lapse
        entry, request = claim
        entry.in_flight -= 1
        if len(offer.grants) == request.capacity:
            self.maybe_ready = True  # it had at least that much: there may be more
        if not entry.future.done():
            entry.remaining += request.capacity - len(offer.grants)
            entry.leases.extend(self._lease(g, request.lease_ms) for g in offer.grants)
        self.granted += len(offer.grants)
        self._p.leases.track_all(offer.grants)
        entry.settle()

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
        )

    def clear(self) -> None:
        for entry, _ in self._claims.values():
            entry.in_flight -= 1
            entry.settle()
        self._claims.clear()

    async def run(self) -> None:
        while self._p.leader:
            await self._poke.wait(None)
            if not self.maybe_ready or not self._pool.entries:
                continue
            claims = self._pool.claim()
            if not claims:
                continue
            self.maybe_ready = False
            for entry, request in claims:
                self._claims[request.request_id] = (entry, request)
            with contextlib.suppress(LogSealed):
                offset = await self._p.propose(GrantLeases(requests=[r for _, r in claims]))
                await self._p.wait_applied(offset)
            if self.maybe_ready and self._pool.entries:
                self._poke.poke()
