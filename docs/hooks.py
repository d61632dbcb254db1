"""mkdocs hooks: pages built from the repo's own text, so nothing is written twice.

``<!-- include: PATH -->`` puts a repository file in the page; ``PATH#Heading`` only that
section (to the next heading of the same level). ``<!-- reference: MODULE -->`` lists every
name in ``MODULE.__all__`` as a mkdocstrings block, from the module that defines it (so a name
the package imports lazily is documented where it lives).
"""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
INCLUDE = re.compile(r"<!-- include: ([^#\s]+)(?:#(.+?))? -->")
REFERENCE = re.compile(r"<!-- reference: ([\w.]+) -->")


def on_page_markdown(markdown: str, **_: Any) -> str:
    markdown = INCLUDE.sub(lambda m: _include(m.group(1), m.group(2)), markdown)
    return REFERENCE.sub(lambda m: _reference(m.group(1)), markdown)


def _include(path: str, heading: str | None) -> str:
    text = (ROOT / path).read_text()
    if heading is None:
        return _demote(text)
    lines = text.splitlines()
    levels = [len(line) - len(line.lstrip("#")) for line in lines]
    for i, line in enumerate(lines):
        if levels[i] and line[levels[i] :].strip() == heading:
            after = range(i + 1, len(lines))
            end = next((j for j in after if 0 < levels[j] <= levels[i]), len(lines))
            return "\n".join(lines[i + 1 : end])
    raise ValueError(f"{path} has no heading {heading!r}")


def _demote(text: str) -> str:
    """An included file's headings one level down, under the page's own title."""
    return re.sub(r"^(#+) ", r"#\1 ", text, flags=re.MULTILINE)


def _reference(module_name: str) -> str:
    module = importlib.import_module(module_name)
    blocks = []
    for name in module.__all__:
        obj = getattr(module, name)
        if isinstance(obj, types.ModuleType):
            blocks.append(f"See [`{obj.__name__}`]({obj.__name__.rpartition('.')[2]}.md).")
            continue
        home = getattr(obj, "__module__", None) if inspect.isclass(obj) or callable(obj) else None
        if inspect.isclass(obj) or inspect.isroutine(obj):
            blocks.append(f"::: {home}.{obj.__qualname__}")
        else:  # an instance or an alias: documented where it is defined, by its name
            blocks.append(f"::: {_defined_in(module, name)}.{name}")
    return "\n\n".join(blocks)


def _defined_in(module: types.ModuleType, name: str) -> str:
    """The module whose source assigns ``name`` (an alias or an instance has no __module__)."""
    obj = getattr(module, name)
    for candidate in list(sys.modules.values()):
        if not getattr(candidate, "__name__", "").startswith("conveyor"):
            continue
        if getattr(candidate, name, None) is not obj:
            continue
        try:
            source = inspect.getsource(candidate)
        except (OSError, TypeError):
            continue
        if re.search(rf"^{re.escape(name)}\b[^=\n]*=", source, flags=re.MULTILINE):
            return str(candidate.__name__)
    return module.__name__
