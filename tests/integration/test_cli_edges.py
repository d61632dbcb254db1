"""The CLI's edges, as a user meets them: subprocess ``conveyor`` commands against a real
``conveyor dev`` (node, gateway, agent, guests) started with ``--home`` from another working
directory.

- exit statuses tell failures apart (``conveyor --help`` lists them): usage 2, not found 3,
  refused 4, unavailable 5;
- ``conveyor retry`` with no ids and no filter refuses unless ``--all`` (as ``cancel`` does);
- ``conveyor log verify`` of a directory without a log fails, naming what it wanted;
- ``--home`` is honoured: the guests' output lands under it, nothing in ./.conveyor;
- tables written to a pipe are not cut at 80 columns;
- no help text refers to an issue number.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_gateway import NodeProcess, call

pytestmark = pytest.mark.timeout(240)

EDGE_APP = """
import conveyor

app = conveyor.App("edges")


@app.task
def say(ctx, payload):
    print("said:", payload)
    return payload


@app.task
def a_task_type_with_a_rather_long_name_to_make_the_row_wide(ctx, payload):
    return None
"""
LONG_TASK = "a_task_type_with_a_rather_long_name_to_make_the_row_wide"


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    root = tmp_path_factory.mktemp("cli-edges")
    (root / "edgeapp.py").write_text(EDGE_APP)
    (root / "cwd").mkdir()
    home = root / "home"
    home.mkdir()
    proc = NodeProcess(home, ("dev", "--app", "edgeapp:app", "--no-projection"))
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_HOME"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc.start(cwd=root / "cwd", env=env)  # the home is elsewhere: nothing may land here
    try:
        yield proc
    finally:
        assert proc.stop(signal.SIGINT) == 0, proc.logs()


def conveyor(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """A command as run from a shell whose output goes to a pipe (no $COLUMNS)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "CONVEYOR_HOME")}
    env.pop("CONVEYOR_API_KEY", None)
    cmd = [sys.executable, "-m", "conveyor.cli", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)


def at(dev: NodeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return conveyor(*args, "--url", dev.base, "--home", str(dev.home))


def dev_key(home: Path) -> str:
    keys = json.loads((home / "keys.json").read_text())["keys"]
    return next(k for k, e in keys.items() if e.get("role") != "agent")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_help_documents_the_exit_statuses() -> None:
    shown = conveyor("--help")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())
    for status in ("2 usage", "3 not found", "4 refused", "5 unavailable"):
        assert status in text, text


def test_exit_statuses_tell_failures_apart(dev: NodeProcess) -> None:
    missing = at(dev, "get", "0" * 32)
    assert missing.returncode == 3, missing.stdout + missing.stderr
    assert "not_found" in missing.stderr
    bad_payload = at(dev, "enqueue", "say", "--app", "edges", "--payload", "{not json")
    assert bad_payload.returncode == 2 and "--payload is not JSON" in bad_payload.stderr
    wrong_key = conveyor("get", "0" * 32, "--url", dev.base, "--api-key", "not-a-key")
    assert wrong_key.returncode == 4, wrong_key.stdout + wrong_key.stderr
    down = conveyor("get", "0" * 32, "--url", f"http://127.0.0.1:{closed_port()}", "--api-key", "k")
    assert down.returncode == 5 and "cannot reach" in down.stderr, down.stderr
    usage = conveyor("get")  # typer's own: a missing argument
    assert usage.returncode == 2
    for result in (missing, bad_payload, wrong_key, down):
        assert "Traceback" not in result.stderr


def test_retry_without_ids_or_filter_refuses_unless_all(dev: NodeProcess) -> None:
    refused = at(dev, "retry")
    assert refused.returncode == 4, refused.stdout + refused.stderr
    assert "--all retries every FAILED task" in refused.stderr
    canceled = at(dev, "cancel")  # the same rule, the same status
    assert canceled.returncode == 4 and "--all cancels every" in canceled.stderr
    both = at(dev, "retry", "0" * 32, "--all")
    assert both.returncode == 2 and "not both" in both.stderr
    # With --all the request goes to the node, which runs it as a bulk operation: this one,
    # without the projection, answers that it needs it.
    everything = at(dev, "retry", "--all", "--json")
    assert everything.returncode == 2, everything.stdout + everything.stderr
    assert "need the Postgres snapshot" in everything.stderr


