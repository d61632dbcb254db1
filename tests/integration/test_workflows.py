"""Workflows through real processes: ``conveyor dev`` (node, gateway, agent, guest processes)
over real sockets, driven with urllib. ``ctx.parallel`` in collect mode with a failing child,
fail_fast cancelling the siblings, results in order, cancel cascading to the children, and the
workflow API (``/v1/workflows``) with its tenancy and paged history."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_gateway import KEY_A, KEY_B, NodeProcess, call

import conveyor

pytestmark = pytest.mark.timeout(180)

APP = "wfapp"
WF_APP = """
import conveyor

app = conveyor.App("wfapp")


@app.task(retry=conveyor.Retry(attempts=1))
def square(n):
    if n < 0:
        raise conveyor.FatalError(f"{n} is negative")
    return n * n


@app.task
def slow(ctx, n):
    ctx.wait_cancelled(60)
    ctx.raise_if_cancelled()
    return n


@app.workflow
def collect(ctx, numbers):
    results = ctx.parallel("squares", [(square, n) for n in numbers])
    return [
        {"error": r.error_class, "status": r.status} if isinstance(r, conveyor.ChildError) else r
        for r in results
    ]


@app.workflow
def fast(ctx, _):
    try:
        ctx.parallel("mixed", [(slow, 1), (slow, 2), (square, -5)], mode="fail_fast")
    except conveyor.ChildFailed as exc:
        return {"failed": exc.task_id, "index": exc.index, "status": exc.status}
    return "not reached"


@app.workflow
def parks(ctx, n):
    return ctx.parallel("slow", [(slow, i) for i in range(n)])


@app.workflow
def approval(ctx, _):
    return {"decision": ctx.wait_for_event("approved", timeout="1h")}


@app.workflow
def many(ctx, n):
    total = sum(ctx.step.run(f"s{i}", lambda i=i: i) for i in range(n))
    ctx.step.sleep("1h", name="nap")
    return total
