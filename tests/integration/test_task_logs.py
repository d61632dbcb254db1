"""Task-aware logs from real guests: a handler's records (``ctx.logger`` and any other logger)
carry its task id, attempt and task type, in the attempt's own log range; as JSON lines with
``CONVEYOR_LOG_JSON=1`` on the agent (its guests follow), or with ``conveyor dev --log-json``;
as text lines ending ``[task_type task_id attempt N]`` otherwise."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import logging_app
import pytest
from test_agent import rig, run
from test_cli_edges import dev_key
from test_gateway import NodeProcess

import conveyor
from conveyor import logs
from conveyor.agents.sandbox import read_log
from conveyor.errors import ContractError

pytestmark = pytest.mark.timeout(180)

APP_REF = "logging_app:app"
HERE = Path(__file__).resolve().parent


def json_lines(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


async def attempt_logs(r: Any, items: list[tuple[Any, Any]]) -> dict[str, str]:
    """Run ``items``; the output of each one's attempt, by task id."""
    log_refs: dict[str, str | None] = {}
    report = r.api.complete

    async def capture(done: Any) -> Any:
        log_refs.update((item.task_id, item.log_ref) for item in done)
        return await report(done)

    r.api.complete = capture
    ids = await r.enqueue_many(items)
    for task_id in ids:
        assert (await r.finished(task_id)).status == "SUCCEEDED"
    return {task_id: read_log(str(log_refs[task_id])) for task_id in ids}


def test_json_logs_from_a_guest_carry_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(logs.LOG_JSON_ENV, "1")

    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF) as r:
            out = await attempt_logs(r, [(logging_app.chatty, "bob")])
            ((bob, text),) = out.items()
            hello, library = json_lines(text)
            assert hello["message"] == "hello from bob"
            assert hello["logger"] == "conveyor.task.chatty" and hello["level"] == "INFO"
            assert library["message"] == "library line for bob"
            assert library["logger"] == "some.library"
            for entry in (hello, library):
                assert (entry["task_id"], entry["attempt"], entry["task_type"]) == (
                    bob,
                    1,
                    "chatty",
                )

    run(main)


def test_concurrent_attempts_in_one_guest_log_their_own_fields(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(logs.LOG_JSON_ENV, "1")

    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF, concurrency=4) as r:
            names = ["a", "b", "c", "d"]
            out = await attempt_logs(r, [(logging_app.chatty_async, n) for n in names])
            # The attempts ran at once: each one's range holds lines of the others too, but
            # every line names the attempt that logged it.
            seen: dict[str, set[str]] = {}
            for text in out.values():
                for entry in json_lines(text):
                    assert entry["task_type"] == "chatty_async"
                    seen.setdefault(entry["task_id"], set()).add(entry["message"])
            assert set(seen) == set(out)
            by_name = {next(iter(m)).split()[1]: t for t, m in seen.items()}
            for name, task_id in by_name.items():
                assert seen[task_id] == {f"async {name} step {s}" for s in range(3)}

    run(main)


def test_text_logs_from_a_guest_end_with_the_attempt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(logs.LOG_JSON_ENV, raising=False)

    async def main() -> None:
        async with rig(tmp_path, app_ref=APP_REF) as r:
            ((task_id, text),) = (await attempt_logs(r, [(logging_app.chatty, "cy")])).items()
            assert not json_lines(text)
            assert f"INFO conveyor.task.chatty: hello from cy [chatty {task_id} attempt 1]" in text
            assert f"some.library: library line for cy [chatty {task_id} attempt 1]" in text

    run(main)


def test_conveyor_dev_log_json_makes_its_guests_log_json(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    proc = NodeProcess(home, ("dev", "--app", APP_REF, "--no-projection", "--log-json"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    proc.start(cwd=HERE, env=env)
    try:
        with conveyor.Client(proc.base, api_key=dev_key(home)) as client:
            deadline = time.monotonic() + 60
            while True:
                try:
                    handle = client.enqueue(logging_app.chatty, "dee")
                    break
                except ContractError as exc:
                    if "is not registered" not in str(exc) or time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            assert handle.result(timeout=60) == "dee"
        entries = [
            entry
            for path in home.glob("logs/logging-tests/guests/*.log")
            for entry in json_lines(path.read_text())
        ]
        mine = [e for e in entries if e.get("task_id") == handle.id]
        assert {e["message"] for e in mine} == {"hello from dee", "library line for dee"}
        assert all(e["task_type"] == "chatty" and e["attempt"] == 1 for e in mine)
    finally:
        assert proc.stop(signal.SIGINT) == 0, proc.logs()
    # The dev process's own lines are JSON too.
    own = [line for line in proc.logs().splitlines() if line.startswith("{")]
    assert own and all(json.loads(line)["level"] for line in own)
