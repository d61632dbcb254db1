"""Cancels pushed by the node: the agent's one long-poll for stops of the leases it holds.

A heartbeat answers CANCEL too, but only every ``heartbeat_s`` (~10 s). So the agent keeps ONE
``POST /worker/signals`` open beside its poll (``streams/processor/signals.py`` says why one per
agent and not per lease: no request per task, and it is open when every slot is busy, when no
poll is). The node answers it as soon as a lease of this agent is asked to stop; the agent asks
that attempt's handler to stop at once, exactly as a heartbeat's CANCEL would (the guest's
``ctx.cancelled`` turns true, the kill follows after the cancel grace).

Rule 1: a signal only hastens the heartbeat. It acts on the attempt running under the lease id
it names, nothing else; a signal for a lease not (or no longer) held here is dropped, and one
lost on the way is repeated by the lease's next heartbeat.
Rule 2: a node without the call (a 4xx: an older node) leaves the agent as it was: cancels
come with heartbeats. A failed call is retried after a pause, like a failed poll.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from conveyor.errors import ContractError, ConveyorError

log = logging.getLogger("conveyor.agent")

SIGNALS_WAIT_MS = 20_000  # how long one signals call waits for a cancel
RETRY_PAUSE_S = 1.0  # after a failed signals call
EMPTY_FAST_S = 0.005  # an empty answer sooner than this: pause, never spin
EMPTY_PAUSE_S = 0.05


@runtime_checkable
class SignalsAPI(Protocol):
    """The worker API's signals call (``HttpWorkerAPI``)."""

    async def signals(self, *, agent_id: str, app: str, wait_ms: int) -> list[tuple[str, int]]:
        """(task id, lease id) of this agent's leases asked to stop; [] after ``wait_ms``."""
        ...


async def listen(
    api: SignalsAPI,
    *,
    agent_id: str,
    app: str,
    stop: Callable[[str, int], None],
    wait_ms: int = SIGNALS_WAIT_MS,
) -> None:
    """Forever: wait for signals, ``stop(task id, lease id)`` for each (rule 1)."""
    while True:
        started = time.monotonic()
        try:
            got = await api.signals(agent_id=agent_id, app=app, wait_ms=wait_ms)
        except ContractError as exc:  # rule 2: this node cannot push cancels
            log.warning("cancels come with heartbeats only: the node refused signals: %s", exc)
            await asyncio.Future()  # park: the agent's loops never return
            return
        except ConveyorError as exc:
            log.warning("signals call failed: %s; retrying", exc)
            await asyncio.sleep(RETRY_PAUSE_S)
            continue
        for task_id, lease_id in got:
            stop(task_id, lease_id)
        if not got and time.monotonic() - started < EMPTY_FAST_S:
            await asyncio.sleep(EMPTY_PAUSE_S)
