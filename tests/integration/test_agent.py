"""The host agent with real guest processes, against an in-process Node (real clock).

Each test runs a Node in memory behind the real gateway on a free port, the agent
(``HostAgent`` with its ``GuestPool``) over the worker protocol (HTTP, an agent key), and
handlers from ``agent_app`` in ``python -m conveyor.agents.guest`` processes. Conditions
are polled with a deadline; nothing sleeps to wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import agent_app
import httpx
import pytest

import conveyor
from conveyor.agents.breaker import BreakerPolicy, BreakerState
from conveyor.agents.host import HostAgent
from conveyor.agents.runner import load_app
from conveyor.agents.sandbox import read_log
from conveyor.agents.worker_api import HttpWorkerAPI
from conveyor.schemas.types import Task
from conveyor.streams.gateway import KeyStore, Registry, build_app, start
from conveyor.streams.gateway.auth import agent_grant, client_grant, create_key
from conveyor.streams.node import Node
from conveyor.wire import Enqueue, chunks, enqueue_body

pytestmark = pytest.mark.timeout(120)

APP_REF = "agent_app:app"
TENANT = "default"
DEADLINE_S = 30.0
START_S = 90.0  # a node's first start initialises its private PostgreSQL: slow on a busy machine


@dataclass
class Rig:
    node: Node
    api: HttpWorkerAPI
    agent: HostAgent
    log_dir: Path
    http: httpx.AsyncClient  # the gateway's /v1, with a client key

    async def enqueue(self, task: Any, payload: Any = None, **opts: Any) -> str:
        (task_id,) = await self.enqueue_many([(task, payload)], **opts)
        return task_id

    async def enqueue_many(self, items: list[tuple[Any, Any]], **opts: Any) -> list[str]:
        """``POST /v1/tasks:batch`` (one append each) of ``items`` (task, payload), in the
        gateway's batches of at most 1000."""
        app = self.agent.app.name
        bodies = [enqueue_body(Enqueue(task, payload, **opts), app) for task, payload in items]
        ids = []
        for chunk in chunks(bodies):
            reply = await self.http.post("/v1/tasks:batch", json={"tasks": chunk})
            assert reply.is_success, reply.text
            ids.extend(r["task_id"] for r in reply.json()["results"])
        return ids

    def task(self, task_id: str) -> Task:
        return self.node.get(TENANT, task_id)

    async def finished(self, task_id: str) -> Task:
        await until(f"task {task_id} to finish", lambda: self.task(task_id).finished_ms is not None)
        return self.task(task_id)


