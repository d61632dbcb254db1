"""The benchmarks and the fault runs are the checkout's devtools (``devtools/``, the
``conveyor_devtools`` package), not part of the ``conveyor`` package a user installs.

- The wheel built from pyproject.toml holds no ``bench`` or ``chaos`` module (built for real,
  from a copy of the folders its ``package-dir`` maps, in a few seconds).
- The runtime folders import nothing from ``conveyor_devtools`` but ``sdk/cli/main.py``, which
  adds ``conveyor bench`` and ``conveyor chaos`` when it is importable.
- Without it (a user's ``pip install conveyor``), ``conveyor bench ...`` and ``conveyor chaos
  ...`` are one line on how to get them and the usage exit status; with it (the checkout's
  .venv), they are the real command groups.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from conveyor.cli import exits

ROOT = Path(__file__).resolve().parents[2]
DEV_MODULE = re.compile(r"(^|/)(bench|chaos)(/|\.py$)")

# The CLI run as ``conveyor`` with conveyor_devtools not importable, as in a user's install.
WITHOUT_DEVTOOLS = """
import sys

HIDDEN = sys.argv.pop(1)

class NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name == HIDDEN or name.startswith(HIDDEN + "."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NotInstalled())
sys.argv[0] = "conveyor"
from conveyor.cli.main import main
main()
"""


def _runtime_folders() -> dict[str, str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    folders: dict[str, str] = config["tool"]["setuptools"]["package-dir"]
    return folders


def test_the_wheel_holds_no_benchmarks_or_fault_runs(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    for folder in _runtime_folders().values():
        shutil.copytree(
            ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    out = tmp_path / "wheel"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(src), "-w", str(out)],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert build.returncode == 0, build.stderr
    (wheel,) = out.glob("conveyor-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "conveyor/streams/failpoints.py" in names  # what chaos uses stays in the runtime
    assert "conveyor/cli/main.py" in names
    dev = [n for n in names if DEV_MODULE.search(n) or "devtools" in n]
    assert dev == [], f"the wheel holds development tools: {dev}"
    (top_level,) = [n for n in names if n.endswith(".dist-info/top_level.txt")]
    assert zipfile.ZipFile(wheel).read(top_level).decode().split() == ["conveyor"]


def test_only_the_cli_entry_imports_the_devtools() -> None:
    importers: list[str] = []
    for folder in _runtime_folders().values():
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0:
                    names = [node.module or ""]
                else:
                    continue
                if any(n.partition(".")[0] == "conveyor_devtools" for n in names):
                    importers.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert [i.partition(":")[0] for i in importers] == ["sdk/cli/main.py"], importers


def _conveyor(*args: str, hide: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    if hide is None:
        cmd = [sys.executable, "-m", "conveyor.cli", *args]
    else:
        cmd = [sys.executable, "-c", WITHOUT_DEVTOOLS, hide, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.parametrize(
    "args",
    [
        ("bench", "e2e", "--json"),
        ("bench",),
        ("chaos", "kill9", "--seconds", "5"),
        ("chaos", "--help"),
    ],
)
def test_without_the_devtools_bench_and_chaos_say_how_to_get_them(args: tuple[str, ...]) -> None:
    run = _conveyor(*args, hide="conveyor_devtools")
    assert run.returncode == exits.USAGE, run.stderr
    assert run.stdout == ""
    (line,) = run.stderr.strip().splitlines()
    assert f"conveyor {args[0]} is a development tool of a Conveyor checkout" in line
    assert "pip install -e devtools" in line


def test_without_the_devtools_the_rest_of_the_cli_works() -> None:
    listed = _conveyor("--help", hide="conveyor_devtools")
    assert listed.returncode == 0, listed.stderr
    assert re.search(r"bench +Benchmarks \(a development tool of a checkout", listed.stdout)
    assert _conveyor("log", "verify", "--help", hide="conveyor_devtools").returncode == 0


def test_a_broken_devtools_install_is_not_reported_as_missing() -> None:
    # The package is there but a module of it cannot be imported: that is a traceback to fix,
    # not "not installed".
    run = _conveyor("bench", "e2e", hide="conveyor_devtools.cli")
    assert run.returncode == 1
    assert "No module named 'conveyor_devtools.cli'" in run.stderr
    assert "development tool of a Conveyor checkout" not in run.stderr


def test_in_the_checkout_bench_and_chaos_are_the_real_groups() -> None:
    bench = _conveyor("bench", "--help")
    assert bench.returncode == 0, bench.stderr
    for command in ("log", "engine", "fanout", "fairness", "cancel", "e2e", "ingest", "bulk"):
        assert re.search(rf"│ {command} ", bench.stdout), command
    chaos = _conveyor("chaos", "--help")
    assert chaos.returncode == 0, chaos.stderr
    for command in ("kill9", "soak", "zombie", "lost-replies", "power-cut", "fan-in", "failover"):
        assert re.search(rf"│ {command} ", chaos.stdout), command