def test_log_verify_of_a_directory_without_a_log_fails_clearly(
    dev: NodeProcess, tmp_path: Path
) -> None:
    (tmp_path / "not-a-log").mkdir()
    (tmp_path / "not-a-log" / "notes.txt").write_text("hello")
    for command in ("verify", "inspect"):
        empty = conveyor("log", command, str(tmp_path / "not-a-log"))
        assert empty.returncode == 3, empty.stdout + empty.stderr
        assert "no log in" in empty.stderr and "p0000" in empty.stderr
        assert empty.stdout == ""  # no empty table passed off as a checked log
    absent = conveyor("log", "verify", str(tmp_path / "nowhere"))
    assert absent.returncode == 3 and "is not a directory" in absent.stderr
    good = conveyor("log", "verify", str(dev.home))  # the running node's home has one
    assert good.returncode == 0 and "ok" in good.stdout, good.stderr


def test_home_is_honoured_for_the_guests_output(dev: NodeProcess) -> None:
    key = dev_key(dev.home)
    body = {"task_type": "say", "app": "edges", "payload": "hello from a guest"}
    status, reply = call(dev.base, "POST", "/v1/tasks", body, key=key)
    assert status in (200, 201), reply
    task_id = reply["task_id"]
    status, task = call(dev.base, "GET", f"/v1/tasks/{task_id}?wait_ms=20000", key=key)
    assert task["status"] == "SUCCEEDED", task
    logs = dev.home / "logs" / "edges"
    deadline = time.monotonic() + 10
    while not any("hello from a guest" in p.read_text() for p in logs.rglob("*") if p.is_file()):
        assert time.monotonic() < deadline, f"no guest output under {logs}"
        time.sleep(0.05)
    stray = dev.home.parent / "cwd" / ".conveyor"
    assert not stray.exists(), f"written under the working directory: {list(stray.rglob('*'))}"


def test_tables_on_a_pipe_are_not_cut_at_80_columns(dev: NodeProcess) -> None:
    added = at(
        dev,
        "schedule",
        "add",
        "wide-one",
        "--cron",
        "*/5 * * * *",
        "--task",
        LONG_TASK,
        "--app",
        "edges",
        "--timezone",
        "America/Argentina/Buenos_Aires",
    )
    assert added.returncode == 0, added.stderr
    listed = at(dev, "schedule", "list")
    assert listed.returncode == 0, listed.stderr
    (row,) = [line for line in listed.stdout.splitlines() if "wide-one" in line]
    assert LONG_TASK in row and "America/Argentina/Buenos_Aires" in row, listed.stdout
    assert len(row) > 80
    inspected = conveyor("log", "inspect", str(dev.home), "--limit", "20")
    assert inspected.returncode == 0, inspected.stderr
    rows = [line for line in inspected.stdout.splitlines() if re.search(r"\b[0-9a-f]{32}\b", line)]
    assert rows and any(len(line) > 80 for line in rows), inspected.stdout
    assert "…" not in inspected.stdout  # nothing cut short


def test_no_help_text_cites_an_issue_number() -> None:
    """Every command's and option's help, walked in one process of the real CLI."""
    walker = """
import click, typer
from conveyor.cli.main import app

def walk(cmd, name):
    ctx = click.Context(cmd, info_name=name)
    print(cmd.get_help(ctx))
    for sub in getattr(cmd, "commands", {}).values():
        walk(sub, f"{name} {sub.name}")

walk(typer.main.get_command(app), "conveyor")
"""
    shown = subprocess.run(
        [sys.executable, "-c", walker], capture_output=True, text=True, timeout=120
    )
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.count("Usage:") > 30  # every command was shown
    cited = re.findall(r".*\b(?:issue|issues)\s*#?\d+.*|.*\(#\d+\).*", shown.stdout, re.I)
    assert cited == [], cited
