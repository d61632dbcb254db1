"""``conveyor.testing.Engine`` answers as a deployed node does: one scenario (enqueue, list,
the retry of a FAILED task, cancel, an idempotency key reused with another payload, bad
requests, a workflow with a step and a child) runs against the engine and against a
``conveyor dev`` process (its agent running the app in guests), and the two normalized
transcripts must be equal: statuses, results, error classes, codes and messages, the fields
of every reply. Ids, times, cursors and where an attempt ran differ from run to run, so ids
become names in order of first appearance, cursors only say whether there is one, and times,
worker ids and stacks are dropped; nothing else is.

``conveyor dev`` runs twice: without its snapshot (``--no-projection``: it reads RocksDB, as
the engine does), where every answer must match, and in its default setup (PostgreSQL
snapshot), where lists leave ``priority`` null as PROTOCOL.md says, and an ended workflow's
steps are read from the snapshot: the engine has none, so that one difference is a strict
xfail, which turns red the day the engine reads them alike.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgspec
import parity_app
import pytest
from test_gateway import NodeProcess, call

import conveyor
from conveyor.testing import Engine

pytestmark = pytest.mark.timeout(240)

HERE = Path(__file__).parent
REGISTER_S = 60.0  # the dev agent registers once its guests are up
WAIT_S = 60.0
ID = re.compile(r"\b[0-9a-f]{32}\b")
TIMES = re.compile(r"(_ms|_at)$")


Transcript = list[tuple[str, Any]]


def scenario(client: conveyor.Client) -> Transcript:
    """What a user's code would do, each answer recorded as it came."""
    out: Transcript = []

    def record(what: str, call: Callable[[], Any]) -> Any:
        try:
            value = call()
        except conveyor.ConveyorError as exc:
            out.append((what, {"raised": type(exc).__name__, "reply": exc.to_json()}))
            return None
        out.append((what, value))
        return value

    def finished(task_id: str) -> conveyor.TaskInfo:
        info = client.wait(task_id, WAIT_S)
        assert info.finished, info
        return info

    ok = record("enqueue", lambda: client.enqueue(parity_app.double, 21, idempotency_key="k1"))
    record("enqueued task", lambda: finished(ok.id))
    record("result", lambda: ok.result(WAIT_S))
    record(
        "same key, same payload",
        lambda: client.enqueue(parity_app.double, 21, idempotency_key="k1"),
    )
    record(
        "same key, other payload",
        lambda: client.enqueue(parity_app.double, 22, idempotency_key="k1"),
    )
    record("unknown task type", lambda: client.enqueue("nope", 1))
    record("bad delay", lambda: client.enqueue(parity_app.double, 1, delay=-5))

    failed = record("enqueue failing", lambda: client.enqueue(parity_app.refuse, "no"))
    record("failed task", lambda: finished(failed.id))
    record("list FAILED", lambda: client.list(status="FAILED"))
    record("list of a type", lambda: client.list(task_type="double", limit=1))
    record("list bad status", lambda: client.list(status="LOST"))
    retried = record("retry FAILED", lambda: client.retry_failed([failed.id]))
    record("retried task", lambda: finished(retried[failed.id]))
    record("retry a SUCCEEDED one", lambda: client.retry_failed([ok.id]))

    later = record("enqueue delayed", lambda: client.enqueue(parity_app.double, 5, delay="1h"))
    record("cancel", lambda: later.cancel())
    record("canceled task", lambda: client.get(later.id))
    record("cancel again", lambda: later.cancel())
    record("cancel unknown", lambda: client.cancel("0" * 32))

    flow = record("enqueue workflow", lambda: client.enqueue(parity_app.order, 4))
    record("workflow task", lambda: finished(flow.id))
    record("workflow", lambda: client.get_workflow(flow.id))
    record("workflow history", lambda: client.workflow_history(flow.id))
    return out


def normalized(transcript: Transcript) -> list[tuple[str, Any]]:
    """Ids named in order of first appearance, times dropped, handles, dataclasses and reply
    models as plain data: what is left must be the same on both sides."""
    names: dict[str, str] = {}

    def name(match: re.Match[str]) -> str:
        return names.setdefault(match.group(0), f"<id{len(names)}>")

    def plain(value: Any) -> Any:
        if isinstance(value, conveyor.TaskHandle):
            return plain({"handle": value.id, "created": value.created})
        if isinstance(value, msgspec.Struct):  # a reply model (a workflow, its history)
            return plain(msgspec.to_builtins(value))
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return plain(dataclasses.asdict(value))
        if isinstance(value, dict):
            return {plain(k): _opaque(k, plain(v)) for k, v in value.items() if not _timed(k)}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        if isinstance(value, str):
            return ID.sub(name, value)
        return value

    return [(what, plain(value)) for what, value in transcript]


