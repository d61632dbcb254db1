"""``examples/fastapi_app.py`` and ``examples/wsgi_app.py`` run for real against a real
``conveyor dev`` (node, gateway, agent, guests) serving ``examples.shop``: FastAPI under uvicorn
in a subprocess, with its one ``AsyncClient`` made in the lifespan; the WSGI app under a
threaded wsgiref server in a thread, with one sync ``Client``. Each enqueues from a web
request, and the task runs on the agent."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
from test_cli_edges import dev_key
from test_gateway import NodeProcess, free_port

import conveyor
from conveyor.errors import ContractError
from examples import shop

pytestmark = pytest.mark.timeout(240)

ROOT = Path(__file__).resolve().parents[2]
DEADLINE_S = 60.0


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("webapps") / "home"
    home.mkdir()
    proc = NodeProcess(home, ("dev", "--app", "examples.shop:app", "--no-projection"))
    env = {k: v for k, v in os.environ.items() if k != "CONVEYOR_HOME"}
    proc.start(cwd=ROOT, env=env)
    try:
        wait_registered(proc)
        yield proc
    finally:
        assert proc.stop(signal.SIGINT) == 0, proc.logs()


def wait_registered(dev: NodeProcess) -> None:
    """Until the agent has registered the shop's task types (an enqueue is refused before)."""
    with conveyor.Client(dev.base, api_key=dev_key(dev.home)) as client:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            try:
                client.enqueue(shop.send_receipt, {"order": 0, "email": "warm@example.com"})
                return
            except ContractError as exc:
                if "is not registered" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


def poll(base: str, task_id: str) -> dict[str, Any]:
    """The example's own GET /tasks/{id} until the task finished."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        reply = httpx.get(f"{base}/tasks/{task_id}", timeout=10)
        assert reply.status_code == 200, reply.text
        task: dict[str, Any] = reply.json()
        if task["status"] in ("SUCCEEDED", "FAILED", "CANCELED"):
            return task
        assert time.monotonic() < deadline, f"task {task_id} still {task['status']}"
        time.sleep(0.05)


@pytest.fixture
def uvicorn_app(dev: NodeProcess, tmp_path: Path) -> Iterator[str]:
    port = free_port()
    env = {**os.environ, "CONVEYOR_URL": dev.base, "CONVEYOR_API_KEY": dev_key(dev.home)}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = tmp_path / "uvicorn.out"
    command = [sys.executable, "-m", "uvicorn", "examples.fastapi_app:web"]
    command += ["--host", "127.0.0.1", "--port", str(port)]
    with open(out, "wb") as log:
        proc = subprocess.Popen(command, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + DEADLINE_S
        while True:
            assert proc.poll() is None, out.read_text()
            try:
                httpx.get(f"{base}/docs", timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, out.read_text()
                time.sleep(0.05)
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0, out.read_text()
    # The lifespan closed its client as uvicorn shut down: no error on the way out.
    assert "Traceback" not in out.read_text(), out.read_text()


def test_fastapi_enqueues_from_a_request_and_the_task_runs(uvicorn_app: str) -> None:
    receipts = [{"order": n, "email": f"buyer{n}@example.com"} for n in range(1, 9)]
    with ThreadPoolExecutor(8) as pool:  # requests at once share the app's one client
        replies = list(
            pool.map(lambda r: httpx.post(f"{uvicorn_app}/receipts", json=r, timeout=30), receipts)
        )
    assert [r.status_code for r in replies] == [202] * 8, [r.text for r in replies]
    for receipt, reply in zip(receipts, replies, strict=True):
        task = poll(uvicorn_app, reply.json()["task_id"])
        assert task["status"] == "SUCCEEDED" and task["result"] == {"sent_to": receipt["email"]}
    again = httpx.post(f"{uvicorn_app}/receipts", json=receipts[0], timeout=30)
    assert again.json() == {"task_id": replies[0].json()["task_id"], "created": False}
    bad = httpx.post(f"{uvicorn_app}/receipts", json={"order": "x"}, timeout=30)
    assert bad.status_code == 422  # FastAPI's validation: nothing was enqueued
    assert httpx.get(f"{uvicorn_app}/tasks/{'0' * 32}", timeout=10).status_code == 404


def test_wsgi_enqueues_from_a_request_and_the_task_runs(dev: NodeProcess) -> None:
    from examples import wsgi_app

    with conveyor.Client(dev.base, api_key=dev_key(dev.home)) as client:
        server = wsgi_app.serve(client, port=0)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_port}"
        try:
            forms = [f"order={n}&email=wsgi{n}@example.com" for n in range(100, 108)]
            headers = {"Content-Type": "application/x-www-form-urlencoded"}
            with ThreadPoolExecutor(8) as pool:
                replies = list(
                    pool.map(
                        lambda f: httpx.post(
                            f"{base}/receipts", content=f, headers=headers, timeout=30
                        ),
                        forms,
                    )
                )
            assert [r.status_code for r in replies] == [202] * 8, [r.text for r in replies]
            for n, reply in zip(range(100, 108), replies, strict=True):
                task = poll(base, reply.json()["task_id"])
                assert task["status"] == "SUCCEEDED"
                assert task["result"] == {"sent_to": f"wsgi{n}@example.com"}
            bad = httpx.post(f"{base}/receipts", content="order=x", headers=headers, timeout=30)
            assert bad.status_code == 400 and "order must be a number" in bad.json()["error"]
            assert httpx.get(f"{base}/tasks/{'0' * 32}", timeout=10).status_code == 404
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)
