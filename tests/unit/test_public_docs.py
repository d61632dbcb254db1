"""The public SDK documents itself: every name in ``conveyor.__all__``, and in the ``__all__`` of
the public modules (``conveyor.testing``, ``conveyor.codecs``), has a docstring, and so does
every public method and property those classes define. The API reference (``make docs``) is
built from these docstrings, so a missing one is a hole in the docs."""

from __future__ import annotations

import inspect
import types
from collections.abc import Iterator
from typing import Any

import conveyor

# Public modules that ``conveyor.__all__`` leaves out so that ``from conveyor import *`` does
# not load them (``conveyor.testing`` is the whole platform, the server extra).
PUBLIC_MODULES_OUTSIDE_ALL = ("testing",)


def public_objects() -> Iterator[tuple[str, Any]]:
    for name in (*conveyor.__all__, *PUBLIC_MODULES_OUTSIDE_ALL):
        obj = getattr(conveyor, name)
        yield f"conveyor.{name}", obj
        if isinstance(obj, types.ModuleType):
            listed = getattr(obj, "__all__", None)
            assert listed, f"conveyor.{name} lists its public names in __all__"
            for inner in listed:
                yield f"{obj.__name__}.{inner}", getattr(obj, inner)


def documented(obj: Any) -> bool:
    return bool((inspect.getdoc(obj) or "").strip())


def own_members(cls: type) -> Iterator[tuple[str, Any]]:
    """Public methods and properties the class itself defines (not inherited ones)."""
    for name, value in vars(cls).items():
        if name.startswith("_"):
            continue
        if isinstance(value, property):
            yield name, value.fget
        elif isinstance(value, (classmethod, staticmethod)):
            yield name, value.__func__
        elif inspect.isfunction(value):
            yield name, value


def test_every_public_name_has_a_docstring() -> None:
    missing = []
    for qualname, obj in public_objects():
        plain = isinstance(obj, types.ModuleType) or inspect.isclass(obj) or inspect.isroutine(obj)
        target = obj if plain else type(obj)  # an instance (``current_task``): by its class
        if not (target.__doc__ or "").strip():
            missing.append(qualname)
    assert missing == [], f"public names without a docstring: {missing}"


def test_every_public_method_of_a_public_class_has_a_docstring() -> None:
    missing = [
        f"{qualname}.{name}"
        for qualname, obj in public_objects()
        if inspect.isclass(obj)
        for name, member in own_members(obj)
        if member is not None and not documented(member)
    ]
    assert missing == [], f"public methods without a docstring: {missing}"


def test_the_walk_sees_the_names_it_checks() -> None:
    """The checks above are only as good as the names they reach."""
    names = {qualname for qualname, _ in public_objects()}
    for expected in (
        "conveyor.Client",
        "conveyor.App",
        "conveyor.testing.Engine",
        "conveyor.codecs.Encryption",
    ):
        assert expected in names
    assert ("get", conveyor.TaskHandle.get) in list(own_members(conveyor.TaskHandle))
