"""Pipelining (``GuestPool(pipeline=True)``, what an agent with ``prefetch`` runs): a busy guest
holds a few queued jobs. The rules of ``conveyor.agents.pool`` for a queued job, with real guests
and an in-process Node: a kill (here the start_to_close of a job that never started) takes it
back and spares the guest; a guest killed with a queued job fails both attempts visibly, the
queued one as not started, and both are retried; a queued job moves to a guest that frees up.
(A cancel of a queued job: ``test_agent_prefetch``.)"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import agent_app
from test_agent import TENANT, Rig, alive, lines, rig, run, until

from conveyor.agents.pool import GuestPool


def pool_of(r: Rig) -> GuestPool:
    executor = r.agent.executor
    assert isinstance(executor, GuestPool) and executor.queued_max > 0
    return executor


def test_a_queued_job_past_its_deadline_is_taken_back_and_the_guest_spared(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "wait_cancel"

    async def main() -> None:
        async with rig(tmp_path, concurrency=1, prefetch=1) as r:
            pool = pool_of(r)
            waits = await r.enqueue(agent_app.wait_cancel, {"marker": str(marker)})
            await until("the handler to start", lambda: lines(marker) == ["started"])
            stubborn = await r.enqueue(agent_app.stubborn, {"marker": str(tmp_path / "s")})
            await until(
                "the second job to queue in the guest",
                lambda: any(len(g.attempts) == 2 for g in pool.guests.values()),
            )
            (guest,) = pool.guests.values()
            task = await r.finished(stubborn)
            assert task.status == "FAILED" and task.error_class == "StartToCloseTimeout"
            assert not lines(tmp_path / "s")  # it never started
            assert alive(guest.pid) and lines(marker) == ["started"]  # the guest was spared
            await r.node.cancel(TENANT, waits, "the test is done")
            assert (await r.finished(waits)).status == "CANCELED"
            assert lines(marker) == ["started", "saw cancel"]

    run(main)


def test_a_guest_killed_with_a_queued_job_fails_both_and_both_retry(tmp_path: Path) -> None:
    marker = tmp_path / "die_once"

    async def main() -> None:
        async with rig(tmp_path, concurrency=1, prefetch=1) as r:
            pool = pool_of(r)
            dies = await r.enqueue(agent_app.die_once, {"marker": str(marker)})
            await until("the guest to start the task", lambda: bool(lines(marker)))
            echo = await r.enqueue(agent_app.echo, "queued")
            await until(
                "the echo to queue in the guest",
                lambda: any(len(g.attempts) == 2 for g in pool.guests.values()),
            )
            os.kill(int(lines(marker)[0].split()[1]), signal.SIGKILL)
            for task_id in (dies, echo):
                task = await r.finished(task_id)
                assert task.status == "SUCCEEDED" and task.attempt == 2
            (running,) = r.node.tables(r.node.partition_of(dies)).attempts(dies)
            assert running.error_class == "GuestCrashed" and "SIGKILL" in (
                running.error_message or ""
            )
            (queued,) = r.node.tables(r.node.partition_of(echo)).attempts(echo)
            assert queued.error_class == "GuestCrashed"
            assert "before this attempt started" in (queued.error_message or "")
            # Only the running job counts as a crash of its task type.
            assert not r.agent.breakers["echo"].crashes

    run(main)


def test_a_queued_job_moves_to_a_guest_that_frees_up(tmp_path: Path) -> None:
    markers = [tmp_path / "wait_cancel_0", tmp_path / "wait_cancel_1"]

    async def main() -> None:
        async with rig(tmp_path, concurrency=2, prefetch=2) as r:
            pool = pool_of(r)
            waits = []
            for m in markers:
                waits.append(await r.enqueue(agent_app.wait_cancel, {"marker": str(m)}))
            await until("both handlers to start", lambda: all(lines(m) for m in markers))
            echo = await r.enqueue(agent_app.echo, "moved")
            await until(
                "the echo to queue in a guest",
                lambda: any(len(g.attempts) == 2 for g in pool.guests.values()),
            )
            (busy,) = [g for g in pool.guests.values() if len(g.attempts) == 2]
            behind = busy.attempts[0].job.task_id
            other = next(t for t in waits if t != behind)
            await r.node.cancel(TENANT, other, "free the other guest")
            task = await r.finished(echo)  # long before ``behind`` ends (it waits 60 s)
            assert task.status == "SUCCEEDED" and task.attempt == 1
            assert r.task(behind).finished_ms is None
            await r.node.cancel(TENANT, behind, "the test is done")
            assert (await r.finished(behind)).status == "CANCELED"

    run(main)


def test_jobs_queued_behind_a_slow_one_run_elsewhere_while_it_runs(tmp_path: Path) -> None:
    marker = tmp_path / "wait_cancel"

    async def main() -> None:
        async with rig(tmp_path, concurrency=2, prefetch=8) as r:
            pool = pool_of(r)
            slow = await r.enqueue(agent_app.wait_cancel, {"marker": str(marker)})
            await until("the slow handler to start", lambda: lines(marker) == ["started"])
            (slow_guest,) = [g for g in pool.guests.values() if g.attempts]
            echoes = [await r.enqueue(agent_app.echo, n) for n in range(12)]
            for task_id in echoes:  # long before the slow one ends (it waits 60 s)
                task = await r.finished(task_id)
                assert task.status == "SUCCEEDED" and task.attempt == 1
            assert [s.job.task_id for s in slow_guest.attempts] == [slow]
            await r.node.cancel(TENANT, slow, "the test is done")
            assert (await r.finished(slow)).status == "CANCELED"

    run(main)


def test_a_burst_starts_no_more_guests_than_the_concurrency(tmp_path: Path) -> None:
    """More jobs than running and queued guests hold while guests are still starting: the
    launches beyond that wait for room; none starts a guest past ``concurrency``."""

    async def main() -> None:
        async with rig(tmp_path, concurrency=3, prefetch=9) as r:
            pool = pool_of(r)
            most = 0

            def all_done() -> bool:
                nonlocal most
                most = max(most, len(pool.guests))
                return all(r.task(t).finished_ms is not None for t in burst)

            burst = [await r.enqueue(agent_app.echo, i) for i in range(24)]
            await until("the burst to finish", all_done)
            assert {r.task(t).status for t in burst} == {"SUCCEEDED"}
            assert most <= 3 and pool.spawned <= 3

    run(main)