"""


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    root = tmp_path_factory.mktemp("workflows")
    (root / "wfapp.py").write_text(WF_APP)
    home = root / "home"
    home.mkdir()
    keys = {KEY_A: {"tenant": "default"}, KEY_B: {"tenant": "beta"}}
    (home / "keys.json").write_text(json.dumps({"keys": keys}))
    proc = NodeProcess(home, ("dev", "--app", "wfapp:app", "--no-projection"))
    proc.start(cwd=root)  # the app module is found in the working directory
    try:
        yield proc
    finally:
        assert proc.stop(signal.SIGINT) == 0, proc.logs()


def start(base: str, task_type: str, payload: Any) -> str:
    body = {"task_type": task_type, "app": APP, "payload": payload}
    deadline = time.monotonic() + 30
    while True:  # the agent registers its task types shortly after the node is up
        status, reply = call(base, "POST", "/v1/workflows", body)
        if status != 400 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert status == 201, reply
    return str(reply["task_id"])


def finished(base: str, task_id: str) -> dict[str, Any]:
    status, task = call(base, "GET", f"/v1/tasks/{task_id}?wait_ms=30000", timeout=40)
    assert status == 200 and task["finished_ms"] is not None, task
    return task  # type: ignore[no-any-return]


def wait_for(check: Any, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


def test_collect_resumes_with_results_in_order_and_the_failing_child_in_place(
    dev: NodeProcess,
) -> None:
    workflow_id = start(dev.base, "collect", [2, -1, 3])
    task = finished(dev.base, workflow_id)
    assert task["status"] == "SUCCEEDED", task
    assert task["result"] == [4, {"error": "FatalError", "status": "FAILED"}, 9]
    assert [a["outcome"] for a in task["attempts"]] == ["FANNED_OUT", "SUCCEEDED"]
    status, wf = call(dev.base, "GET", f"/v1/workflows/{workflow_id}")
    assert status == 200, wf
    assert wf["workflow"]["status"] == "SUCCEEDED"
    # (a finished task's step rows may be collected; its parallel steps' barriers stay)
    (parallel,) = wf["parallel"]
    assert parallel["fired"] and parallel["total"] == 3 and parallel["mode"] == "COLLECT"
    assert parallel["counts"] == {"FAILED": 1, "SUCCEEDED": 2}
    assert [c["status"] for c in parallel["children"]] == ["SUCCEEDED", "FAILED", "SUCCEEDED"]
    for child in parallel["children"]:
        assert child["task_id"][:4] == workflow_id[:4]  # on the workflow's partition
    # Another tenant sees no such workflow.
    assert call(dev.base, "GET", f"/v1/workflows/{workflow_id}", key=KEY_B)[0] == 404
    assert call(dev.base, "GET", f"/v1/workflows/{workflow_id}/history", key=KEY_B)[0] == 404


def test_fail_fast_cancels_the_running_siblings(dev: NodeProcess) -> None:
    workflow_id = start(dev.base, "fast", None)
    task = finished(dev.base, workflow_id)
    assert task["status"] == "SUCCEEDED", task
    _, wf = call(dev.base, "GET", f"/v1/workflows/{workflow_id}")
    children = wf["parallel"][0]["children"]
    assert task["result"] == {"failed": children[2]["task_id"], "index": 2, "status": "FAILED"}
    for child in children[:2]:
        assert finished(dev.base, child["task_id"])["status"] == "CANCELED"


def test_cancel_of_a_waiting_workflow_cascades_to_its_running_children(dev: NodeProcess) -> None:
    workflow_id = start(dev.base, "parks", 3)

    def waiting() -> bool:
        return bool(call(dev.base, "GET", f"/v1/tasks/{workflow_id}")[1]["status"] == "WAITING")

    assert wait_for(waiting), call(dev.base, "GET", f"/v1/tasks/{workflow_id}")
    _, wf = call(dev.base, "GET", f"/v1/workflows/{workflow_id}")
    assert [(s["identity"], s["kind"], s["state"]) for s in wf["steps"]] == [
        ("slow#0", "parallel", "WAITING")
    ]
    assert wf["parallel"][0]["fired"] is False and wf["parallel"][0]["total"] == 3
    assert call(dev.base, "POST", f"/v1/tasks/{workflow_id}/cancel")[1]["status"] == "CANCELED"
    for child in wf["parallel"][0]["children"]:
        assert finished(dev.base, child["task_id"])["status"] == "CANCELED"
    assert finished(dev.base, workflow_id)["status"] == "CANCELED"


def test_history_pages_through_every_step(dev: NodeProcess) -> None:
    workflow_id = start(dev.base, "many", 25)  # 25 steps, then a durable sleep of an hour

    def sleeping() -> bool:
        return bool(call(dev.base, "GET", f"/v1/tasks/{workflow_id}")[1]["status"] == "SLEEPING")

    assert wait_for(sleeping), call(dev.base, "GET", f"/v1/tasks/{workflow_id}")
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        query = "?limit=10" + (f"&cursor={cursor}" if cursor else "")
        status, page = call(dev.base, "GET", f"/v1/workflows/{workflow_id}/history{query}")
        assert status == 200, page
        pages += 1
        assert len(page["steps"]) <= 10
        seen += [s["identity"] for s in page["steps"] if s["committed"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == 3 and sorted(seen) == sorted([*(f"s{i}#0" for i in range(25)), "nap#0"])
    with conveyor.Client(dev.base, KEY_A) as client:
        wf = client.get_workflow(workflow_id)
        assert wf.workflow.status == "SLEEPING"
        assert wf.steps[-1].kind == "sleep" and wf.steps[-1].state == "SLEEPING"
        page = client.workflow_history(workflow_id, limit=20)
        assert len(page.steps) == 20
        rest = client.workflow_history(workflow_id, cursor=page.next_cursor)
        assert len(rest.steps) == 6 and rest.next_cursor is None
        client.cancel(workflow_id)
    status, bad = call(dev.base, "GET", f"/v1/workflows/{workflow_id}/history?cursor=%%%")
    assert status == 400 and bad["error"]["field"] == "cursor"


def test_an_event_wakes_a_waiting_workflow_over_http(dev: NodeProcess) -> None:
    workflow_id = start(dev.base, "approval", None)

    def waiting() -> bool:
        return bool(call(dev.base, "GET", f"/v1/tasks/{workflow_id}")[1]["status"] == "WAITING")

    assert wait_for(waiting), call(dev.base, "GET", f"/v1/tasks/{workflow_id}")
    path = f"/v1/workflows/{workflow_id}/events"
    assert call(dev.base, "POST", path, {"name": "approved"}, key=KEY_B)[0] == 404
    status, bad = call(dev.base, "POST", path, {"payload": 1})
    assert status == 400 and bad["error"]["field"] == "name"
    status, big = call(dev.base, "POST", path, {"name": "approved", "payload": "x" * 300_000})
    assert status == 400 and big["error"]["field"] == "payload"
    with conveyor.Client(dev.base, KEY_A) as client:
        assert client.send_event(workflow_id, "approved", {"by": "ann"}) == "ENQUEUED"
    task = finished(dev.base, workflow_id)
    assert task["result"] == {"decision": {"by": "ann"}}, task
    status, done = call(dev.base, "POST", path, {"name": "approved"})
    assert status == 409 and "SUCCEEDED" in done["error"]["message"]
