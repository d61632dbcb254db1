"""Encrypted payloads through a real ``conveyor node`` and a real agent running the handlers in
guest processes: the node's API, its RocksDB state, its log and its PostgreSQL query snapshot
hold only envelopes (payload, result, checkpoint, step values, an event's payload), while the
handlers saw the plaintext and the client with the key reads it back decoded.

The scan of the node's files is checked against a canary: a payload sent without a codec IS
found in them, so a scan that sees nothing cannot pass for one that found nothing."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator
from pathlib import Path

import codec_app
import pytest
from test_agent import DEADLINE_S, run
from test_gateway import KEY_A, NodeProcess, call, write_keys

import conveyor
from conveyor.agents.host import HostAgent
from conveyor.agents.worker_api import HttpWorkerAPI
from conveyor.codecs import describe
from conveyor.contract.replies import WorkflowHistory
from conveyor.schemas.envelope import is_envelope

pytestmark = pytest.mark.timeout(180)

SECRET = "s3cr3t-7d1e"  # every plaintext value the tasks carry contains it
CANARY = "plain-canary-52f0"  # sent without a codec: must show up in the node's files


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("codecs") / "home"
    write_keys(home)
    proc = NodeProcess(home)
    proc.start()
    body = {"agent_id": "setup", "app": "canary-app", "version": "1", "task_types": ["canary"]}
    assert call(proc.base, "POST", "/worker/register", body)[0] == 200
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def files_holding(root: Path, needle: bytes) -> list[str]:
    found = []
    for path in root.rglob("*"):
        try:
            if path.is_file() and needle in path.read_bytes():
                found.append(str(path.relative_to(root)))
        except OSError:  # a file removed while we looked (a compaction, a segment roll)
            continue
    return found


def poll(what: str, check: object, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def test_the_node_holds_only_envelopes_of_an_encrypted_app(
    node: NodeProcess, tmp_path: Path
) -> None:
    results: dict[str, object] = {}

    async def main() -> None:
        api = HttpWorkerAPI(node.base, KEY_A)
        agent = HostAgent(
            api, "codec_app:app", log_dir=tmp_path / "logs", heartbeat_s=0.3, poll_wait_s=1.0
        )
        running = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(agent.started.wait(), DEADLINE_S)
            async with (
                conveyor.AsyncClient(node.base, KEY_A, codec=codec_app.CODEC) as client,
                conveyor.AsyncClient(node.base, KEY_A) as plain,
            ):
                sealed = await client.enqueue(codec_app.seal, {"secret": SECRET, "n": 1})
                results["seal"] = await sealed.result(DEADLINE_S)
                results["seal_id"] = sealed.id
                shouted = await client.enqueue(codec_app.shout, SECRET + "-async")
                results["shout"] = await shouted.result(DEADLINE_S)
                results["shout_id"] = shouted.id
                waiting = await client.enqueue(codec_app.approval, {"secret": SECRET})
                results["approval_id"] = waiting.id
                for _ in range(int(DEADLINE_S / 0.05)):
                    if (await client.get(waiting.id)).status == "WAITING":
                        break
                    await asyncio.sleep(0.05)
                results["history"] = await client.workflow_history(waiting.id)
                results["raw_history"] = await plain.workflow_history(waiting.id)
                await client.send_event(waiting.id, "approved", {"by": SECRET + "-approver"})
                results["approval"] = await waiting.result(DEADLINE_S)
                # The canary: a type of an app without a codec, whose agent never runs here.
                await plain.enqueue("canary", {"note": CANARY}, app="canary-app")
        finally:
            agent.stop()
            await asyncio.wait_for(running, DEADLINE_S)
            await api.close()

    run(main)
    # The handlers saw plaintext; the client with the key reads it back decoded.
    assert results["seal"] == {
        "saw": {"secret": SECRET, "n": 1},
        "card": SECRET + "-step",
        "checkpoint": {"stage": SECRET + "-checkpoint"},
    }
    assert results["approval"] == {"decision": {"by": SECRET + "-approver"}}
    assert results["shout"] == (SECRET + "-async").upper()
    history = results["history"]
    assert isinstance(history, WorkflowHistory)
    (quote,) = [s for s in history.steps if s.identity == "quote#0"]
    assert quote.value == SECRET + "-quote"

    # The API without the key: envelopes only.
    raw_history = results["raw_history"]
    assert isinstance(raw_history, WorkflowHistory)
    (raw_quote,) = [s for s in raw_history.steps if s.identity == "quote#0"]
    assert is_envelope(raw_quote.value)
    for task_id in (results["seal_id"], results["approval_id"], results["shout_id"]):
        status, task = call(node.base, "GET", f"/v1/tasks/{task_id}")
        assert status == 200 and task["status"] == "SUCCEEDED"
        for field in ("payload", "result"):
            assert describe(task[field]) is not None, (field, task[field])
        assert SECRET not in json.dumps(task) and SECRET.upper() not in json.dumps(task)
    status, seal = call(node.base, "GET", f"/v1/tasks/{results['seal_id']}")
    assert describe(seal["checkpoint"]) == "encoded (conveyor/v1, aes-gcm)"

    # The node's files (log segments, RocksDB state and its WAL, snapshots, PostgreSQL):
    # the canary sent in plain JSON is there, the secret in none of them.
    poll("the canary to reach the node's files", lambda: files_holding(node.home, CANARY.encode()))
    for plain in (SECRET, SECRET.upper()):  # the async handler's result is upper case
        assert files_holding(node.home, plain.encode()) == [], plain
