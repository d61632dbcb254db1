"""The ``conveyor`` command's own options, run as a real process."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _conveyor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "conveyor.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_version_prints_the_package_version() -> None:
    want = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    done = _conveyor("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"conveyor {want}"


def test_shell_completion_script_is_offered() -> None:
    done = _conveyor("--show-completion", "bash")
    assert done.returncode == 0, done.stderr
    assert "complete" in done.stdout and "conveyor" in done.stdout
