"""The pure core stays pure: ``streams/machine/`` imports no clock, randomness, I/O or
concurrency, and has no async code. ``hashlib`` is allowed: jitter
and derived ids are hashes of ids and offsets.

Like TigerBeetle's ``tidy.zig``: the rule is checked on the source, so it cannot rot.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MACHINE = ROOT / "streams" / "machine"
BANNED = frozenset(
    {
        "asyncio",
        "time",
        "datetime",
        "random",
        "uuid",
        "os",
        "socket",
        "logging",
        "threading",
        "io",
        # Not in the original list, but just as impure:
        "secrets",
        "subprocess",
        "multiprocessing",
        "importlib",
    }
)
FILES = sorted(MACHINE.rglob("*.py"))


def imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    """(line, top-level module) of every import statement, wherever it sits."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name.split(".")[0]) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module.split(".")[0]))
    return found


def test_the_machine_has_files() -> None:
    names = {p.relative_to(MACHINE).as_posix() for p in FILES}
    assert {"apply.py", "transitions.py", "lifecycle.py", "handlers/enqueue.py"} <= names


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(MACHINE).as_posix())
def test_machine_module_imports_nothing_impure(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [
        f"{path.name}:{line} imports {mod}" for line, mod in imported_modules(tree) if mod in BANNED
    ]
    assert bad == []


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(MACHINE).as_posix())
def test_machine_module_has_no_async_code(path: Path) -> None:
    tree = ast.parse(path.read_text(), filename=str(path))
    bad = [
        f"{path.name}:{node.lineno} {type(node).__name__}"
        for node in ast.walk(tree)
        if isinstance(node, ast.AsyncFunctionDef | ast.Await | ast.AsyncFor | ast.AsyncWith)
    ]
    assert bad == []


def test_the_checker_catches_what_it_bans() -> None:
    source = "import os.path\nfrom time import monotonic\ndef f():\n    import random\n"
    mods = {mod for _, mod in imported_modules(ast.parse(source))}
    assert {"os", "time", "random"} <= mods & BANNED