def _opaque(key: str, value: Any) -> Any:
    """A cursor encodes where the page ended (an id, a time): whether there is one counts."""
    return "<cursor>" if key.endswith("cursor") and value is not None else value


def _timed(key: Any) -> bool:
    """A time, or where the attempt ran (the dev agent's worker id is its host and pid)."""
    return isinstance(key, str) and (TIMES.search(key) is not None or key in {"worker", "stack"})


# PROTOCOL.md: a list read from the PostgreSQL snapshot (``conveyor dev``'s default) has
# ``priority``, ``run_at_ms`` and ``error.stack`` null; the engine lists from RocksDB.
SNAPSHOT_NULLS = ("priority",)  # the other two are times and a stack: not compared anyway
# What a node reads from its snapshot once a workflow ended (``streams/gateway/workflows.py``,
# rule 3): the step rows left RocksDB with the end.
ENDED_WORKFLOW_READS = {"workflow", "workflow history"}


@pytest.fixture(scope="module", params=["default", "--no-projection"])
def dev(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[NodeProcess]:
    """``conveyor dev`` as a user starts it (lists from its PostgreSQL snapshot), and without
    the snapshot (lists from RocksDB, as the engine does)."""
    home = tmp_path_factory.mktemp("parity") / "home"
    home.mkdir()
    options = () if request.param == "default" else (request.param,)
    proc = NodeProcess(home, ("dev", "--app", "parity_app:app", "--quiet", *options))
    proc.start(cwd=HERE, env={**os.environ, "PYTHONPATH": str(HERE)})
    try:
        yield proc
    finally:
        assert proc.stop(signal.SIGINT) == 0, proc.logs()


def as_the_snapshot_lists(transcript: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The engine's transcript with what the snapshot's lists leave null made null, in
    list replies only: everything else must still match."""
    out = []
    for what, value in transcript:
        if what.startswith("list") and isinstance(value, dict) and "tasks" in value:
            tasks = [{**t, **dict.fromkeys(SNAPSHOT_NULLS)} for t in value["tasks"]]
            value = {**value, "tasks": tasks}
        out.append((what, value))
    return out


def dev_client(dev: NodeProcess) -> conveyor.Client:
    keys = json.loads((dev.home / "keys.json").read_text())["keys"]
    (key,) = [k for k, entry in keys.items() if entry["role"] == "client"]
    deadline = time.monotonic() + REGISTER_S
    while parity_app.app.name not in _apps(dev, key):
        assert time.monotonic() < deadline, f"the dev agent did not register:\n{dev.logs()}"
        time.sleep(0.05)
    return conveyor.Client(dev.base, key, app=parity_app.app.name)


def _apps(dev: NodeProcess, key: str) -> set[str]:
    status, reply = call(dev.base, "GET", "/v1/task-types", key=key)
    assert status == 200, reply
    return {t["app"] for t in reply["task_types"]}


@pytest.fixture(scope="module")
def transcripts(dev: NodeProcess) -> tuple[Transcript, Transcript]:
    """The scenario's normalized answers: the engine's, the dev node's."""
    with Engine(parity_app.app) as engine:
        in_process = normalized(scenario(engine.client))
    with dev_client(dev) as client:
        deployed = normalized(scenario(client))
    if "--no-projection" not in dev.command:
        in_process = as_the_snapshot_lists(in_process)
    assert [what for what, _ in in_process] == [what for what, _ in deployed]
    return in_process, deployed


def differences(transcripts: tuple[Transcript, Transcript], entries: set[str]) -> list[str]:
    in_process, deployed = transcripts
    return [
        f"{what}: the engine answered\n  {ours}\na dev node\n  {theirs}"
        for (what, ours), (_, theirs) in zip(in_process, deployed, strict=True)
        if what in entries and ours != theirs
    ]


def test_the_engine_answers_the_scenario_as_a_dev_node_does(
    dev: NodeProcess, transcripts: tuple[Transcript, Transcript]
) -> None:
    entries = {what for what, _ in transcripts[0]}
    if "--no-projection" not in dev.command:
        entries -= ENDED_WORKFLOW_READS  # the next test
    differ = differences(transcripts, entries)
    assert not differ, "\n".join(differ)


@pytest.mark.parametrize("dev", ["default"], indirect=True)
@pytest.mark.xfail(
    strict=True,
    reason="the engine has no PostgreSQL snapshot: an ended workflow's step rows are dropped "
    "from RocksDB with its end, so its steps and history read empty, as on a node started "
    "with --no-projection, while a default node reads them from the snapshot",
)
def test_an_ended_workflow_reads_as_from_the_snapshot(
    transcripts: tuple[Transcript, Transcript],
) -> None:
    differ = differences(transcripts, ENDED_WORKFLOW_READS)
    assert not differ, "\n".join(differ)
