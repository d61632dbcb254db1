"""The Avro resolution check behind the registry's compatibility levels, as a table of
(reader, writer, can it read) cases from the Avro specification's rules; the levels built on
it; and the enqueue's check of a JSON payload against a schema."""

from __future__ import annotations

import json
from typing import Any

import pytest

from conveyor.streams.registry.compatibility import (
    InvalidSchema,
    incompatibilities,
    parse,
    problems,
)
from conveyor.streams.registry.payloads import mismatch


def rec(*fields: dict[str, Any], name: str = "R", **extra: Any) -> dict[str, Any]:
    return {"type": "record", "name": name, "fields": list(fields), **extra}


def f(name: str, type_: Any, **extra: Any) -> dict[str, Any]:
    return {"name": name, "type": type_, **extra}


def enum(*symbols: str, **extra: Any) -> dict[str, Any]:
    return {"type": "enum", "name": "E", "symbols": list(symbols), **extra}


CASES = [
    # (case, reader, writer, readable)
    ("same primitive", "int", "int", True),
    ("int promoted to long", "long", "int", True),
    ("int promoted to double", "double", "int", True),
    ("long promoted to float", "float", "long", True),
    ("float promoted to double", "double", "float", True),
    ("long not narrowed to int", "int", "long", False),
    ("double not narrowed to float", "float", "double", False),
    ("string read as bytes", "bytes", "string", True),
    ("bytes read as string", "string", "bytes", True),
    ("string is not int", "int", "string", False),
    ("null reads only null", "null", "int", False),
    (
        "field added with a default",
        rec(f("a", "int"), f("b", "string", default="")),
        rec(f("a", "int")),
        True,
    ),
    (
        "field added without a default",
        rec(f("a", "int"), f("b", "string")),
        rec(f("a", "int")),
        False,
    ),
    ("field removed", rec(f("a", "int")), rec(f("a", "int"), f("b", "string")), True),
    ("field type promoted", rec(f("a", "long")), rec(f("a", "int")), True),
    ("field type narrowed", rec(f("a", "int")), rec(f("a", "long")), False),
    ("field renamed with an alias", rec(f("b", "int", aliases=["a"])), rec(f("a", "int")), True),
    ("field renamed without an alias", rec(f("b", "int")), rec(f("a", "int")), False),
    ("record renamed", rec(f("a", "int"), name="S"), rec(f("a", "int")), False),
    (
        "record renamed with an alias",
        rec(f("a", "int"), name="S", aliases=["R"]),
        rec(f("a", "int")),
        True,
    ),
    ("writer union, reader takes every branch", ["null", "long"], ["null", "int"], True),
    ("writer union, a branch unreadable", ["null", "int"], ["null", "string"], False),
    ("reader union takes the writer's type", ["null", "string"], "string", True),
    ("reader union lacks the writer's type", ["null", "string"], "int", False),
    (
        "optional field added",
        rec(f("a", "int"), f("o", ["null", "int"], default=None)),
        rec(f("a", "int")),
        True,
    ),
    ("enum symbol added", enum("A", "B", "C"), enum("A", "B"), True),
    ("enum symbol removed", enum("A"), enum("A", "B"), False),
    ("enum symbol removed, reader default", enum("A", "Z", default="Z"), enum("A", "B"), True),
    (
        "array items promoted",
        {"type": "array", "items": "long"},
        {"type": "array", "items": "int"},
        True,
    ),
    (
        "map values narrowed",
        {"type": "map", "values": "int"},
        {"type": "map", "values": "long"},
        False,
    ),
    (
        "array is not map",
        {"type": "array", "items": "int"},
        {"type": "map", "values": "int"},
        False,
    ),
    (
        "fixed of another size",
        {"type": "fixed", "name": "F", "size": 4},
        {"type": "fixed", "name": "F", "size": 8},
        False,
    ),
    (
        "fixed of the same size",
        {"type": "fixed", "name": "F", "size": 4},
        {"type": "fixed", "name": "F", "size": 4},
        True,
    ),
    (
        "logical type read as its base",
        "long",
        {"type": "long", "logicalType": "timestamp-millis"},
        True,
    ),
    (
        "nested record field added with a default",
        rec(f("n", rec(f("x", "int"), f("y", "int", default=0), name="N"))),
        rec(f("n", rec(f("x", "int"), name="N"))),
        True,
    ),
    (
        "recursive type",
        rec(f("next", ["null", "R"], default=None), f("v", "long")),
        rec(f("next", ["null", "R"], default=None), f("v", "int")),
        True,
    ),
]


@pytest.mark.parametrize(("case", "reader", "writer", "readable"), CASES, ids=[c[0] for c in CASES])
def test_resolution(case: str, reader: Any, writer: Any, readable: bool) -> None:
    found = problems(json.dumps(reader), json.dumps(writer))
    assert (not found) is readable, found


def test_levels() -> None:
    v1 = json.dumps(rec(f("a", "int")))
    v2 = json.dumps(rec(f("a", "int"), f("b", "string", default="")))  # added, with default
    v3 = json.dumps(rec(f("b", "string", default="")))  # a removed: new data lacks it
    assert incompatibilities("BACKWARD", v2, [v1]) == []
    assert incompatibilities("FORWARD", v2, [v1]) == []
    assert incompatibilities("FULL", v2, [v1]) == []
    assert incompatibilities("BACKWARD", v3, [v1, v2]) == []  # v3 reads v2's data
    # FORWARD: v2 readers of v3 data miss a (no default); only the latest unless transitive.
    assert incompatibilities("FORWARD", v3, [v1, v2]) != []
    required = json.dumps(rec(f("a", "int"), f("c", "int")))
    assert incompatibilities("BACKWARD", required, [v1]) != []
    assert incompatibilities("NONE", required, [v1]) == []
    later = json.dumps(rec(f("c", "int", default=0)))  # reads v2 (latest), not v1's field a
    both = [v1, json.dumps(rec(f("a", "int", default=0)))]
    assert incompatibilities("BACKWARD", later, both) == []
    assert incompatibilities("FORWARD_TRANSITIVE", later, both) != []


def test_an_invalid_schema_says_why() -> None:
    with pytest.raises(InvalidSchema, match="not JSON"):
        parse("{nope")
    with pytest.raises(InvalidSchema, match="invalid Avro schema"):
        parse(json.dumps({"type": "record", "name": "R", "fields": [{"name": "a"}]}))


ORDER = json.dumps(
    rec(
        f("id", "string"),
        f("items", {"type": "array", "items": rec(f("price", "double"), name="Item")}),
        f("note", ["null", "string"], default=None),
        f("tags", {"type": "map", "values": "long"}, default={}),
        name="Order",
    )
)


@pytest.mark.parametrize(
    ("payload", "found"),
    [
        ({"id": "o", "items": [{"price": 1}], "tags": {"a": 1}}, None),
        ({"id": "o", "items": [], "note": "x"}, None),
        ({"id": "o", "items": [{"price": "1"}]}, '.items[0].price: expected double, got "1"'),
        ({"items": []}, ".id: missing; expected string"),
        ({"id": 3, "items": []}, ".id: expected string, got 3"),
        ({"id": "o", "items": [], "note": 1}, ".note: expected null or string, got 1"),
        ({"id": "o", "items": [], "tags": {"a": True}}, ".tags.a: expected long, got true"),
        ([1], "(the payload): expected record Order, got [1]"),
    ],
)
def test_payload_against_schema(payload: Any, found: str | None) -> None:
    assert mismatch(ORDER, json.dumps(payload).encode()) == found
