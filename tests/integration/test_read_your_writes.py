"""Read your writes: a listing from the Postgres query snapshot shows a task whose enqueue was
acknowledged just before, to this client or to another process (``gateway/snapshot.py``).

A real ``conveyor node`` (processors, the projector in its own process, embedded PostgreSQL):
- enqueue then list at once, many times over: the task is on the first page every time
  (over HTTP, and through the SDK's client: its page carries ``may_trail``);
- ``conveyor enqueue`` then ``conveyor list``, two processes as in a shell: it is listed;
- with the projector process stopped (SIGSTOP), a listing waits its bound and then says the
  page may trail (``may_trail``; ``conveyor list`` says so) instead of passing a stale page
  off as current; once the projector runs again the task is listed and the flag is off.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gateway import KEY_A, NodeProcess, call, register, write_keys

pytestmark = pytest.mark.timeout(240)

ROUNDS = 60


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("ryw") / "home"
    write_keys(home)
    proc = NodeProcess(home)
    proc.start()
    register(proc.base)
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def _enqueue(base: str, n: int) -> str:
    body = {"task_type": "echo", "app": "shop", "payload": {"n": n}}
    status, reply = call(base, "POST", "/v1/tasks", body)
    assert status == 201, reply
    return str(reply["task_id"])


def _listed(base: str) -> tuple[set[str], bool]:
    status, page = call(base, "GET", "/v1/tasks?limit=1000")
    assert status == 200, page
    return {t["task_id"] for t in page["tasks"]}, page["may_trail"]


def test_a_task_is_listed_right_after_its_enqueue_every_time(node: NodeProcess) -> None:
    for n in range(ROUNDS):
        task_id = _enqueue(node.base, n)
        listed, may_trail = _listed(node.base)
        assert task_id in listed, f"round {n}: {task_id} missing from the listing"
        assert may_trail is False


def test_the_sdk_client_lists_what_it_just_enqueued(node: NodeProcess) -> None:
    import conveyor

    with conveyor.Client(node.base, KEY_A, app="shop") as client:
        for n in range(10):
            handle = client.enqueue("echo", {"sdk": n})
            page = client.list(limit=1000)
            assert handle.id in {t.task_id for t in page.tasks}, f"round {n}"
            assert page.may_trail is False


def test_conveyor_list_in_another_process_shows_what_conveyor_enqueue_just_did(
    node: NodeProcess,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_HOME"}
    env["CONVEYOR_API_KEY"] = KEY_A
    base = [sys.executable, "-m", "conveyor.cli"]
    for n in range(3):
        enqueue = [*base, "enqueue", "echo", "--app", "shop", "--payload", json.dumps({"c": n})]
        enqueue.append("--json")
        done = subprocess.run(
            [*enqueue, "--url", node.base], capture_output=True, text=True, timeout=60, env=env
        )
        assert done.returncode == 0, done.stderr
        task_id = json.loads(done.stdout)["task_id"]
        listing = subprocess.run(
            [*base, "list", "--json", "--limit", "5", "--url", node.base],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert listing.returncode == 0, listing.stderr
        assert task_id in {t["task_id"] for t in json.loads(listing.stdout)}


def _projector_pid(node_pid: int) -> int:
    """The node's projector process (``streams/sinks/projector_process.py``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == node_pid and b"projector_process" in cmdline:
            return int(entry.name)
    raise AssertionError(f"no projector process under the node (pid {node_pid})")


def test_a_stalled_projector_makes_the_page_say_it_may_trail(node: NodeProcess) -> None:
    assert node.proc is not None
    projector = _projector_pid(node.proc.pid)
    os.kill(projector, signal.SIGSTOP)
    try:
        task_id = _enqueue(node.base, -1)
        started = time.monotonic()
        listed, may_trail = _listed(node.base)
        waited_s = time.monotonic() - started
        assert may_trail is True
        assert task_id not in listed  # the projector is stopped: the snapshot cannot hold it
        assert waited_s >= 1.9, "the listing waits its bound (2 s) before it gives up"
        env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_HOME"}
        env["CONVEYOR_API_KEY"] = KEY_A
        shown = subprocess.run(
            [sys.executable, "-m", "conveyor.cli", "list", "--url", node.base],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert shown.returncode == 0, shown.stderr
        assert "the query snapshot is behind the node" in " ".join(shown.stdout.split())
    finally:
        os.kill(projector, signal.SIGCONT)
    listed, may_trail = _listed(node.base)
    assert task_id in listed
    assert may_trail is False