async def until(what: str, check: Callable[[], bool], timeout: float = DEADLINE_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def rig(
    tmp_path: Path,
    *,
    drain_s: float = 0.0,
    app_ref: str = APP_REF,
    durable: bool = False,
    **agent_opts: Any,
) -> AsyncIterator[Rig]:
    """A node (in memory, or on disk when ``durable``) behind the real gateway on a free
    port, and the agent polling it over the worker protocol with an agent key of its app."""
    home = tmp_path / "home"
    home.mkdir(parents=True)
    node = await Node.open(home / "node", partitions=2) if durable else Node.in_memory(2)
    await node.start()
    app_name = load_app(app_ref).name
    client_key = create_key(home, client_grant(TENANT))
    agent_key = create_key(home, agent_grant(TENANT, app_name))
    registry = Registry.load(home)
    runner, url = await start(build_app(node, KeyStore.load(home), registry), "127.0.0.1", 0)
    api = HttpWorkerAPI(url, agent_key)
    http = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {client_key}"})
    opts: dict[str, Any] = {"heartbeat_s": 0.2, "poll_wait_s": 1.0, "concurrency": 2}
    opts.update(agent_opts)
    agent = HostAgent(api, app_ref, log_dir=tmp_path / "logs", **opts)
    running = asyncio.create_task(agent.run(drain_s=drain_s))
    try:
        await until("the agent to register", lambda: bool(registry.task_types(TENANT, app_name)))
        yield Rig(node, api, agent, tmp_path / "logs", http)
    finally:
        agent.stop()
        try:
            await asyncio.wait_for(running, DEADLINE_S)
        finally:
            await api.close()
            await http.aclose()
            await runner.cleanup()
            await node.stop()


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_a_task_runs_in_a_warm_guest_with_its_output_captured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_API_KEY", "secret-of-the-agent")

    async def main() -> None:
        async with rig(tmp_path) as r:
            log_refs: dict[str, str | None] = {}
            report = r.api.complete

            async def capture(items: Any) -> Any:
                log_refs.update((item.task_id, item.log_ref) for item in items)
                return await report(items)

            r.api.complete = capture  # type: ignore[method-assign]
            first = await r.finished(await r.enqueue(agent_app.echo, "one"))
            second = await r.finished(await r.enqueue(agent_app.echo, "two"))
            assert first.status == second.status == "SUCCEEDED"
            one, two = (result_of(t) for t in (first, second))
            assert one["payload"] == "one" and one["key"] is None  # no credentials in guests
            assert one["pid"] == two["pid"]  # the same warm guest served both
            # Each attempt's output is its own byte range of the guest's log.
            one_log = read_log(str(log_refs[first.task_id]))
            two_log = read_log(str(log_refs[second.task_id]))
            assert "echo of 'one' in attempt 1" in one_log and "'two'" not in one_log
            assert "echo of 'two' in attempt 1" in two_log and "'one'" not in two_log

    run(main)


def test_fresh_process_runs_each_task_in_a_new_guest(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path, fresh_process=True) as r:
            a = await r.finished(await r.enqueue(agent_app.echo, 1))
            b = await r.finished(await r.enqueue(agent_app.echo, 2))
            assert result_of(a)["pid"] != result_of(b)["pid"]

    run(main)


def test_kill_9_of_a_guest_mid_task_retries_the_task(tmp_path: Path) -> None:
    marker = tmp_path / "die_once"

    async def main() -> None:
        async with rig(tmp_path) as r:
            task_id = await r.enqueue(agent_app.die_once, {"marker": str(marker)})
            await until("the guest to start the task", lambda: bool(lines(marker)))
            pid = int(lines(marker)[0].split()[1])
            os.kill(pid, signal.SIGKILL)
            task = await r.finished(task_id)
            assert task.status == "SUCCEEDED" and task.attempt == 2
            (failed,) = r.node.tables(r.node.partition_of(task_id)).attempts(task_id)
            assert failed.error_class == "GuestCrashed"
            assert "SIGKILL" in (failed.error_message or "")

    run(main)


@pytest.mark.parametrize(
    ("handler", "memo"),
    [("step_then_die", "None"), ("async_step_then_die", "'ran'")],  # steps rule 7: async
)
def test_a_step_stays_memoized_across_a_guest_kill_9(
    tmp_path: Path, handler: str, memo: str
) -> None:
    marker = tmp_path / handler

    async def main() -> None:
        async with rig(tmp_path) as r:
            task_id = await r.enqueue(getattr(agent_app, handler), {"marker": str(marker)})
            await until("the step to commit", lambda: any("pid" in x for x in lines(marker)))
            pid = int(next(x for x in lines(marker) if x.startswith("pid")).split()[1])
            os.kill(pid, signal.SIGKILL)
            task = await r.finished(task_id)
            assert task.status == "SUCCEEDED" and task.attempt == 2
            assert result_of(task) == f"memo {memo} in attempt 2"
            ran = [x for x in lines(marker) if x.startswith("ran")]
            assert ran == ["ran in step attempt 1"]  # committed once, never re-executed

    run(main)


async def trip(r: Rig) -> str:
    task_id = await r.enqueue(agent_app.crash)
    await until(
        "the breaker to open",
        lambda: (
            "crash" in r.agent.breakers and r.agent.breakers["crash"].state == BreakerState.OPEN
        ),
    )
    return task_id


def test_a_guest_crash_loop_trips_its_types_breaker_while_the_other_types_keep_running(
    tmp_path: Path,
) -> None:
    policy = BreakerPolicy(crashes_max=3, window_s=60, cooldown_s=60)

    async def main() -> None:
        async with rig(tmp_path, concurrency=1, breaker=policy) as r:
            crash = await trip(r)
            breaker = r.agent.breakers["crash"]
            assert breaker.trips == 1 and "3 guest crash(es)" in (breaker.reason or "")
            assert "SIGKILL" in (breaker.reason or "")
            assert breaker.app == r.agent.app.name
            # The healthy type of the same agent is claimed as before, at once: only the
            # crashing type is held back (it stays queued, its retries not dealt here).
            for n in range(3):
                started = time.monotonic()
                echo = await r.enqueue(agent_app.echo, f"while open {n}")
                assert (await r.finished(echo)).status == "SUCCEEDED"
                assert time.monotonic() - started < 3
            assert r.task(crash).status in ("ENQUEUED", "RETRY_WAIT")
            # Three attempts crashed; the fourth was never started while the breaker is open.
            assert r.task(crash).attempt == policy.crashes_max + 1

    run(main)


def test_the_breaker_half_opens_after_the_cooldown(tmp_path: Path) -> None:
    policy = BreakerPolicy(crashes_max=3, window_s=60, cooldown_s=1.0)

    async def main() -> None:
        async with rig(tmp_path, concurrency=1, breaker=policy) as r:
            await trip(r)
            echo = await r.enqueue(agent_app.echo, "after the cooldown")
            # Half-open: the agent claims again; the echo runs and the crashing type trips the
            # breaker a second time.
            await until("the echo to run", lambda: r.task(echo).status == "SUCCEEDED", 5)
            await until("a second trip", lambda: r.agent.breakers["crash"].trips >= 2, 5)

    run(main)


def test_cancel_of_a_running_task_reaches_ctx_cancelled(tmp_path: Path) -> None:
    marker = tmp_path / "wait_cancel"

    async def main() -> None:
        async with rig(tmp_path) as r:
            task_id = await r.enqueue(agent_app.wait_cancel, {"marker": str(marker)})
            await until("the handler to start", lambda: lines(marker) == ["started"])
            await r.node.cancel(TENANT, task_id, "the user changed their mind")
            task = await r.finished(task_id)
            assert task.status == "CANCELED"
            assert lines(marker) == ["started", "saw cancel"]

    run(main)


def test_a_cancel_reaches_a_handler_that_polls_ctx_cancelled(tmp_path: Path) -> None:
    marker = tmp_path / "poll_cancel"

    async def main() -> None:
        async with rig(tmp_path) as r:
            task_id = await r.enqueue(agent_app.poll_cancel, {"marker": str(marker)})
            await until("the handler to start", lambda: lines(marker) == ["started"])
            await r.node.cancel(TENANT, task_id, "the user changed their mind")
            task = await r.finished(task_id)
            assert task.status == "CANCELED"
            assert lines(marker) == ["started", "saw cancel"]

    run(main)


def test_start_to_close_kills_the_guest_after_the_grace(tmp_path: Path) -> None:
    marker = tmp_path / "stubborn"

    async def main() -> None:
        async with rig(tmp_path) as r:
            task_id = await r.enqueue(agent_app.stubborn, {"marker": str(marker)})
            await until("the handler to start", lambda: bool(lines(marker)))
            pid = int(lines(marker)[0].split()[1])
            task = await r.finished(task_id)
            assert task.status == "FAILED" and task.error_class == "StartToCloseTimeout"
            await until(f"guest {pid} to be killed", lambda: not alive(pid))
            await until("the agent to let go", lambda: not r.agent.busy)

    run(main)


def test_the_memory_limit_stops_a_hog(tmp_path: Path) -> None:
    marker = tmp_path / "hog"

    async def main() -> None:
        async with rig(tmp_path, memory_mb=512) as r:
            task_id = await r.enqueue(agent_app.hog, {"mb": 2048, "marker": str(marker)})
            task = await r.finished(task_id)
            assert task.status == "FAILED"
            assert task.error_class in ("MemoryError", "GuestCrashed")
            assert not marker.exists()
            # The guest that hit the limit is not reused; the next task still runs.
            after = await r.finished(await r.enqueue(agent_app.echo, "after the hog"))
            assert after.status == "SUCCEEDED"

    run(main)


def test_the_cpu_limit_stops_a_spinner(tmp_path: Path) -> None:
    async def main() -> None:
        async with rig(tmp_path, cpu_s=1) as r:
            task = await r.finished(await r.enqueue(agent_app.spin))
            assert task.status == "FAILED" and task.error_class == "GuestCrashed"
            assert "SIGXCPU" in (task.error_message or "")

    run(main)


# --- end to end over HTTP: a real `conveyor node`, HttpWorkerAPI and the clients ---------------

KEY = "agent-test-key-0123456789"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    home = tmp_path_factory.mktemp("agent-http") / "home"
    home.mkdir()
    (home / "keys.json").write_text(json.dumps({"keys": {KEY: {"tenant": "default"}}}))
    port = free_port()
    out_path = home.parent / "node.out"
    cmd = [sys.executable, "-m", "conveyor.cli", "node", "--home", str(home), "--port", str(port)]
    with open(out_path, "ab") as out:
        proc = subprocess.Popen([*cmd, "--partitions", "2"], stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc, out_path)
        yield base
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_healthy(base: str, proc: subprocess.Popen[bytes], out_path: Path) -> None:
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"node exited {proc.returncode}:\n{out_path.read_text()}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                return
        time.sleep(0.05)  # the node process is starting: nothing to poll but its port
    raise AssertionError(f"node not healthy after {START_S}s:\n{out_path.read_text()}")


def test_end_to_end_over_http(gateway: str, tmp_path: Path) -> None:
    marker = tmp_path / "die_once"

    async def main() -> None:
        api = HttpWorkerAPI(gateway, KEY)
        agent = HostAgent(api, APP_REF, log_dir=tmp_path / "logs", heartbeat_s=0.3, poll_wait_s=1.0)
        running = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(agent.started.wait(), DEADLINE_S)
            async with conveyor.AsyncClient(gateway, KEY) as client:
                await over_http(client, marker)
            # The sync client too (from a thread: it blocks).
            result = await asyncio.to_thread(sync_round_trip, gateway)
            assert result["payload"] == {"via": "sync"}
        finally:
            agent.stop()
            await asyncio.wait_for(running, DEADLINE_S)
            await api.close()
        assert agent.completer.completed >= 4

    run(main)


def test_an_agent_holding_more_leases_than_one_call_takes_polls_and_heartbeats_them_all(
    gateway: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A poll may ask for at most 1,000 leases and a heartbeat name at most 1,000: an agent
    with room for 1,200 asks in parts (``agents/worker_api.py`` rule 1), and none lapses."""
    caplog.set_level(logging.WARNING)

    async def main() -> None:
        api = HttpWorkerAPI(gateway, KEY)
        agent = HostAgent(
            api,
            APP_REF,
            concurrency=4,
            prefetch=1_196,
            log_dir=tmp_path / "logs",
            heartbeat_s=0.2,
            poll_wait_s=1.0,
            lease_s=2.0,
        )
        running = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(agent.started.wait(), DEADLINE_S)
            async with conveyor.AsyncClient(gateway, KEY) as client:
                gate = {"open": str(tmp_path / "open")}
                handles = await client.enqueue_many((agent_app.gate, gate) for _ in range(1_200))
                # The 4 guests wait at the gate, so the leases pile up in the agent.
                await until("over 1,000 leases held", lambda: len(agent.running) > 1_000)
                await asyncio.sleep(5.0)  # over two lease lengths: only heartbeats keep them
                (tmp_path / "open").touch()
                for handle in handles:
                    await handle.result(timeout=DEADLINE_S)
                attempts = {(await h.get()).attempt for h in handles}
        finally:
            agent.stop()
            await asyncio.wait_for(running, DEADLINE_S)
            await api.close()
        assert attempts == {1}  # no lease lapsed for want of a heartbeat

    run(main)
    failed = [r.getMessage() for r in caplog.records if "failed" in r.getMessage()]
    assert failed == []


async def over_http(client: conveyor.AsyncClient, marker: Path) -> None:
    echo = await client.enqueue(agent_app.echo, {"n": 1})
    assert (await echo.result(timeout=DEADLINE_S))["payload"] == {"n": 1}
    # What the attempt printed travels with its completion and is kept with the task.
    (ran,) = (await echo.get()).attempts
    assert await client.attempt_log(ran) == "echo of {'n': 1} in attempt 1\n"

    refused = await client.enqueue(agent_app.refuse, "this")
    with pytest.raises(conveyor.TaskFailed) as err:
        await refused.result(timeout=DEADLINE_S)
    assert err.value.error_class == "FatalError" and (await refused.get()).attempt == 1

    dies = await client.enqueue(agent_app.die_once, {"marker": str(marker)})
    await until("the guest to start", lambda: bool(lines(marker)))
    os.kill(int(lines(marker)[0].split()[1]), signal.SIGKILL)
    assert await dies.result(timeout=DEADLINE_S) == "survived in attempt 2"
    info = await dies.get()
    assert info.attempts[0].error is not None
    assert info.attempts[0].error.error_class == "GuestCrashed"

    waits = await client.enqueue(agent_app.wait_cancel, {"marker": str(marker) + ".c"})
    await until("the handler to start", lambda: lines(Path(str(marker) + ".c")) == ["started"])
    await waits.cancel()
    with pytest.raises(conveyor.TaskFailed) as err:
        await waits.result(timeout=DEADLINE_S)
    assert err.value.state == "CANCELED"
    assert lines(Path(str(marker) + ".c")) == ["started", "saw cancel"]


def sync_round_trip(base: str) -> Any:
    with conveyor.Client(base, KEY) as client:
        return client.enqueue(agent_app.echo, {"via": "sync"}).result(timeout=DEADLINE_S)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def result_of(task: Task) -> dict[str, Any]:
    assert task.result is not None
    result: dict[str, Any] = json.loads(task.result)
    return result
