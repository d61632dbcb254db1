"""``conveyor.logs``: a record logged while a handler runs carries the attempt's task id,
attempt and task type (from ``ctx.logger``, or any logger through ``TaskFields``), as text or
as one JSON object a line; ``CONVEYOR_LOG_JSON`` turns JSON on."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from conveyor import logs
from conveyor.context import Context, running
from conveyor.steps import StepAck


class Quiet:
    def heartbeat(self, progress: object) -> None: ...

    def checkpoint(self, value: object) -> None: ...

    def step(self, op: str, identity: str, position: int, value: object) -> StepAck:
        return StepAck(ok=True)


def context(task_id: str = "t1", attempt: int = 2, task_type: str = "send") -> Context:
    return Context(
        task_id=task_id, task_type=task_type, attempt=attempt, checkpoint=None, channel=Quiet()
    )


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """What ``logs.configure`` writes; the root logger's handlers as they were after."""
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    try:
        yield io.StringIO()
    finally:
        root.handlers[:] = saved
        root.setLevel(level)


def test_json_lines_carry_the_attempt_from_ctx_logger_and_from_any_logger(
    captured: io.StringIO,
) -> None:
    out = captured
    logs.configure("INFO", as_json=True, stream=out)
    ctx = context()
    with running(ctx):
        ctx.logger.info("charged %d", 5)
        logging.getLogger("lib").warning("from a library")
    logging.getLogger("lib").warning("outside any task")
    try:
        raise ValueError("boom")
    except ValueError:
        logging.getLogger("lib").exception("failed")
    first, second, third, fourth = (json.loads(line) for line in out.getvalue().splitlines())
    assert first["message"] == "charged 5" and first["logger"] == "conveyor.task.send"
    for entry in (first, second):
        assert (entry["task_id"], entry["attempt"], entry["task_type"]) == ("t1", 2, "send")
    assert second["level"] == "WARNING" and second["logger"] == "lib"
    assert "task_id" not in third and third["message"] == "outside any task"
    assert fourth["exc"].startswith("Traceback") and "ValueError: boom" in fourth["exc"]
    assert first["ts"].endswith("Z")


def test_text_lines_end_with_the_attempt(captured: io.StringIO) -> None:
    out = captured
    logs.configure("INFO", as_json=False, stream=out)
    ctx = context()
    with running(ctx):
        logging.getLogger("lib").warning("inside")
    logging.getLogger("lib").warning("outside")
    inside, outside = out.getvalue().splitlines()
    assert inside.endswith("WARNING lib: inside [send t1 attempt 2]")
    assert outside.endswith("WARNING lib: outside")


def test_coroutines_side_by_side_keep_their_own_fields(
    captured: io.StringIO,
) -> None:
    out = captured
    logs.configure("INFO", as_json=True, stream=out)

    async def attempt(n: int) -> None:
        with running(context(task_id=f"t{n}", attempt=1)):
            for step in range(3):
                logging.getLogger("lib").warning("task %d step %d", n, step)
                await asyncio.sleep(0)

    async def main() -> None:
        await asyncio.gather(*(attempt(n) for n in range(4)))

    asyncio.run(main())
    entries = [json.loads(line) for line in out.getvalue().splitlines()]
    assert len(entries) == 12
    assert [e["task_id"] for e in entries[:4]] == ["t0", "t1", "t2", "t3"]  # interleaved
    for entry in entries:
        assert entry["message"].startswith(f"task {entry['task_id'][1:]} ")


@pytest.mark.parametrize(
    ("value", "wanted"), [("1", True), ("true", True), ("ON", True), ("0", False), ("", False)]
)
def test_the_environment_turns_json_on(
    monkeypatch: pytest.MonkeyPatch, value: str, wanted: bool
) -> None:
    monkeypatch.setenv(logs.LOG_JSON_ENV, value)
    assert logs.json_wanted() is wanted
    assert logs.json_wanted(True) is True
