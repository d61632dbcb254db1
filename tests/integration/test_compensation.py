"""Compensations through real processes: ``conveyor dev`` (node, gateway, agent, guest
processes, the embedded PostgreSQL snapshot) over real sockets. A workflow charges, reserves,
then sleeps; a cancel runs release and refund, newest first, once each, even though the guest
running refund dies on its first try; the workflow ends CANCELED and every step, the
compensations included, is in its history."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_gateway import KEY_A, NodeProcess, call

pytestmark = pytest.mark.timeout(240)

APP = "compapp"
COMP_APP = """
import os

import conveyor

app = conveyor.App("compapp")


def mark(path, text):
    with open(path, "a") as fh:
        fh.write(text + "\\n")


def refund(charge):
    crashed = charge["marker"] + ".crashed"
    if not os.path.exists(crashed):  # the first try dies before doing anything
        open(crashed, "w").close()
        os._exit(9)
    mark(charge["marker"], "refund " + charge["id"])
    return "refunded " + charge["id"]


def release(reservation):
    mark(reservation["marker"], "release " + reservation["id"])
    return "released " + reservation["id"]


@app.workflow(retry=conveyor.Retry(attempts=3, base="50ms", cap="100ms"))
def checkout(ctx, payload):
    marker = payload["marker"]
    ctx.step.run("charge", lambda: {"id": "ch_1", "marker": marker}, compensate=refund)
    ctx.step.run("reserve", lambda: {"id": "res_1", "marker": marker}, compensate=release)
    ctx.step.sleep("1h", name="nap")
    ctx.step.run("ship", lambda: mark(marker, "ship"))
    return "shipped"
"""


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    root = tmp_path_factory.mktemp("compensation")
    (root / "compapp.py").write_text(COMP_APP)
    home = root / "home"
    home.mkdir()
    (home / "keys.json").write_text(json.dumps({"keys": {KEY_A: {"tenant": "default"}}}))
    proc = NodeProcess(home, ("dev", "--app", "compapp:app"))
    proc.start(cwd=root)  # the app module is found in the working directory
    try:
        yield proc
    finally:
        assert proc.stop(signal.SIGINT) == 0, proc.logs()


def wait_for(what: str, check: Any, timeout_s: float = 60.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (value := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return value


def task(base: str, task_id: str) -> dict[str, Any]:
    status, body = call(base, "GET", f"/v1/tasks/{task_id}")
    assert status == 200, body
    return body  # type: ignore[no-any-return]


def test_cancel_runs_the_compensations_newest_first_once_each(
    dev: NodeProcess, tmp_path: Path
) -> None:
    marker = tmp_path / "marker"
    body = {"task_type": "checkout", "app": APP, "payload": {"marker": str(marker)}}
    reply = wait_for(
        "the agent to register",
        lambda: (r := call(dev.base, "POST", "/v1/workflows", body))[0] == 201 and r[1],
    )
    task_id = reply["task_id"]
    wait_for("the nap", lambda: task(dev.base, task_id)["status"] == "SLEEPING")
    status, canceled = call(
        dev.base, "POST", f"/v1/tasks/{task_id}/cancel", {"reason": "order withdrawn"}
    )
    assert status == 200 and canceled["status"] == "ENQUEUED", canceled  # compensating first
    status, ended = call(dev.base, "GET", f"/v1/tasks/{task_id}?wait_ms=30000", timeout=40)
    assert ended["status"] == "CANCELED", ended
    assert ended["error"]["message"] == "order withdrawn" and ended["compensating"]
    assert marker.read_text().splitlines() == ["release res_1", "refund ch_1"]
    outcomes = [a["outcome"] for a in ended["attempts"]]
    assert outcomes[-2:] == ["FAILED", "CANCELED"], ended["attempts"]  # the crash, the retry
    status, page = call(dev.base, "GET", f"/v1/workflows/{task_id}/history?limit=100")
    assert status == 200, page
    steps = {s["identity"]: s["value"] for s in page["steps"]}
    assert steps == {
        "@compensate:charge#0": True,
        "charge#0": {"id": "ch_1", "marker": str(marker)},
        "@compensate:reserve#0": True,
        "reserve#0": {"id": "res_1", "marker": str(marker)},
        "nap#0": None,
        "@undo:reserve#0": "released res_1",
        "@undo:charge#0": "refunded ch_1",
    }
