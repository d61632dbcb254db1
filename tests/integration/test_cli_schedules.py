"""``conveyor schedule add|list|rm`` as a user runs them: a subprocess CLI against a real
``conveyor node`` subprocess (run without the projection: schedules never touch it)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
from test_gateway import KEY_A, NodeProcess, call, write_keys

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeProcess]:
    home = tmp_path_factory.mktemp("cli-schedules") / "home"
    write_keys(home)
    proc = NodeProcess(home, ("node", "--no-projection"))
    proc.start()
    body = {"agent_id": "setup", "app": "shop", "version": "1", "task_types": ["report"]}
    assert call(proc.base, "POST", "/worker/register", body) == (200, {"warnings": []})
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.logs()


def cli(node: NodeProcess, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "conveyor.cli", "schedule", *args]
    cmd += ["--url", node.base, "--api-key", KEY_A]
    env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


def test_add_list_rm(node: NodeProcess) -> None:
    added = cli(
        node,
        "add",
        "nightly",
        "--cron",
        "*/5 * * * *",
        "--task",
        "report",
        "--app",
        "shop",
        "--payload",
        '{"n": 1}',
        "--timezone",
        "Europe/Paris",
        "--overlap",
        "skip",
    )
    assert added.returncode == 0, added.stderr
    assert "scheduled nightly" in added.stdout

    listed = cli(node, "list")
    assert listed.returncode == 0, listed.stderr
    assert "nightly" in listed.stdout and "*/5 * * * *" in listed.stdout
    assert "Europe/Paris" in listed.stdout and "skip" in listed.stdout
    assert "1 schedule(s)" in listed.stdout
    status, body = call(node.base, "GET", "/v1/schedules/nightly")
    assert status == 200 and body["task"]["payload"] == {"n": 1}, body

    removed = cli(node, "rm", "nightly")
    assert removed.returncode == 0, removed.stderr
    assert "deleted schedule nightly" in removed.stdout

    empty = cli(node, "list")
    assert empty.returncode == 0, empty.stderr
    assert "0 schedule(s)" in empty.stdout and "nightly" not in empty.stdout


def test_bad_cron_is_a_clear_error(node: NodeProcess) -> None:
    bad = cli(node, "add", "broken", "--cron", "61 * * * *", "--task", "report", "--app", "shop")
    assert bad.returncode == 2  # usage: the node found the request malformed
    assert "invalid_request (HTTP 400)" in bad.stderr
    assert "invalid cron expression '61 * * * *'" in bad.stderr
    assert "Traceback" not in bad.stderr
    assert "broken" not in cli(node, "list").stdout


def test_rm_missing_schedule_is_a_clear_error(node: NodeProcess) -> None:
    missing = cli(node, "rm", "no-such-schedule")
    assert missing.returncode == 3  # not found
    assert "not_found (HTTP 404)" in missing.stderr and "no-such-schedule" in missing.stderr


def test_bad_payload_and_overlap_fail_before_any_request(node: NodeProcess) -> None:
    base = ["add", "x", "--cron", "* * * * *", "--task", "report", "--app", "shop"]
    bad_json = cli(node, *base, "--payload", "{nope")
    assert bad_json.returncode == 2 and "--payload is not JSON" in bad_json.stderr
    bad_overlap = cli(node, *base, "--overlap", "sometimes")
    assert bad_overlap.returncode == 2 and "sometimes" in bad_overlap.stderr


def test_pause_and_resume(node: NodeProcess) -> None:
    add = ["add", "hourly", "--cron", "0 * * * *", "--task", "report", "--app", "shop"]
    assert cli(node, *add).returncode == 0
    paused = cli(node, "pause", "hourly")
    assert paused.returncode == 0, paused.stderr
    assert "paused schedule hourly" in paused.stdout
    status, body = call(node.base, "GET", "/v1/schedules/hourly")
    assert status == 200 and body["paused"] is True and body["next_fire_ms"] is None, body
    listed = cli(node, "list")
    assert "paused" in listed.stdout and "hourly" in listed.stdout

    resumed = cli(node, "resume", "hourly")
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed schedule hourly" in resumed.stdout
    status, body = call(node.base, "POST", "/v1/schedules/hourly/resume")  # again: a no-op
    assert status == 200 and body["paused"] is False, body
    assert body["next_fire_ms"] % 3_600_000 == 0, body  # the next whole hour
    assert "active" in cli(node, "list").stdout

    status, body = call(node.base, "POST", "/v1/schedules/no-such/pause")
    assert status == 404 and "no-such" in body["error"]["message"], body
    missing = cli(node, "resume", "no-such-schedule")
    assert missing.returncode == 3 and "not_found (HTTP 404)" in missing.stderr
    assert cli(node, "rm", "hourly").returncode == 0
