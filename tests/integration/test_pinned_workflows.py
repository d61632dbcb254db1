"""The resume policy through real processes: a node and two agents (``conveyor agent``) of
one app at versions v1 and v2. A pinned workflow whose first attempt ran on v1 resumes after
its sleep only on a v1 agent, and waits (ENQUEUED, ``waiting_for`` set) while only a v2 agent
is up and idle; a latest one resumes on v2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gateway import NodeProcess, call

import conveyor

pytestmark = pytest.mark.timeout(180)

KEY = "pinned-key-0123456789"
APP = "pinapp"
PINNED = 3  # pinned workflows, so that a lucky deal cannot pass for the rule
VERSIONED_APP = """
import conveyor

VERSION = {version!r}
app = conveyor.App("pinapp", version=VERSION)


def body(ctx):
    first = ctx.step.run("first", lambda: VERSION)
    ctx.step.sleep("2s", name="nap")
    return {{"first": first, "resumed_on": VERSION}}


@app.workflow(resume="pinned")
def pinned(ctx, _):
    return body(ctx)


@app.workflow
def latest(ctx, _):
    return body(ctx)
"""


class Agent:
    def __init__(self, root: Path, base: str, version: str) -> None:
        self.out = open(root / f"agent-{version}.out", "wb")  # noqa: SIM115
        args = ["--app", f"pin_{version}:app", "--url", base, "--api-key", KEY, "--in-process"]
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor.cli", "agent", *args, "--poll-wait-s", "1"],
            stdout=self.out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(root), "CONVEYOR_HOME": str(root / version)},
        )

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.out.close()


def until(what: str, check: Callable[[], Any], timeout_s: float = 40.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProcess]:
    for version in ("v1", "v2"):
        (tmp_path / f"pin_{version}.py").write_text(VERSIONED_APP.format(version=version))
    home = tmp_path / "home"
    home.mkdir()
    (home / "keys.json").write_text(json.dumps({"keys": {KEY: {"tenant": "default"}}}))
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start()
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def workflow(base: str, task_id: str) -> dict[str, Any]:
    status, body = call(base, "GET", f"/v1/workflows/{task_id}", key=KEY)
    assert status == 200, body
    return body["workflow"]  # type: ignore[no-any-return]


def start(client: conveyor.Client, task_type: str, resume: str) -> conveyor.TaskHandle:
    app = conveyor.App(APP)  # the caller's view of the app: the decorator sets the policy
    task = app.workflow(name=task_type, resume=resume)(lambda ctx, _: None)
    deadline = time.monotonic() + 30
    while True:  # until an agent registered the app's task types
        try:
            return client.enqueue(task)
        except conveyor.ContractError as exc:
            assert exc.code == "unknown_task_type" and time.monotonic() < deadline
            time.sleep(0.1)


def test_a_pinned_workflow_resumes_only_on_its_version(node: NodeProcess, tmp_path: Path) -> None:
    base = node.base
    v1 = Agent(tmp_path, base, "v1")
    with conveyor.Client(base, KEY, app=APP) as client:
        try:
            handles = [start(client, "pinned", "pinned") for _ in range(PINNED - 1)]
            # Named by an HTTP caller that says no policy: the one its agents registered.
            body = {"task_type": "pinned", "app": APP}
            status, reply = call(base, "POST", "/v1/workflows", body, key=KEY)
            assert status == 201, reply
            handles.append(conveyor.TaskHandle(client, reply["task_id"]))
            latest_handle = start(client, "latest", "latest")
            pinned = [h.id for h in handles]
            latest = latest_handle.id
            every = [*pinned, latest]
            until(
                "every first attempt to sleep on v1",
                lambda: all(workflow(base, t)["status"] == "SLEEPING" for t in every),
            )
            assert {workflow(base, t)["app_version"] for t in every} == {"v1"}
        finally:
            v1.stop()
        v2 = Agent(tmp_path, base, "v2")
        try:
            assert latest_handle.result(timeout=60) == {"first": "v1", "resumed_on": "v2"}
            # The latest one woke with them: the pinned ones are ready, and v2 is idle.
            until(
                "the pinned workflows to wake",
                lambda: all(workflow(base, t)["status"] == "ENQUEUED" for t in pinned),
            )
            time.sleep(2.0)  # two of v2's poll periods: it is offered none of them
            for task_id in pinned:
                w = workflow(base, task_id)
                assert w["status"] == "ENQUEUED" and w["resume"] == "pinned", w
                assert w["app_version"] == "v1" and "version 'v1'" in w["waiting_for"], w
            v1 = Agent(tmp_path, base, "v1")  # back, next to the idle v2
            try:
                for handle in handles:
                    assert handle.result(timeout=60) == {"first": "v1", "resumed_on": "v1"}
            finally:
                v1.stop()
        finally:
            v2.stop()
