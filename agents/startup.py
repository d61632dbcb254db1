"""Why the app cannot be imported, in a few lines a developer reads at once.

A guest that cannot import the app says so in its hello (``guest.py``); the agent stops with
that message (``pool.GuestStartError``), and the full traceback stays in the guest's log. The
message names, in this order:

1. A folder named ``conveyor`` that shadows the installed package: on the import path ahead of
   it (a clone of this repository beside the app, say), so the app's ``import conveyor`` finds
   an empty namespace and fails far from the cause ("module 'conveyor' has no attribute
   'App'"). The folder is named, with what to do.
2. Otherwise the exception, and where in the app it was raised: the innermost frame outside
   the import machinery and this package (for a SyntaxError, its own file and line).

``shadowing(paths)`` looks for rule 1 before anything starts: the commands that run guests
(``conveyor dev``, ``conveyor agent``) ask it with the import path they will give them.
"""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Sequence
from importlib.machinery import PathFinder

import conveyor.app

# Where the installed package's top level lives (conveyor.App is defined there).
INSTALLED = os.path.dirname(os.path.realpath(conveyor.app.__file__))


def shadowing(paths: Sequence[str]) -> str | None:
    """What to tell the user if ``import conveyor`` with ``paths`` ahead finds a folder other
    than the installed package (rule 1); None when it finds the package itself."""
    spec = PathFinder.find_spec("conveyor", list(paths))
    if spec is None:
        return None
    if spec.origin and os.path.isfile(spec.origin):  # a regular package: is it this one?
        # By its __init__.py, so a tree of links to the package (an editable install) is it.
        if os.path.realpath(spec.origin) == os.path.join(INSTALLED, "__init__.py"):
            return None
        return _shadow_message(os.path.dirname(spec.origin))
    others = [p for p in spec.submodule_search_locations or [] if os.path.realpath(p) != INSTALLED]
    return _shadow_message(others[0]) if others else None


def _shadow_message(folder: str) -> str:
    return (
        f"the folder {folder} shadows the installed conveyor package: it is named conveyor "
        "and sits on the import path ahead of it, so the app's `import conveyor` finds it. "
        "Rename or move that folder, or run from a directory without it."
    )


def import_failure(exc: BaseException) -> str:
    """The few lines that say why importing the app raised ``exc`` (the module's rules)."""
    shadow = _shadowed_now()
    if shadow is not None:
        return shadow
    lines = [f"{type(exc).__name__}: {exc}"]
    where = _where(exc)
    if where is not None:
        lines.append(f"  at {where}")
    return "\n".join(lines)


def _shadowed_now() -> str | None:
    """Rule 1, after the fact: the ``conveyor`` this process imported is not the package."""
    module = sys.modules.get("conveyor")
    if module is None or hasattr(module, "App"):
        return None
    paths = [p for p in getattr(module, "__path__", []) if os.path.realpath(p) != INSTALLED]
    return _shadow_message(paths[0] if paths else str(getattr(module, "__file__", "?")))


def _where(exc: BaseException) -> str | None:
    if isinstance(exc, SyntaxError) and exc.filename:
        text = (exc.text or "").strip()
        return f"{exc.filename}:{exc.lineno}" + (f": {text}" if text else "")
    ours = (INSTALLED + os.sep, os.path.dirname(os.path.realpath(__file__)) + os.sep)
    frames = [
        f
        for f in traceback.extract_tb(exc.__traceback__)
        if not f.filename.startswith("<")
        and not os.path.realpath(f.filename).startswith(ours)
        and "importlib" not in f.filename
    ]
    if not frames:
        return None
    frame = frames[-1]
    return f"{frame.filename}:{frame.lineno}" + (f": {frame.line}" if frame.line else "")
