"""Pausing a queue through a real ``conveyor node`` process and a real host agent over HTTP:
paused, nothing of it runs (its tasks stay ENQUEUED; enqueues are accepted; other queues run),
across a restart of the node; resumed, it runs. The CLI's ``queue`` commands against it.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import agent_app
import httpx
import pytest
from test_agent import APP_REF, DEADLINE_S, free_port, until, wait_healthy

from conveyor.agents.host import HostAgent
from conveyor.agents.worker_api import HttpWorkerAPI

pytestmark = pytest.mark.timeout(300)

KEY = "pause-test-key-0123456789"


class NodeProc:
    def __init__(self, home: Path) -> None:
        self.home = home
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        out_path = self.home.parent / "node.out"
        cmd = [sys.executable, "-m", "conveyor.cli", "node", "--home", str(self.home)]
        cmd += ["--port", str(self.port), "--partitions", "2"]
        with open(out_path, "ab") as out:
            self.proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        wait_healthy(self.base, self.proc, out_path)

    def stop(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def call(self, method: str, path: str, body: Any = None) -> Any:
        headers = {"Authorization": f"Bearer {KEY}"}
        reply = httpx.request(method, self.base + path, json=body, headers=headers, timeout=30)
        assert reply.status_code < 300, (method, path, reply.status_code, reply.text)
        return reply.json()

    def cli(self, *args: str) -> str:
        cmd = [sys.executable, "-m", "conveyor.cli", *args, "--url", self.base, "--api-key", KEY]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + done.stdout
        return done.stdout


@pytest.fixture
def node(tmp_path: Path) -> Iterator[NodeProc]:
    home = tmp_path / "home"
    home.mkdir()
    (home / "keys.json").write_text(json.dumps({"keys": {KEY: {"tenant": "default"}}}))
    n = NodeProc(home)
    n.start()
    try:
        yield n
    finally:
        n.stop()


def _enqueue(node: NodeProc, queue: str, n: int) -> str:
    body = {"task_type": "echo", "app": agent_app.app.name, "payload": {"n": n}, "queue": queue}
    return str(node.call("POST", "/v1/tasks", body)["task_id"])


def _status(node: NodeProc, task_id: str) -> str:
    return str(node.call("GET", f"/v1/tasks/{task_id}")["status"])


def _polls(node: NodeProc) -> int:
    return sum(a["polls"] for a in node.call("GET", "/v1/agents")["agents"])


def _queue(node: NodeProc, name: str) -> dict[str, Any]:
    (entry,) = [q for q in node.call("GET", "/v1/queues")["queues"] if q["queue"] == name]
    return entry


async def _quiet_through_polls(node: NodeProc, polls: int) -> None:
    """Until the agents polled ``polls`` more times: each was a chance to lease, so a paused
    task still ENQUEUED then was passed over, not merely not reached yet."""
    start = await asyncio.to_thread(_polls, node)
    await until(f"{polls} more polls", lambda: _polls(node) >= start + polls)


def test_a_paused_queue_runs_nothing_across_a_restart_and_runs_when_resumed(
    node: NodeProc, tmp_path: Path
) -> None:
    async def main() -> None:
        api = HttpWorkerAPI(node.base, KEY)
        agent = HostAgent(api, APP_REF, log_dir=tmp_path / "logs", heartbeat_s=0.3, poll_wait_s=0.3)
        running = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(agent.started.wait(), DEADLINE_S)
            assert node.call("POST", "/v1/queues/held/pause") == {"queue": "held", "paused": True}
            held = [_enqueue(node, "held", n) for n in range(3)]  # accepted while paused
            free = _enqueue(node, "free", 9)
            await until("the other queue's task", lambda: _status(node, free) == "SUCCEEDED")
            await _quiet_through_polls(node, 3)
            assert [_status(node, t) for t in held] == ["ENQUEUED"] * 3
            await until("the snapshot", lambda: _queue(node, "held")["depth"] == {"ENQUEUED": 3})
            entry = _queue(node, "held")
            assert (entry["paused"], entry["paused_partitions"]) == (True, 2)
            assert _queue(node, "free")["paused"] is False

            node.stop()  # the pause is the partitions' state: it outlives the process
            node.start()
            await _quiet_through_polls(node, 3)  # the agent came back to the new process
            assert [_status(node, t) for t in held] == ["ENQUEUED"] * 3
            assert "held" in node.cli("queue", "list") and "paused" in node.cli("queue", "list")

            assert "resumed queue held" in node.cli("queue", "resume", "held")
            for task_id in held:
                await until(f"{task_id} to run", lambda t=task_id: _status(node, t) == "SUCCEEDED")
            assert _queue(node, "held")["paused"] is False
        finally:
            agent.stop()
            await asyncio.wait_for(running, DEADLINE_S)
            await api.close()

    asyncio.run(main())


@pytest.mark.parametrize(
    ("name", "fault"),
    [
        ("x" * 300, "got 300 characters"),
        # Names no enqueue can give a queue (its pattern in the document): accepted, they
        # answered 200 and paused nothing.
        ("%C3%A5p", "got U+00E5 at index 0"),
        ("a%20b", "got U+0020 at index 1"),
        ("a%5Cb", "got U+005C at index 1"),
    ],
)
def test_a_bad_queue_name_is_refused_naming_it(node: NodeProc, name: str, fault: str) -> None:
    for verb in ("pause", "resume"):
        reply = httpx.post(
            f"{node.base}/v1/queues/{name}/{verb}",
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=30,
        )
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error["field"] == "queue" and fault in error["message"], error
        assert "characters from A-Z a-z 0-9 _ . : -" in error["message"], error
    assert all(not q.get("paused") for q in node.call("GET", "/v1/queues")["queues"])
