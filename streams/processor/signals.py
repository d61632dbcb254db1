"""Cancel signals: a cancel pushed to the agent that holds the lease, within a round trip.

A heartbeat answers CANCEL, but an agent heartbeats every ~10 s, so a cancel waited up to a
heartbeat interval before the handler's ``ctx.cancelled`` turned true (a 10 s task canceled at
2 s ran to its end and SUCCEEDED). Here each agent keeps ONE long-poll open,
``POST /worker/signals``, that answers as soon as a lease it holds is asked to stop.

Why one call per agent, keyed by the agent's id, and not one per lease, nor the leases riding
on the poll:
- the hot path pays nothing: no request per task, no lease list to send. A lease's holder is
  already known to the partition (``Task.agent_id``, written with the grant), so a cancel finds
  its agent's box without the agent saying which leases it holds;
- a poll is not always open: an agent whose slots are all busy does not poll, and that is
  exactly when its running tasks get canceled. The signals call is open whatever the load;
- it works the same on an embedded node (``conveyor dev``, ``conveyor.testing``): the box lives
  in the node's memory beside the waiting pool, nothing crosses the log.

Rule 1 (an accelerator, never the source of truth): a signal says only "ask this lease's
handler to stop", what a heartbeat answering CANCEL says. A signal lost (the reply dropped in
transit, the agent restarting, a node change) costs nothing but time: the lease's next
heartbeat still answers CANCEL (``leases.py``), as it always did.
Rule 2 (bounded): a box is kept only for an agent that called in the last ``BOX_KEEP_MS``
(signals for an agent that never listens are dropped at once: its heartbeats carry them), and
holds at most ``PENDING_MAX`` signals (the oldest are dropped, rule 1).
Rule 3 (scoped): a box is keyed by (tenant, app, agent id): an agent that names another's
agent id reads only the cancels of its own tenant's app (the one its key serves), never another
tenant's or app's task ids.
Rule 4 (fenced where it lands): a signal carries the lease id; the agent acts on it only for the
attempt it runs under that lease (``agents/signals.py``).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from conveyor.streams.clock import Clock

BOX_KEEP_MS = 60_000.0  # a box outlives its agent's last call by this long
PENDING_MAX = 10_000  # signals a box holds between two calls of its agent
SWEEP_EVERY_MS = 5_000.0

BoxKey = tuple[str, str, str]  # (tenant, app, agent id)
Signal = tuple[str, int]  # (task id, lease id): asked to stop


@dataclass(slots=True)
class _Box:
    seen_ms: float
    pending: list[Signal] = field(default_factory=list)
    waiters: list[asyncio.Future[None]] = field(default_factory=list)


class CancelSignals:
    """The node's signal boxes. ``post`` from a processor after the cancel's commit; ``wait``
    from the gateway's signals call."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._boxes: dict[BoxKey, _Box] = {}
        self._swept_ms = 0.0
        self.posted = 0  # signals that reached a box (a listening agent)

    def __len__(self) -> int:
        return len(self._boxes)

    def post(
        self, tenant: str, app: str, agent_id: str | None, task_id: str, lease_id: int
    ) -> None:
        """The lease ``lease_id`` of ``task_id`` (of ``app``), held by ``agent_id``, is asked
        to stop."""
        box = None if agent_id is None else self._boxes.get((tenant, app, agent_id))
        if box is None:
            return  # rule 2: not listening; its heartbeat says CANCEL
        box.pending.append((task_id, lease_id))
        if len(box.pending) > PENDING_MAX:
            del box.pending[: len(box.pending) - PENDING_MAX]
        self.posted += 1
        for waiter in box.waiters:
            if not waiter.done():
                waiter.set_result(None)

    async def wait(self, tenant: str, app: str, agent_id: str, wait_ms: float) -> list[Signal]:
        """The signals for the agent: at once if some are pending, else the first to come
        within ``wait_ms``; [] when none came."""
        now = self._clock.monotonic_ms()
        self._sweep(now)
        box = self._boxes.setdefault((tenant, app, agent_id), _Box(seen_ms=now))
        box.seen_ms = now
        if not box.pending and wait_ms > 0:
            waiter = asyncio.get_running_loop().create_future()
            box.waiters.append(waiter)
            sleeper = asyncio.ensure_future(self._clock.sleep_ms(wait_ms))
            try:
                await asyncio.wait([waiter, sleeper], return_when=asyncio.FIRST_COMPLETED)
            finally:
                sleeper.cancel()
                box.waiters.remove(waiter)
                box.seen_ms = self._clock.monotonic_ms()
        taken, box.pending = box.pending, []
        return taken

    def _sweep(self, now: float) -> None:
        if now - self._swept_ms < SWEEP_EVERY_MS:
            return
        self._swept_ms = now
        stale = [
            key
            for key, box in self._boxes.items()
            if not box.waiters and now - box.seen_ms > BOX_KEEP_MS
        ]
        for key in stale:
            del self._boxes[key]
