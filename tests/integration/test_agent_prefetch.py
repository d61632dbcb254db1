"""The host agent's ``prefetch``: leases held beyond the guests wait for a guest, and a lease
canceled while it waits ends CANCELED without ever starting (real guests, in-process Node)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import agent_app
import pytest
from test_agent import TENANT, lines, rig, until

from conveyor.agents.host import HostAgent
from conveyor.streams.node import Node
from conveyor.streams.routing import partition_of

pytestmark = pytest.mark.timeout(120)

DRAIN_S = 6.0  # what a stopping agent gives its running attempts in the release test


@contextlib.asynccontextmanager
async def held(
    tmp_path: Path, tasks: int = 3, drain_s: float = 0.0, *, fresh_process: bool = False
) -> AsyncIterator[tuple[Node, HostAgent, list[str], list[Path]]]:
    """An agent with one guest and ``tasks`` - 1 leases held beyond it, holding ``tasks``
    ``wait_cancel`` tasks, one of them started: (node, agent, task ids, their markers). Past
    the guest's queue (``pool.QUEUED_PER_GUEST``) a held lease waits for a slot of the agent's;
    with ``fresh_process`` there is no guest queue and every held lease does."""
    markers = [tmp_path / f"wait_cancel_{i}" for i in range(tasks)]
    opts = {"concurrency": 1, "prefetch": tasks - 1, "fresh_process": fresh_process}
    async with rig(tmp_path, drain_s=drain_s, **opts) as r:
        ids = [await r.enqueue(agent_app.wait_cancel, {"marker": str(m)}) for m in markers]
        await until("every lease held", lambda: len(r.agent.running) == tasks)
        await until("one handler to start", lambda: any(lines(m) for m in markers))
        assert sum(bool(lines(m)) for m in markers) == 1  # one guest: one at a time
        yield r.node, r.agent, ids, markers


def test_prefetched_leases_wait_for_the_guest_and_a_cancel_stops_them_before_they_start(
    tmp_path: Path,
) -> None:
    async def main() -> None:
        async with held(tmp_path) as (node, agent, ids, markers):
            # The waiting ones first, and the running one once the agent knows of those (it
            # learns cancels per heartbeat, and each partition answers for its own tasks).
            started = [t for t, m in zip(ids, markers, strict=True) if lines(m)]
            waiting = [t for t in ids if t not in started]
            for task_id in waiting:
                await node.cancel(TENANT, task_id, "the test is done")
            await until(
                "the agent to learn both cancels",
                lambda: all(agent.running[t].stop_reason == "CANCEL" for t in waiting),
            )
            for task_id in started:
                await node.cancel(TENANT, task_id, "the test is done")
            await until(
                "every task to end",
                lambda: all(node.get(TENANT, t).finished_ms is not None for t in ids),
            )
            assert {node.get(TENANT, t).status for t in ids} == {"CANCELED"}
            assert sum(bool(lines(m)) for m in markers) == 1  # the waiting two never started

    asyncio.run(main())


def test_an_adapted_prefetch_grows_past_the_guests_for_fast_work_and_holds_every_lease_to_its_end(
    tmp_path: Path,
) -> None:
    """``prefetch=None`` (what ``conveyor agent`` runs): fast tasks make the agent hold more
    leases than a fixed prefetch of its floor ever would, and every one of them succeeds."""

    async def main() -> None:
        async with rig(tmp_path, concurrency=2, prefetch=None) as r:
            assert r.agent.prefetch.floor == 2
            ids = await r.enqueue_many([(agent_app.echo, i) for i in range(3_000)])
            peak = 0

            def ended() -> bool:
                nonlocal peak
                peak = max(peak, len(r.agent.running))
                return all(r.task(t).finished_ms is not None for t in ids)

            await until("every task to end", ended)
            assert {r.task(t).status for t in ids} == {"SUCCEEDED"}
            assert peak > 2 + 2  # past what a fixed prefetch of 2 holds beside 2 guests

    asyncio.run(main())


@pytest.mark.parametrize("fresh_process", [False, True])
def test_a_stopping_agent_hands_back_the_leases_it_never_started_without_spending_attempts(
    tmp_path: Path, fresh_process: bool
) -> None:
    """Held (prefetched) leases are released when the agent stops: their tasks are ready again
    at once under attempt 1 with no attempt recorded, instead of failing an attempt they never
    ran (with ``attempts=1`` that was a FAILED task)."""

    async def main() -> None:
        async with held(tmp_path, 6, DRAIN_S, fresh_process=fresh_process) as (
            node,
            agent,
            ids,
            markers,
        ):
            (started,) = [t for t, m in zip(ids, markers, strict=True) if lines(m)]
            # In the guest's queue (3) or waiting for a slot (2; all 5 with fresh processes).
            waiting = [t for t in ids if t != started]
            stopped = asyncio.get_running_loop().time()
            agent.stop()
            # Handed back at once, while the running one still has its drain.
            await until(
                "the held leases' release",
                lambda: all(node.get(TENANT, t).status == "ENQUEUED" for t in waiting),
            )
            assert asyncio.get_running_loop().time() - stopped < DRAIN_S / 2
            assert node.get(TENANT, started).status == "LEASED"
            await until("the drain to end", lambda: node.get(TENANT, started).status != "LEASED")
            for task_id in ids:
                info = node.get(TENANT, task_id)
                if task_id == started:  # killed after the drain: a failed attempt, retried
                    assert info.status == "RETRY_WAIT" and info.attempt == 2, info
                    continue
                assert info.status == "ENQUEUED" and info.attempt == 1, info
                assert info.error_class is None, info
                tables = node.tables(partition_of(task_id, node.partitions))
                assert tables.attempts(task_id) == []
            assert sum(bool(lines(m)) for m in markers) == 1  # the held ones never started

    asyncio.run(main())
