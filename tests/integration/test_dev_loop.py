"""``conveyor dev`` as a developer meets it in the first hour, every part a real process:

- a line per state change of each task (from the events stream), none with ``--quiet``;
- Ctrl-C lets the running tasks finish, counting down; a second Ctrl-C stops now, and the
  killed attempt is reported (it is retried, not lost);
- ``--reload`` starts the agent anew when the app's file changes (a new task type is served),
  and a broken save shows its error in a few lines while the code from before goes on;
- a guest that cannot import the app stops ``conveyor dev`` with that error in a few lines
  (the exception and the app's file and line), not a traceback;
- a folder named ``conveyor`` beside the app is named as the cause, with what to do, by
  ``conveyor dev`` and ``conveyor agent``, before anything starts;
- ``conveyor node`` prints only the first characters of the API key.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gateway import NodeProcess, call

from conveyor.streams.gateway.auth import shown

pytestmark = pytest.mark.timeout(240)

APP = """
import sys
import time

import conveyor

app = conveyor.App("devloop")


@app.task
def hi(ctx, payload):
    return payload


@app.task(retry=conveyor.Retry(attempts=2, base="50ms", cap="50ms"))
def boom(ctx, payload):
    raise ValueError("no good [at all]")


@app.task
def slow(ctx, payload):
    open(payload["started"], "w").close()  # the test waits for it: the attempt runs
    time.sleep(payload["s"])
    return payload
"""

GUEST_ONLY_FAILURE = """
if sys.argv[0].endswith("guest.py"):  # only in a guest: a dependency its sandbox lacks
    import a_module_the_guests_lack  # noqa: F401
