"""A real ``conveyor dev`` for the dashboard tests, driven over HTTP with urllib."""

from __future__ import annotations

import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

APP = "dashboard-tests"
START_TIMEOUT_S = 60.0


@dataclass
class Dev:
    """A running ``conveyor dev`` and the key of its ``default`` tenant."""

    base: str
    key: str
    home: Path
    proc: subprocess.Popen[bytes]

    def call(self, method: str, path: str, body: Any = None, *, key: str | None = None) -> Any:
        status, reply = http(self.base, method, path, body, key=key or self.key)
        assert status < 300, (method, path, status, reply)
        return reply

    def enqueue(self, task_type: str, payload: Any, **options: Any) -> str:
        body = {"task_type": task_type, "app": APP, "payload": payload, **options}
        return str(self.call("POST", "/v1/tasks", body)["task_id"])

    def wait_status(self, task_id: str, status: str, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while True:
            task: dict[str, Any] = self.call("GET", f"/v1/tasks/{task_id}")
            if task["status"] == status:
                return task
            assert time.monotonic() < deadline, f"{task_id} is {task['status']}, not {status}"
            time.sleep(0.1)

    def logs(self) -> str:
        path = self.home.parent / "dev.out"
        return path.read_text(errors="replace") if path.exists() else ""


def http(
    base: str, method: str, path: str, body: Any = None, *, key: str | None = None
) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(dev: Dev) -> None:
    """Healthy, then until the agent registered the app's task types (an enqueue is accepted)."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        assert dev.proc.poll() is None, f"conveyor dev exited:\n{dev.logs()}"
        assert time.monotonic() < deadline, f"conveyor dev not ready:\n{dev.logs()}"
        try:
            keys = json.loads((dev.home / "keys.json").read_text())["keys"]
            dev.key = next(k for k, e in keys.items() if e.get("role") != "agent")
            body = {"task_type": "double", "app": APP, "payload": {"n": 0}}
            if http(dev.base, "POST", "/v1/tasks", body, key=dev.key)[0] == 201:
                return
        except (OSError, ValueError, KeyError, StopIteration):
            pass
        time.sleep(0.1)
