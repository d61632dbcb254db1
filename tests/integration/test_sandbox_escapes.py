"""Escapes tried from inside real guests (``hostile_app``), with the sandbox on and off.

Each test runs the hostile handler in a bubblewrap guest and asserts the escape failed, then
(where it means something) runs the same probe with ``--sandbox none`` and asserts it worked
there, so the test would fail without the sandbox. The agent is ``test_agent``'s rig (a real
``HostAgent`` and ``GuestPool`` in this process against an in-memory node); the key theft runs a
real ``conveyor agent`` against a real ``conveyor node``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hostile_app
import pytest
from test_agent import result_of, rig, until
from test_gateway import NodeProcess

import conveyor
from conveyor.agents import bwrap
from conveyor.schemas.types import Task

pytestmark = [
    pytest.mark.timeout(120),
    pytest.mark.skipif(bwrap.find_bwrap(bwrap.SandboxPolicy()) is None, reason="no bwrap"),
]

APP_REF = "hostile_app:app"
HERE = Path(__file__).parent
POLICY = bwrap.SandboxPolicy(processes=32, memory_mb=1024, file_mb=8)
ROOT = os.geteuid() == 0


async def run_probe(
    tmp_path: Path, sandbox: bwrap.SandboxPolicy | None, task: Any, payload: Any, **opts: Any
) -> Task:
    async with rig(tmp_path, app_ref=APP_REF, sandbox=sandbox, **opts) as r:
        return await r.finished(await r.enqueue(task, payload))


def probe(tmp_path: Path, sandbox: bwrap.SandboxPolicy | None, task: Any, payload: Any) -> Any:
    done = asyncio.run(run_probe(tmp_path / uuid.uuid4().hex, sandbox, task, payload))
    assert done.status == "SUCCEEDED", done.error_message
    return result_of(done)


def test_a_guest_runs_as_another_user_with_only_its_own_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONVEYOR_API_KEY", "the-agents-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "the-agents-cloud-secret")
    seen = probe(tmp_path, POLICY, hostile_app.whoami, None)
    assert (seen["uid"], seen["gid"]) == (POLICY.uid, POLICY.gid)
    assert seen["pid"] < 10  # a PID namespace of its own
    assert "the-agents" not in json.dumps(seen["env"])
    assert set(seen["env"]) <= {
        *bwrap.PASSED_ENV,
        "HOME",
        "TMPDIR",
        "PYTHONPATH",
        "PYTHONDONTWRITEBYTECODE",
        "PWD",  # bwrap's, from --chdir
    }
    loose = probe(tmp_path, None, hostile_app.whoami, None)
    assert loose["env"]["AWS_SECRET_ACCESS_KEY"] == "the-agents-cloud-secret"


def test_a_guest_cannot_read_the_agents_environ_or_memory(tmp_path: Path) -> None:
    agent = {"path": f"/proc/{os.getpid()}/environ"}
    assert not probe(tmp_path, POLICY, hostile_app.read_file, agent)["ok"]
    assert not probe(tmp_path, POLICY, hostile_app.read_memory, {"pid": os.getpid()})["ok"]
    # This test process (the agent here) is dumpable: without the sandbox both reads work.
    assert probe(tmp_path, None, hostile_app.read_file, agent)["ok"]
    if ROOT:  # (an unprivileged reader of /proc/<pid>/mem also needs ptrace rights)
        assert probe(tmp_path, None, hostile_app.read_memory, {"pid": os.getpid()})["ok"]


def test_a_guest_cannot_read_another_guests_scratch(tmp_path: Path) -> None:
    path = f"/tmp/conveyor-probe-{uuid.uuid4().hex}"

    async def main(sandbox: bwrap.SandboxPolicy | None) -> Any:
        async with rig(tmp_path / uuid.uuid4().hex, app_ref=APP_REF, sandbox=sandbox) as r:
            holder = await r.enqueue(hostile_app.stash, {"path": path, "secret": "s3", "hold_s": 3})
            # The holder is running (its secret written) while the peek runs in another guest.
            await until_running(r, holder)
            peek = await r.finished(await r.enqueue(hostile_app.read_file, {"path": path}))
            assert r.task(holder).finished_ms is None, "the holder ended: same guest reused"
            await r.finished(holder)
            return result_of(peek)

    try:
        assert not asyncio.run(main(POLICY))["ok"]
        assert not os.path.exists(path)  # the guest's /tmp was its own
        assert asyncio.run(main(None)) == {"ok": True, "value": "s3"}
    finally:
        Path(path).unlink(missing_ok=True)


async def until_running(r: Any, task_id: str) -> None:
    await until("the holder to start", lambda: r.task(task_id).status == "LEASED")
    await asyncio.sleep(0.5)


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP server on 127.0.0.1 standing for the node's port: it greets whoever connects."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except TimeoutError:
                continue
            conn.sendall(b"hello")
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        stop.set()
        thread.join()
        server.close()


def test_a_guest_has_no_network_unless_its_app_is_allowed_egress(
    tmp_path: Path, listener: int
) -> None:
    target = {"host": "127.0.0.1", "port": listener}
    refused = probe(tmp_path, POLICY, hostile_app.connect, target)
    assert not refused["ok"] and "Errno" in refused["error"]
    allowed = dataclasses.replace(POLICY, allow_net=True)
    assert probe(tmp_path, allowed, hostile_app.connect, target) == {"ok": True, "value": "hello"}
    assert probe(tmp_path, None, hostile_app.connect, target)["ok"]


def test_a_fork_bomb_is_stopped_by_the_process_limit(tmp_path: Path) -> None:
    cap = POLICY.processes * 3

    async def main(sandbox: bwrap.SandboxPolicy | None) -> tuple[Any, Task]:
        async with rig(tmp_path / uuid.uuid4().hex, app_ref=APP_REF, sandbox=sandbox) as r:
            bomb = await r.finished(await r.enqueue(hostile_app.fork_bomb, {"cap": cap}))
            after = await r.finished(await r.enqueue(hostile_app.whoami, None))
            return result_of(bomb), after

    bomb, after = asyncio.run(main(POLICY))
    assert bomb["forked"] < POLICY.processes
    assert bomb["error"] is not None and str(errno.EAGAIN) in bomb["error"]
    assert after.status == "SUCCEEDED"  # the agent and its pool go on
    loose, _ = asyncio.run(main(None))
    assert loose == {"forked": cap, "error": None}


def test_allocating_past_the_memory_limit_fails_and_the_agent_survives(tmp_path: Path) -> None:
    async def main() -> tuple[Task, Task]:
        async with rig(tmp_path, app_ref=APP_REF, sandbox=POLICY) as r:
            hog = await r.finished(await r.enqueue(hostile_app.hog, {"mb": 8192}))
            after = await r.finished(await r.enqueue(hostile_app.whoami, None))
            return hog, after

    hog, after = asyncio.run(main())
    assert hog.status == "FAILED" and hog.error_class in ("MemoryError", "GuestCrashed")
    assert after.status == "SUCCEEDED"


def test_a_guest_writes_only_to_its_scratch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "agent-home"
    home.mkdir()
    monkeypatch.setenv("CONVEYOR_HOME", str(home))
    name = f"conveyor-probe-{uuid.uuid4().hex}"
    outside = [HERE / name, Path.home() / name, home / name, tmp_path / name]
    paths = [str(p) for p in outside] + [f"/tmp/{name}"]
    try:
        wrote = probe(tmp_path, POLICY, hostile_app.write_files, {"paths": paths})
        assert wrote[f"/tmp/{name}"]["ok"]
        for path in outside:
            assert not wrote[str(path)]["ok"] and not path.exists(), path
        loose = probe(tmp_path, None, hostile_app.write_files, {"paths": paths})
        assert all(loose[str(p)]["ok"] for p in outside if p.parent.exists())
    finally:
        for path in [*outside, Path(f"/tmp/{name}")]:
            path.unlink(missing_ok=True)


def test_a_guest_cannot_write_a_file_past_the_size_limit(tmp_path: Path) -> None:
    big = {"path": "/tmp/big", "mb": POLICY.file_mb * 2}
    wrote = probe(tmp_path, POLICY, hostile_app.write_big, big)
    assert not wrote["ok"] and "File too large" in wrote["error"]


# -- a real agent process ------------------------------------------------------------------

KEY = "agent-key-that-must-not-leak-0123456789"


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "keys.json").write_text(json.dumps({"keys": {KEY: {"tenant": "default"}}}))
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def start_agent(tmp_path: Path, node: NodeProcess, *args: str) -> subprocess.Popen[bytes]:
    out = open(tmp_path / f"agent-{uuid.uuid4().hex[:6]}.out", "wb")  # noqa: SIM115
    command = [sys.executable, "-m", "conveyor.cli", "agent", "--app", APP_REF, "--url", node.base]
    env = {**os.environ, "PYTHONPATH": str(HERE), "CONVEYOR_HOME": str(tmp_path / "agent")}
    env["CONVEYOR_API_KEY"] = KEY  # in its environment, not its command line
    try:
        return subprocess.Popen(
            [*command, "--poll-wait-s", "1", *args], stdout=out, stderr=subprocess.STDOUT, env=env
        )
    finally:
        out.close()


def run_task(node: NodeProcess, name: str, payload: Any) -> Any:
    with conveyor.Client(node.base, KEY, app="hostile") as client:
        deadline = time.monotonic() + 30
        while True:  # until the agent has registered the app's task types
            try:
                return client.enqueue(name, payload).result(timeout=60)
            except conveyor.ContractError as exc:
                assert exc.code == "unknown_task_type" and time.monotonic() < deadline
                time.sleep(0.1)


def stop(agent: subprocess.Popen[bytes]) -> None:
    agent.terminate()
    agent.wait(timeout=30)


def test_a_hostile_handler_cannot_steal_the_agents_key(tmp_path: Path, node: NodeProcess) -> None:
    """The forged completion: a handler reads the key from the agent and calls the node with
    it. In a sandbox it finds no key and cannot even reach the node's port."""
    payload = {"key": KEY, "port": node.port}
    agent = start_agent(tmp_path, node)  # --sandbox bwrap is the default
    try:
        stolen = run_task(node, "steal_key", payload)
    finally:
        stop(agent)
    assert stolen["found"] == [] and not stolen["node"]["ok"], stolen
    loose_agent = start_agent(tmp_path, node, "--sandbox", "none")
    try:
        loose = run_task(node, "steal_key", payload)
    finally:
        stop(loose_agent)
    assert loose["node"]["ok"]
    if ROOT:  # root reads a non-dumpable process's environ all the same
        assert loose["found"], loose