"""


def dev_key(home: Path) -> str:
    keys = json.loads((home / "keys.json").read_text())["keys"]
    return next(k for k, e in keys.items() if e.get("role") != "agent")


def start_dev(root: Path, *options: str, app: str = "devapp:app") -> NodeProcess:
    home = root / f"home-{len(list(root.glob('home-*')))}"
    home.mkdir()
    proc = NodeProcess(home, ("dev", "--app", app, "--no-projection", *options))
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_HOME"}
    proc.start(cwd=root, env=env)
    return proc


def enqueue(dev: NodeProcess, task_type: str, payload: object = None) -> str:
    """Enqueue once the agent serves the type (it registers a moment after the node starts)."""
    body = {"task_type": task_type, "app": "devloop", "payload": payload}
    deadline = time.monotonic() + 60
    while True:
        status, reply = call(dev.base, "POST", "/v1/tasks", body, key=dev_key(dev.home))
        if status == 201:
            return str(reply["task_id"])
        assert time.monotonic() < deadline, (status, reply, dev.logs())
        time.sleep(0.1)


def wait_line(dev: NodeProcess, pattern: str, timeout_s: float = 30.0) -> re.Match[str]:
    deadline = time.monotonic() + timeout_s
    while True:
        found = re.search(pattern, dev.logs(), re.MULTILINE)
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"no line like {pattern!r}:\n{dev.logs()}"
        time.sleep(0.05)


def wait_exit(dev: NodeProcess, timeout_s: float) -> int:
    assert dev.proc is not None
    try:
        return dev.proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        dev.proc.kill()
        raise AssertionError(
            f"conveyor dev still runs after {timeout_s} s:\n{dev.logs()}"
        ) from None


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "devapp.py").write_text(APP)
    return tmp_path


@pytest.fixture
def dev(root: Path) -> Iterator[NodeProcess]:
    proc = start_dev(root)
    try:
        yield proc
    finally:
        if proc.proc is not None and proc.proc.poll() is None:  # a test failed midway
            proc.proc.send_signal(signal.SIGTERM)
            proc.proc.send_signal(signal.SIGTERM)  # the second one does not wait for the drain
            wait_exit(proc, 30)


def test_a_line_per_state_change_of_each_task(dev: NodeProcess) -> None:
    ok = enqueue(dev, "hi", {"n": 1})[-8:]
    bad = enqueue(dev, "boom")[-8:]
    wait_line(dev, rf"^\d\d:\d\d:\d\d\.\d{{3}} hi +{ok} enqueued #1$")
    wait_line(dev, rf"^\S+ hi +{ok} leased #1$")
    wait_line(dev, rf"^\S+ hi +{ok} succeeded #1  \d+ ms$")
    error = r"ValueError: no good \[at all\]"
    wait_line(dev, rf"^\S+ boom +{bad} failed, will retry #1  \d+ ms  {error}$")
    wait_line(dev, rf"^\S+ boom +{bad} FAILED #2  \d+ ms  {error}$")


def test_quiet_prints_no_task_lines(root: Path) -> None:
    dev = start_dev(root, "--quiet")
    try:
        task_id = enqueue(dev, "hi")
        deadline = time.monotonic() + 30
        while (
            call(dev.base, "GET", f"/v1/tasks/{task_id}", key=dev_key(dev.home))[1]["status"]
            != "SUCCEEDED"
        ):
            assert time.monotonic() < deadline, dev.logs()
            time.sleep(0.05)
        assert task_id[-8:] not in dev.logs()
    finally:
        assert dev.stop(signal.SIGINT) == 0, dev.logs()


def test_ctrl_c_drains_with_a_countdown_and_a_second_one_stops_now(root: Path) -> None:
    # Unsandboxed: the handlers mark their start in this test's directory.
    dev = start_dev(root, "--sandbox", "none")
    assert dev.proc is not None
    marks = [root / "short.started", root / "long.started"]
    short = enqueue(dev, "slow", {"s": 3, "started": str(marks[0])})[-8:]
    long = enqueue(dev, "slow", {"s": 120, "started": str(marks[1])})[-8:]
    deadline = time.monotonic() + 30
    while not all(mark.exists() for mark in marks):
        assert time.monotonic() < deadline, dev.logs()
        time.sleep(0.05)
    dev.proc.send_signal(signal.SIGINT)
    wait_line(dev, r"^stopping: 2 running task\(s\) get up to 30 s to finish \(Ctrl-C again")
    wait_line(dev, rf" {short} succeeded #1  \d+ ms$")  # the drain lets it finish
    wait_line(dev, r"^  1 running, \d+ s left$", timeout_s=15)  # the countdown
    assert dev.proc.poll() is None, "the long task still has time to finish"
    dev.proc.send_signal(signal.SIGINT)
    wait_line(dev, r"^stopping now: killing 1 running task\(s\)$")
    assert wait_exit(dev, 20) == 0, dev.logs()
    # The killed attempt was reported: it will run again, nothing acknowledged is lost.
    wait_line(dev, rf" {long} failed, will retry #1  .*Killed: the agent is stopping")


def test_reload_serves_the_new_code_and_keeps_the_old_on_a_broken_save(root: Path) -> None:
    dev = start_dev(root, "--reload")
    try:
        enqueue(dev, "hi")
        source = root / "devapp.py"
        source.write_text(APP + '\n\n@app.task\ndef added(ctx, payload):\n    return "new"\n')
        wait_line(dev, r"^reloaded devapp:app \(4 task types; devapp\.py changed\)$")
        added = enqueue(dev, "added")[-8:]
        wait_line(dev, rf" added +{added} succeeded #1")
        source.write_text(source.read_text() + "\ndef broken(:\n")
        wait_line(dev, r"^reload failed \(devapp\.py changed\):$")
        wait_line(dev, rf"^  at {re.escape(str(source))}:\d+: def broken\(:$")
        still = enqueue(dev, "added")[-8:]  # the agent from before goes on
        wait_line(dev, rf" added +{still} succeeded #1")
        assert "Traceback" not in dev.logs()
    finally:
        assert dev.stop(signal.SIGINT) == 0, dev.logs()


def _failed_start(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_HOME"}
    cmd = [sys.executable, "-m", "conveyor.cli", *args, "--home", str(root / "home")]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=root, env=env)


def test_a_guest_that_cannot_import_the_app_shows_why_in_a_few_lines(root: Path) -> None:
    (root / "devapp.py").write_text(APP + GUEST_ONLY_FAILURE)
    port = str(NodeProcess(root / "unused").port)
    done = _failed_start(root, "dev", "--app", "devapp:app", "--no-projection", "--port", port)
    assert done.returncode == 1, done.stdout + done.stderr
    error = done.stderr[done.stderr.index("error:") :]
    assert error.splitlines()[:3] == [
        "error: a guest cannot import the app devapp:app:",
        "ModuleNotFoundError: No module named 'a_module_the_guests_lack'",
        f"  at {root / 'devapp.py'}:{APP.count(chr(10)) + 3}: import a_module_the_guests_lack"
        "  # noqa: F401",
    ]
    assert "Traceback" not in done.stdout + done.stderr
    assert "SIGKILL" not in error
    assert len(error.splitlines()) <= 5


@pytest.mark.parametrize("command", ["dev", "agent"])
def test_a_folder_named_conveyor_beside_the_app_is_named_as_the_cause(
    root: Path, command: str
) -> None:
    (root / "conveyor").mkdir()  # a clone of the repository, say
    (root / "conveyor" / "README.md").write_text("a clone\n")
    done = _failed_start(root, command, "--app", "devapp:app")
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(
        f"error: the folder {root / 'conveyor'} shadows the installed conveyor package"
    ), done.stderr
    assert "Rename or move that folder" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (root / "home").exists(), "nothing started"


def test_conveyor_node_prints_only_the_start_of_the_key(tmp_path: Path) -> None:
    node = NodeProcess(tmp_path / "home", ("node", "--no-projection"))
    (tmp_path / "home").mkdir()
    node.start()
    try:
        wait_line(node, r"^  try ")
        key = dev_key(node.home)
        assert key not in node.logs()
        assert f"  api key  {shown(key)}  (tenant default" in node.logs()
    finally:
        assert node.stop(signal.SIGINT) == 0, node.logs()
