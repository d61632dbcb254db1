"""A job queued in a guest and killed just as the guest starts it (``conveyor.agents.pool``):
the withdraw crosses the "done" of the job ahead. The guest must not be taken for idle while it
runs the killed job, which waits for acks the agent no longer sends. The agent takes a killed
job still in line after a "done" as one the guest may have started, and kills the guest (the
guest's side, which answers a withdraw that came while the job ahead ran before that job's
"done": tests/unit/test_guest_serve.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import agent_app
from test_agent import alive, lines, rig, run, until
from test_agent_pipeline import pool_of

WEDGED_S = 10.0  # an echo takes milliseconds; a wedged guest never runs it


def block_until(what: str, check: Callable[[], bool]) -> None:
    """Wait without yielding to the event loop: the agent reads nothing from its guests."""
    deadline = time.monotonic() + 10.0
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def test_a_queued_job_killed_as_its_guest_starts_it_does_not_wedge_the_guest(
    tmp_path: Path,
) -> None:
    gate, marker = tmp_path / "open", tmp_path / "mark_then_step"

    async def main() -> None:
        async with rig(tmp_path, concurrency=1, prefetch=1) as r:
            pool = pool_of(r)
            await r.enqueue(agent_app.gate, {"open": str(gate)})
            await until(
                "the gate job to run", lambda: any(g.attempts for g in pool.guests.values())
            )
            queued = await r.enqueue(agent_app.mark_then_step, {"marker": str(marker)})
            await until(
                "the job to queue behind it",
                lambda: any(len(g.attempts) == 2 for g in pool.guests.values()),
            )
            (guest,) = pool.guests.values()
            # The gate job ends and the guest starts the queued one at once; the agent, which
            # has not read the gate job's "done" yet, kills it (as for a LOST heartbeat reply).
            gate.touch()
            block_until("the queued job to start", lambda: lines(marker) == ["started"])
            held = r.agent.running[queued]
            held.lost = True
            held.kill("the lease was lost")
            echo = await r.enqueue(agent_app.echo, "after")
            await until(
                "the next job to run", lambda: r.task(echo).finished_ms is not None, WEDGED_S
            )
            assert r.task(echo).status == "SUCCEEDED"
            # The killed job does not run on in the guest: the guest was killed.
            await until(
                "the guest that started the killed job to end", lambda: not alive(guest.pid)
            )

    run(main)
