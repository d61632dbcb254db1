"""Concurrent async attempts in one guest (``@app.task(concurrency=N)``): the rules in
``conveyor.agents.pool``, with real guests and an in-process Node. Attempts of a concurrent type
pack into one guest and run side by side; a sync handler still runs alone in a guest of its
own; a cancel reaches its own coroutine only; a kill cancels the one coroutine, or, when it
holds the loop, kills the guest and the attempts beside it are retried."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import concurrent_app
from test_agent import TENANT, Rig, alive, lines, rig, run, until

from conveyor.agents.pool import GuestPool
from conveyor.schemas.types import Task

APP_REF = "concurrent_app:app"


def result(task: Task) -> Any:
    return json.loads(task.result) if isinstance(task.result, bytes) else task.result


def pool_of(r: Rig) -> GuestPool:
    executor = r.agent.executor
    assert isinstance(executor, GuestPool)
    return executor


def test_eight_sleeps_share_one_guest_and_take_about_one_sleep(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF, concurrency=8) as r:
            began = time.monotonic()
            ids = await r.enqueue_many([(concurrent_app.nap, 1.0)] * 8)
            tasks = [await r.finished(task_id) for task_id in ids]
            took = time.monotonic() - began
            print(f"8 x asyncio.sleep(1) at concurrency 8 in one guest: {took:.2f} s")
            assert all(t.status == "SUCCEEDED" for t in tasks)
            assert took < 3.0, f"8 sleeps of 1 s took {took:.2f} s: they did not overlap"
            results = [result(t) for t in tasks]
            assert len({res["pid"] for res in results}) == 1  # one guest ran them all
            assert len({res["loop"] for res in results}) == 1  # on its one event loop
            assert pool_of(r).spawned == 1

    run(main)


def test_a_sync_handler_runs_alone_in_a_guest_of_its_own(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF, concurrency=4) as r:
            naps = await r.enqueue_many([(concurrent_app.nap, 3.0)] * 3)
            await until(
                "the naps to run side by side",
                lambda: any(len(g.running()) == 3 for g in pool_of(r).guests.values()),
            )
            sync = await r.finished(await r.enqueue(concurrent_app.sync_nap, 0.2))
            assert sync.status == "SUCCEEDED"
            naps_done = [await r.finished(task_id) for task_id in naps]
            # It did not wait behind the naps: it ran at once, in another process.
            assert sync.finished_ms is not None
            assert all(sync.finished_ms < (t.finished_ms or 0) for t in naps_done)
            (nap_pid,) = {result(t)["pid"] for t in naps_done}
            assert result(sync)["pid"] != nap_pid

    run(main)


def test_a_cancel_reaches_its_own_coroutine_only(tmp_path: Path) -> None:
    release = tmp_path / "release"
    markers = [tmp_path / f"m{i}" for i in range(3)]

    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF, concurrency=4) as r:
            payloads = [{"marker": str(m), "release": str(release)} for m in markers]
            ids = await r.enqueue_many([(concurrent_app.until_cancelled, p) for p in payloads])
            await until("all three to start", lambda: all(lines(m) for m in markers))
            assert len({lines(m)[0] for m in markers}) == 1  # "started <pid>": one guest
            await r.node.cancel(TENANT, ids[1], "only this one")
            canceled = await r.finished(ids[1])
            assert canceled.status == "CANCELED"
            assert lines(markers[1])[1:] == ["saw cancel"]
            assert r.task(ids[0]).finished_ms is None and r.task(ids[2]).finished_ms is None
            release.write_text("go")
            for task_id, marker in ((ids[0], markers[0]), (ids[2], markers[2])):
                task = await r.finished(task_id)
                assert task.status == "SUCCEEDED" and result(task) == "released"
                assert lines(marker)[1:] == ["released"]

    run(main)


def test_a_kill_cancels_the_one_coroutine_and_spares_the_guest(tmp_path: Path) -> None:
    release = tmp_path / "release"
    stuck, other = tmp_path / "stuck", tmp_path / "other"

    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF, concurrency=4) as r:
            waits = await r.enqueue(
                concurrent_app.until_cancelled, {"marker": str(other), "release": str(release)}
            )
            await until("the first to start", lambda: bool(lines(other)))
            slow = await r.enqueue(concurrent_app.stubborn, {"marker": str(stuck)})
            task = await r.finished(slow)  # start_to_close 1 s, then the grace, then an abort
            assert task.status == "FAILED" and task.error_class == "StartToCloseTimeout"
            # its coroutine is cancelled, in the guest: the abort follows the grace, and the
            # node may record the timeout first
            await until("the coroutine to be aborted", lambda: lines(stuck)[1:] == ["aborted"])
            assert lines(stuck)[0] == lines(other)[0]  # the same guest as the other
            pid = int(lines(other)[0].split()[1])
            assert alive(pid) and r.task(waits).finished_ms is None
            release.write_text("go")
            assert (await r.finished(waits)).status == "SUCCEEDED"
            assert pool_of(r).spawned == 1

    run(main)


def test_a_coroutine_that_holds_the_loop_gets_its_guest_killed_and_the_others_retried(
    tmp_path: Path,
) -> None:
    release = tmp_path / "release"
    hog, other = tmp_path / "hog", tmp_path / "other"

    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF, concurrency=4) as r:
            waits = await r.enqueue(
                concurrent_app.patient, {"marker": str(other), "release": str(release)}
            )
            await until("the first to start", lambda: bool(lines(other)))
            blocks = await r.enqueue(concurrent_app.hog_loop, {"marker": str(hog)})
            task = await r.finished(blocks)
            assert task.status == "FAILED" and task.error_class == "StartToCloseTimeout"
            pid = int(lines(other)[0].split()[2])
            assert lines(hog)[0] == f"started {pid}"  # beside the other, in its guest
            await until("its guest to be killed", lambda: not alive(pid))
            await until("the other to run again", lambda: len(lines(other)) == 2)
            release.write_text("go")
            retried = await r.finished(waits)
            assert retried.status == "SUCCEEDED" and result(retried) == 2
            attempts = r.node.tables(r.node.partition_of(waits)).attempts(waits)
            (first,) = [a for a in attempts if a.attempt == 1]
            assert first.error_class == "GuestCrashed"
            assert f"killed with task {blocks}" in (first.error_message or "")
            assert not r.agent.breakers["patient"].crashes  # not a crash of its own type

    run(main)


def test_steps_of_coroutines_side_by_side_commit_each_to_its_own_task(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF, concurrency=4) as r:
            names = ["a", "b", "c", "d"]
            ids = await r.enqueue_many(
                [(concurrent_app.stepper, {"name": n, "steps": 5}) for n in names]
            )
            for task_id, name in zip(ids, names, strict=True):
                task = await r.finished(task_id)
                assert task.status == "SUCCEEDED"
                assert result(task) == [f"{name}-{i}" for i in range(5)]
            assert pool_of(r).spawned == 1

    run(main)


def test_checkpoints_of_coroutines_side_by_side_land_on_their_own_tasks(tmp_path: Path) -> None:
    release = tmp_path / "release"

    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF, concurrency=4) as r:
            names = ["a", "b", "c"]
            ids = await r.enqueue_many(
                [(concurrent_app.checkpointer, {"name": n, "release": str(release)}) for n in names]
            )

            def saved() -> bool:
                return all(r.task(task_id).checkpoint is not None for task_id in ids)

            await until("each to checkpoint while all run", saved)
            for task_id, name in zip(ids, names, strict=True):
                assert json.loads(r.task(task_id).checkpoint or b"null") == {"name": name}
                assert r.task(task_id).finished_ms is None
            release.write_text("go")
            for task_id, name in zip(ids, names, strict=True):
                assert result(await r.finished(task_id)) == name
            assert pool_of(r).spawned == 1

    run(main)
