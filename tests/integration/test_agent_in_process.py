"""``conveyor agent --in-process``: handlers run on the agent's own threads (trusted code,
no guest hop), against a real node, with the same results and retries as in guests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_gateway import NodeProcess

import conveyor

pytestmark = pytest.mark.timeout(120)

KEY = "in-process-key-0123456789"
HERE = Path(__file__).parent


def test_an_in_process_agent_runs_handlers_in_its_own_process(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    (home / "keys.json").write_text(json.dumps({"keys": {KEY: {"tenant": "default"}}}))
    node = NodeProcess(home, ("node", "--no-projection"))
    node.start()
    out = open(tmp_path / "agent.out", "wb")  # noqa: SIM115
    args = ["--app", "agent_app:app", "--url", node.base, "--api-key", KEY, "--in-process"]
    agent = subprocess.Popen(
        [sys.executable, "-m", "conveyor.cli", "agent", *args, "--poll-wait-s", "1"],
        stdout=out,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(HERE), "CONVEYOR_HOME": str(tmp_path / "agent")},
    )
    try:
        with conveyor.Client(node.base, KEY, app="agent-tests") as client:
            deadline = time.monotonic() + 30
            while True:  # until the agent has registered the app's task types
                try:
                    echo = client.enqueue("echo", {"n": 1})
                    break
                except conveyor.ContractError as exc:
                    assert exc.code == "unknown_task_type" and time.monotonic() < deadline
                    time.sleep(0.1)
            result = echo.result(timeout=60)
            assert result["payload"] == {"n": 1} and result["pid"] == agent.pid
            refused = client.enqueue("refuse", "this")
            with pytest.raises(conveyor.TaskFailed) as err:
                refused.result(timeout=60)
            assert err.value.error_class == "FatalError"
    finally:
        agent.terminate()
        agent.wait(timeout=30)
        out.close()
        assert node.stop() == 0, node.logs()
