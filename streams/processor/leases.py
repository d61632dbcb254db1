"""Live leases and heartbeats, in the leader's memory (a leader duty).

Heartbeats never touch the log. The leader keeps a deadline per live lease; a heartbeat pushes
it out; a lease past its deadline is proposed as ExpireLeases. A new leader starts every lease
it finds in the ``leased`` index with a fresh interval from its takeover.

A cancel marks the lease (its heartbeats answer CANCEL) and is pushed to its agent at once
through ``signals`` (``signals.py``), when the node gave the tracker one.
"""

from __future__ import annotations

from dataclasses import dataclass

from conveyor.errors import TransientError
from conveyor.schemas.types import ExpireLeases, LeaseRef
from conveyor.store.tables import Tables
from conveyor.streams.log.api import LogSealed
from conveyor.streams.machine import Grant
from conveyor.streams.processor.duties import Partition
from conveyor.streams.processor.signals import CancelSignals
from conveyor.streams.processor.slots import SlotLedger
from conveyor.streams.processor.waiting import Poke, back_off

CONTINUE, CANCEL, LOST = "CONTINUE", "CANCEL", "LOST"
TICK_MAX_MS = 1_000.0  # the longest the duty sleeps between looks for lapsed leases


@dataclass(slots=True)
class Live:
    lease_id: int
    lease_ms: int
    deadline_ms: float
    tenant: str
    cancel: bool = False
    expiring: bool = False


class LeaseTracker:
    """The live leases of one partition while it leads. Each is counted in the node's slot
    ledger too (``slots.py``: the concurrency caps read the leases per tenant there)."""

    def __init__(self, partition: Partition, ledger: SlotLedger, lease_ms: int) -> None:
        self._p = partition
        self._ledger = ledger
        self._lease_ms = lease_ms  # for a lease taken over that never said its interval
        self.live: dict[str, Live] = {}
        self._poke = Poke(partition.clock)
        self.expired = 0
        self.signals: CancelSignals | None = None  # the node's, set when it builds the processor

    def track_all(self, grants: list[Grant], tenant: str) -> None:
        now = self._p.clock.monotonic_ms()
        for g in grants:
            self._add(g.task_id, Live(g.lease_id, g.lease_ms, now + g.lease_ms, tenant))
        if any(g.lease_ms < TICK_MAX_MS for g in grants):
            self._poke.poke()  # it may sleep past this lease's end: plan the wake again

    def _add(self, task_id: str, live: Live) -> None:
        self.live[task_id] = live
        self._ledger.lease_on(self._p.partition, task_id, live.tenant)

    def take_over(self, tables: Tables) -> None:
        """Every running lease restarts with its own interval (the one its agent asked for)."""
        now = self._p.clock.monotonic_ms()
        for task_id, lease_id, interval in tables.leased():
            lease_ms = interval or self._lease_ms
            task = tables.task(task_id)
            cancel = task is not None and task.cancel_cause is not None
            tenant = task.tenant if task is not None else ""
            self._add(task_id, Live(lease_id, lease_ms, now + lease_ms, tenant, cancel=cancel))

    def forget(self, task_id: str, lease_id: int) -> str | None:
        """Drop a lease that ended; its tenant, if it was live."""
        live = self.live.get(task_id)
        if live is None or live.lease_id != lease_id:
            return None
        del self.live[task_id]
        self._ledger.lease_off(self._p.partition, task_id)
        return live.tenant

    def mark_cancel(self, task_id: str, lease_id: int) -> None:
        live = self.live.get(task_id)
        if live is not None and live.lease_id == lease_id:
            live.cancel = True
            task = self._p.reader().task(task_id) if self.signals is not None else None
            if self.signals is not None and task is not None:
                self.signals.post(task.tenant, task.app, task.agent_id, task_id, lease_id)

    def heartbeat(self, task_id: str, lease_id: int) -> str:
        """CONTINUE, CANCEL (stop and report), or LOST (the lease is not yours: drop it)."""
        live = self.live.get(task_id)
        if not self._p.leader or live is None or live.lease_id != lease_id or live.expiring:
            return LOST
        live.deadline_ms = self._p.clock.monotonic_ms() + live.lease_ms
        return CANCEL if live.cancel else CONTINUE

    def clear(self) -> None:
        self.live.clear()
        self._ledger.leases_off(self._p.partition)

    async def run(self) -> None:
        while self._p.leader:
            now = self._p.clock.monotonic_ms()
            lapsed = [
                (task_id, live)
                for task_id, live in self.live.items()
                if live.deadline_ms <= now and not live.expiring
            ]
            if lapsed:
                for _, live in lapsed:
                    live.expiring = True
                refs = [LeaseRef(task_id=t, lease_id=live.lease_id) for t, live in lapsed]
                try:
                    await self._p.propose(ExpireLeases(items=refs))
                    self.expired += len(refs)
                except LogSealed:
                    pass
                except TransientError as exc:  # nothing was written: propose them again
                    for _, live in lapsed:
                        live.expiring = False
                    await back_off(self._p.clock, exc, f"partition {self._p.partition} leases")
            await self._poke.wait(self._tick_ms())

    def _tick_ms(self) -> float:
        if not self.live:
            return TICK_MAX_MS
        soonest = min(live.deadline_ms for live in self.live.values())
        return max(10.0, min(TICK_MAX_MS, soonest - self._p.clock.monotonic_ms()))
