"""``@frozen`` value types: slotted dataclasses, equal and hashed by value, which mypy treats
as frozen (the declaration it reads is checked here; the package passes ``mypy --strict``)."""

from __future__ import annotations

import dataclasses

from conveyor.frozen import frozen
from conveyor.schemas.types import TaskSpec


@frozen(kw_only=True)
class Point:
    x: int
    y: int = 0
    tags: tuple[str, ...] = ()
    seen: list[int] = dataclasses.field(default_factory=list, compare=False, hash=False)


def test_values_compare_and_hash_by_their_fields() -> None:
    assert Point(x=1) == Point(x=1, y=0)
    assert Point(x=1) != Point(x=2)
    a = TaskSpec(task_id="a" * 32, tenant="t", app="shop", task_type="charge")
    b = dataclasses.replace(a, priority=3)
    assert {Point(x=1, y=2, tags=("a",)): "kept"}[Point(x=1, y=2, tags=("a",))] == "kept"
    assert Point(x=1).seen is not Point(x=1).seen  # field(default_factory=...) works
    assert a != b and b.priority == 3 and a.priority != 3


def test_they_are_slotted_dataclasses() -> None:
    assert dataclasses.is_dataclass(Point) and "__slots__" in Point.__dict__
    assert not hasattr(Point(x=1), "__dict__")
    assert [f.name for f in dataclasses.fields(TaskSpec)][:2] == ["task_id", "tenant"]


def test_mypy_is_told_they_are_frozen() -> None:
    declared = frozen.__dataclass_transform__  # type: ignore[attr-defined]
    # Python 3.11 files the parameter under "kwargs"; later versions name it.
    assert {**declared.get("kwargs", {}), **declared}.get("frozen_default") is True