READER = """
import importlib.util, os, subprocess, sys, time
spec = importlib.util.spec_from_file_location("bwrap", sys.argv[1])
bwrap = sys.modules["bwrap"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bwrap)
target = os.fork()
if target == 0:
    if sys.argv[2] == "hide":
        assert bwrap.make_non_dumpable()
    time.sleep(5)
    os._exit(0)
time.sleep(0.3)
read = subprocess.run(["cat", f"/proc/{target}/environ"], capture_output=True)
os.kill(target, 9)
print(read.returncode)
"""


def test_a_non_dumpable_process_hides_its_environ_from_its_own_user() -> None:
    """What the agent does at start (``make_non_dumpable``): another process of the same user,
    unprivileged, cannot read its /proc/<pid>/environ; it can read a dumpable one's."""
    python, user = (sys.executable, [])
    if ROOT:  # root reads every process: run both as nobody, with an interpreter nobody may run
        python, user = ("/usr/bin/python3", ["setpriv", "--reuid=65534", "--regid=65534"])
        if not os.access(python, os.X_OK) or shutil.which("setpriv") is None:
            pytest.skip("needs /usr/bin/python3 and setpriv to read as an unprivileged user")
    module = str(HERE.parent.parent / "agents" / "bwrap.py")

    def reads(mode: str) -> bool:
        command = [*user, "--clear-groups"] if user else []
        done = subprocess.run(
            [*command, python, "-c", READER, module, mode], capture_output=True, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.strip() == b"0"

    assert reads("show")
    assert not reads("hide")
