"""``forget_dead_handles`` and ``forget_dead_postmaster``: pgserver's list of a server's users
loses the pids of processes that died without cleaning up (zombies included) and keeps the
living; a dead server's ``postmaster.pid`` goes, a live one's stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from conveyor.store.postgres.server import (
    HANDLES_FILE,
    forget_dead_handles,
    forget_dead_postmaster,
)


def test_dead_pids_are_dropped_and_living_ones_kept(tmp_path: Path) -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()  # exited and reaped: its pid names no process
    (tmp_path / HANDLES_FILE).write_text(json.dumps([os.getpid(), dead.pid]))
    assert forget_dead_handles(tmp_path) == [dead.pid]
    assert json.loads((tmp_path / HANDLES_FILE).read_text()) == [os.getpid()]
    assert forget_dead_handles(tmp_path) == []


def test_no_list_is_nothing_to_forget(tmp_path: Path) -> None:
    assert forget_dead_handles(tmp_path) == []
    (tmp_path / HANDLES_FILE).write_text("not json")
    assert forget_dead_handles(tmp_path) == []


def test_a_zombie_counts_as_dead(tmp_path: Path) -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    try:  # exited, not yet reaped by its parent (us)
        (tmp_path / HANDLES_FILE).write_text(json.dumps([child.pid]))
        assert forget_dead_handles(tmp_path) == [child.pid]
        (tmp_path / "postmaster.pid").write_text(f"{child.pid}\n{tmp_path}\n")
        (tmp_path / ".s.PGSQL.5432.lock").write_text(f"{child.pid}\n{tmp_path}\n")
        removed = forget_dead_postmaster(tmp_path)
        assert removed == ["postmaster.pid", ".s.PGSQL.5432.lock"]
        assert not (tmp_path / "postmaster.pid").exists()
    finally:
        child.wait()


def test_the_pid_file_of_a_live_server_stays(tmp_path: Path) -> None:
    (tmp_path / "postmaster.pid").write_text(f"{os.getpid()}\n{tmp_path}\n")
    assert forget_dead_postmaster(tmp_path) == []
    assert (tmp_path / "postmaster.pid").exists()
    assert forget_dead_postmaster(tmp_path / "nowhere") == []
