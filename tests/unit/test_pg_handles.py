"""``forget_dead_handles``: pgserver's list of a server's users loses the pids of processes
that died without cleaning up, and keeps the living."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from conveyor.store.postgres.server import HANDLES_FILE, forget_dead_handles


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
