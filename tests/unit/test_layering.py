"""Import direction: ``schemas`` <- ``store`` <- ``streams``; ``agents`` and the SDK talk to
the platform over its APIs, so the folders follow the data flow.

    schemas/  imports nothing from conveyor.store, conveyor.streams, conveyor.agents
    store/    imports nothing from conveyor.streams, conveyor.agents
    agents/   imports nothing from conveyor.streams, conveyor.store
              (only conveyor.schemas, conveyor.errors and the SDK)
    sdk/      imports nothing from conveyor.streams, conveyor.store, conveyor.agents,
              except sdk/testing.py and sdk/cli/, which compose the platform
    conveyor.errors (sdk/errors.py) may be imported from anywhere.

Every import counts: at module level, inside functions, under ``TYPE_CHECKING``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = {  # folder -> the import name setuptools maps it to
    "sdk": "conveyor",
    "schemas": "conveyor.schemas",
    "store": "conveyor.store",
    "streams": "conveyor.streams",
    "agents": "conveyor.agents",
}
PLATFORM = ("conveyor.store", "conveyor.streams", "conveyor.agents", "conveyor.schemas")
FORBIDDEN = {
    "schemas": ("conveyor.store", "conveyor.streams", "conveyor.agents"),
    "store": ("conveyor.streams", "conveyor.agents"),
    "agents": ("conveyor.streams", "conveyor.store"),
    "sdk": ("conveyor.streams", "conveyor.store", "conveyor.agents"),
}


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = PACKAGES[folder].split(".") + rest
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every import in ``path``; relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            # "from conveyor import streams" imports the subpackage conveyor.streams
            names = [f"{module}.{alias.name}" for alias in node.names]
            found.extend((node.lineno, name) for name in [module, *names])
    return found


def violations(folder: str) -> list[str]:
    bad = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        rel = path.relative_to(ROOT / folder).as_posix()
        if folder == "sdk" and (rel == "testing.py" or rel.startswith("cli/")):
            continue
        seen = set()
        for line, module in imports_of(path):
            for prefix in FORBIDDEN[folder]:
                if (module == prefix or module.startswith(prefix + ".")) and line not in seen:
                    seen.add(line)
                    bad.append(f"{folder}/{rel}:{line} imports {module}")
    return bad


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_import_direction(folder: str) -> None:
    found = violations(folder)
    assert found == []


def test_errors_is_a_leaf_importable_from_anywhere() -> None:
    mods = [m for _, m in imports_of(ROOT / "sdk" / "errors.py")]
    assert not [m for m in mods if m.startswith("conveyor")], mods


def test_resolution_of_relative_and_from_imports() -> None:
    """The checker itself: relative imports and ``from conveyor import x`` are seen."""
    path = ROOT / "streams" / "machine" / "handlers" / "cancel.py"
    assert module_name(path) == "conveyor.streams.machine.handlers.cancel"
    mods = {m for _, m in imports_of(path)}
    assert "conveyor.store.tables" in mods
    assert module_name(ROOT / "sdk" / "__init__.py") == "conveyor"


def test_a_guest_imports_no_http_client_and_no_storage() -> None:
    """A guest process imports its stub and the user's app (hence ``conveyor``), and nothing
    that only producers or the node use (the clients, storage, the stored types): those
    imports were most of a guest's start-up."""
    code = (
        "import sys, conveyor, conveyor.agents.guest\n"
        "heavy = {'httpx', 'aiohttp', 'rocksdict', 'asyncpg', 'conveyor.testing',\n"
        "         'conveyor.schemas.types'}\n"
        "print(sorted(heavy & set(sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def import_graph(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Module -> the modules among ``modules`` it imports (every import counts, the
    ``TYPE_CHECKING`` ones too)."""
    return {
        name: sorted({m for _, m in imports_of(path) if m in modules and m != name})
        for name, path in modules.items()
    }


def import_cycle(graph: dict[str, list[str]]) -> list[str] | None:
    """A cycle of ``graph``, as the module names around it, or None."""
    state: dict[str, str] = {}  # name -> "open" (on the path) or "done"

    def visit(name: str, path: list[str]) -> list[str] | None:
        state[name] = "open"
        for dep in graph[name]:
            if state.get(dep) == "open":
                return [*path[path.index(dep) :], dep]
            if dep not in state and (found := visit(dep, [*path, dep])):
                return found
        state[name] = "done"
        return None

    for name in sorted(graph):
        if name not in state and (found := visit(name, [name])):
            return found
    return None


def test_the_processor_modules_import_no_cycle() -> None:
    """The leader duties reach their partition through ``duties.Partition`` and the pool its
    dispatchers through ``pool.Dealer``: nothing imports ``loop.py`` back, nor ``dispatch.py``.
    (The package's ``__init__`` only re-exports the processor.)"""
    folder = ROOT / "streams" / "processor"
    modules = {module_name(p): p for p in folder.glob("*.py") if p.name != "__init__.py"}
    graph = import_graph(modules)
    assert "conveyor.streams.processor.duties" in graph["conveyor.streams.processor.timers"]
    assert import_cycle(graph) is None


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The checker itself, on the shape the processor had: the loop imports its duties, and a
    duty the loop (under ``TYPE_CHECKING``); the pool the dispatcher and back."""
    graph = {"loop": ["timers"], "timers": ["loop", "waiting"], "waiting": []}
    assert import_cycle(graph) == ["loop", "timers", "loop"]
    assert import_cycle({"dispatch": ["pool"], "pool": ["dispatch"]}) == [
        "dispatch",
        "pool",
        "dispatch",
    ]
    assert import_cycle({"loop": ["timers"], "timers": ["duties"], "duties": []}) is None
