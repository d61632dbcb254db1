"""``conveyor event send``, ``conveyor schedule run``, ``Client.rerun`` and
``Client.run_schedule`` as a user meets them: subprocess commands and the SDK client against a
real ``conveyor dev`` (node, gateway, agent, guests).

- an event sent from the CLI wakes the workflow waiting for it, with its payload; a bad
  payload, an unknown workflow and a finished one fail with their exit statuses;
- ``schedule run`` enqueues the schedule's task now and leaves the schedule's next firing and
  counts as they were; an unknown schedule exits 3;
- ``Client.rerun`` enqueues a finished task again as a new task; ``Client.run_schedule`` runs
  a schedule once per call.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import pytest
from test_cli_edges import at, dev_key
from test_gateway import NodeProcess, call

import conveyor
from conveyor.errors import Conflict

pytestmark = pytest.mark.timeout(240)

FLOW_APP = """
import conveyor

app = conveyor.App("flows")


@app.task
def double(ctx, payload):
    return {"twice": payload["n"] * 2}


@app.workflow
def approval(ctx, payload):
    order = ctx.step.run("prepare", lambda: payload["order"])
    decision = ctx.wait_for_event("approved", timeout="1h")
    return {"order": order, "decision": decision}
"""


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    root = tmp_path_factory.mktemp("cli-workflows")
    (root / "flowapp.py").write_text(FLOW_APP)
    home = root / "home"
    home.mkdir()
    proc = NodeProcess(home, ("dev", "--app", "flowapp:app", "--no-projection"))
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_HOME"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    proc.start(cwd=root, env=env)
    try:
        yield proc
    finally:
        assert proc.stop(signal.SIGINT) == 0, proc.logs()


def api(dev: NodeProcess, method: str, path: str, body: Any = None) -> Any:
    """A call that must succeed, retried while the agent has not registered the app yet."""
    deadline = time.monotonic() + 60
    while True:
        status, reply = call(dev.base, method, path, body, key=dev_key(dev.home))
        if status < 300:
            return reply
        unregistered = status == 400 and "not registered" in json.dumps(reply)
        assert unregistered and time.monotonic() < deadline, (method, path, status, reply)
        time.sleep(0.2)


def wait_status(dev: NodeProcess, task_id: str, status: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        task: dict[str, Any] = api(dev, "GET", f"/v1/tasks/{task_id}")
        if task["status"] == status:
            return task
        assert time.monotonic() < deadline, f"{task_id} is {task['status']}, not {status}"
        time.sleep(0.1)


def start_approval(dev: NodeProcess, order: int) -> str:
    body = {"task_type": "approval", "app": "flows", "payload": {"order": order}}
    workflow_id = str(api(dev, "POST", "/v1/workflows", body)["task_id"])
    wait_status(dev, workflow_id, "WAITING")
    return workflow_id


def test_event_send_wakes_the_waiting_workflow(dev: NodeProcess) -> None:
    workflow_id = start_approval(dev, 7)
    bad = at(dev, "event", "send", workflow_id, "approved", "--payload", "{nope")
    assert bad.returncode == 2 and "--payload is not JSON" in bad.stderr, bad.stderr
    assert wait_status(dev, workflow_id, "WAITING")  # nothing was sent
    missing = at(dev, "event", "send", "0" * 32, "approved")
    assert missing.returncode == 3, missing.stdout + missing.stderr

    sent = at(dev, "event", "send", workflow_id, "approved", "--payload", '{"by": "cli"}')
    assert sent.returncode == 0, sent.stdout + sent.stderr
    assert "sent event approved" in sent.stdout and workflow_id in sent.stdout
    done = wait_status(dev, workflow_id, "SUCCEEDED")
    assert done["result"] == {"order": 7, "decision": {"by": "cli"}}, done

    late = at(dev, "event", "send", workflow_id, "approved", "--json")
    assert late.returncode == 4 and "SUCCEEDED" in late.stderr, late.stdout + late.stderr
    for result in (bad, missing, sent, late):
        assert "Traceback" not in result.stderr


def test_schedule_run_enqueues_now_and_leaves_the_schedule(dev: NodeProcess) -> None:
    template = {"task_type": "double", "app": "flows", "payload": {"n": 4}}
    body = {"schedule_id": "cli-run", "cron": "0 4 1 1 *", "task": template}
    before = api(dev, "POST", "/v1/schedules", body)
    ran = at(dev, "schedule", "run", "cli-run", "--json")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    reply = json.loads(ran.stdout)
    assert reply["schedule_id"] == "cli-run" and reply["created"] is True
    assert wait_status(dev, reply["task_id"], "SUCCEEDED")["result"] == {"twice": 8}
    after = api(dev, "GET", "/v1/schedules/cli-run")
    assert (after["next_fire_ms"], after["fired"], after["last_task_id"]) == (
        before["next_fire_ms"],
        0,
        None,
    )
    shown = at(dev, "schedule", "run", "cli-run")
    assert shown.returncode == 0 and "ran schedule cli-run" in shown.stdout, shown.stderr
    missing = at(dev, "schedule", "run", "no-such-schedule")
    assert missing.returncode == 3 and "no schedule" in missing.stderr, missing.stderr


def test_client_reruns_a_finished_task_and_runs_a_schedule(dev: NodeProcess) -> None:
    client = conveyor.Client(dev.base, api_key=dev_key(dev.home), app="flows")
    body = {"task_type": "double", "app": "flows", "payload": {"n": 3}, "priority": 2}
    task_id = str(api(dev, "POST", "/v1/tasks", body)["task_id"])
    wait_status(dev, task_id, "SUCCEEDED")
    new_id = client.rerun(task_id)
    assert new_id != task_id
    again = wait_status(dev, new_id, "SUCCEEDED")
    assert (again["payload"], again["priority"], again["result"]) == ({"n": 3}, 2, {"twice": 6})

    waiting = start_approval(dev, 1)
    with pytest.raises(Conflict, match="only a finished task"):
        client.rerun(waiting)
    api(dev, "POST", f"/v1/tasks/{waiting}/cancel")

    template = {"task_type": "double", "app": "flows", "payload": {"n": 9}}
    api(
        dev,
        "POST",
        "/v1/schedules",
        {"schedule_id": "sdk-run", "cron": "0 4 1 1 *", "task": template},
    )
    first, second = client.run_schedule("sdk-run"), client.run_schedule("sdk-run")
    assert first != second  # each call is a run; only a resend of one call is deduplicated
    for run_id in (first, second):
        assert wait_status(dev, run_id, "SUCCEEDED")["result"] == {"twice": 18}
    client.close()


def test_async_client_reruns_a_task_and_runs_a_schedule(dev: NodeProcess) -> None:
    body = {"task_type": "double", "app": "flows", "payload": {"n": 11}}
    task_id = str(api(dev, "POST", "/v1/tasks", body)["task_id"])
    wait_status(dev, task_id, "SUCCEEDED")
    template = {"task_type": "double", "app": "flows", "payload": {"n": 12}}
    schedule = {"schedule_id": "async-run", "cron": "0 4 1 1 *", "task": template}
    api(dev, "POST", "/v1/schedules", schedule)

    async def go() -> tuple[str, str]:
        async with conveyor.AsyncClient(dev.base, api_key=dev_key(dev.home)) as client:
            return await client.rerun(task_id), await client.run_schedule("async-run")

    rerun_id, run_id = asyncio.run(go())
    assert wait_status(dev, rerun_id, "SUCCEEDED")["result"] == {"twice": 22}
    assert wait_status(dev, run_id, "SUCCEEDED")["result"] == {"twice": 24}
