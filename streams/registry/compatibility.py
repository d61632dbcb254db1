"""Avro schema resolution: can data written with one schema be read with another?

The schema registry's compatibility levels rest on one question, answered by ``problems``:
which parts of a writer's data a reader cannot resolve (the Avro specification's "Schema
Resolution"). Schemas are parsed by fastavro (``parse``), which checks them and names every
named type by its full name; this module then walks the two trees side by side.

The rules, reader against writer:
1. Primitives match by type, or by promotion: int to long, float or double; long to float
   or double; float to double; string to bytes and bytes to string. ``null`` reads only null.
2. A writer union: every branch must be readable (a datum may be any of them). A reader union
   against a non-union: some branch must read it (the first that does is chosen).
3. Records, enums and fixed match by full name, or a reader alias naming the writer's type.
4. A record: each reader field is read from the writer field of its name (or of one of its
   aliases), else it needs a default. Writer fields the reader lacks are skipped.
5. An enum: every writer symbol must be a reader symbol, unless the reader has a default.
6. A fixed: the same size. Arrays by items, maps by values.
Logical types are read as their underlying type (a reader that ignores one still reads).
Recursive types are walked once per (reader, writer) pair of names.

Levels: BACKWARD (the new schema reads the latest one's data), FORWARD (the latest reads the
new one's), FULL (both); ``_TRANSITIVE`` checks every live version, not only the latest; NONE
checks nothing.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from fastavro import parse_schema

BACKWARD = "BACKWARD"
LEVELS = (
    "BACKWARD",
    "BACKWARD_TRANSITIVE",
    "FORWARD",
    "FORWARD_TRANSITIVE",
    "FULL",
    "FULL_TRANSITIVE",
    "NONE",
)
PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
PROMOTIONS = {
    "int": {"int", "long", "float", "double"},
    "long": {"long", "float", "double"},
    "float": {"float", "double"},
    "string": {"string", "bytes"},
    "bytes": {"bytes", "string"},
}


class InvalidSchema(ValueError):
    """Not an Avro schema; the message says why."""


def parse(text: str) -> tuple[Any, dict[str, Any]]:
    """(the parsed schema, its named types by full name); InvalidSchema when it is none."""
    try:
        doc = json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidSchema(f"the schema is not JSON: {exc}") from None
    names: dict[str, Any] = {}
    try:
        parsed = parse_schema(doc, named_schemas=names, _write_hint=False)
    except Exception as exc:  # fastavro raises several types for a bad schema
        raise InvalidSchema(f"invalid Avro schema: {exc}") from None
    return parsed, names


def canonical(text: str) -> str:
    """The form a schema is stored and compared in: compact JSON with sorted keys."""
    return json.dumps(json.loads(text), separators=(",", ":"), sort_keys=True)


class _Walk:
    def __init__(self, reader_names: dict[str, Any], writer_names: dict[str, Any]) -> None:
        self.rn = reader_names
        self.wn = writer_names
        self.seen: set[tuple[str, str]] = set()
        self.problems: list[str] = []

    def resolve(self, node: Any, names: dict[str, Any]) -> Any:
        if isinstance(node, str) and node not in PRIMITIVES:
            return names[node]
        if isinstance(node, dict) and node.get("type") in PRIMITIVES:
            return node["type"]  # a primitive with attributes (a logical type): rule 6
        return node

    def check(self, reader: Any, writer: Any, path: str) -> bool:
        r, w = self.resolve(reader, self.rn), self.resolve(writer, self.wn)
        if isinstance(w, list):  # rule 2
            ok = True
            for branch in w:
                ok = self.check(r, branch, path) and ok
            return ok
        if isinstance(r, list):
            for branch in r:
                if self._quiet(branch, w, path):
                    return True
            return self._fail(path, f"no branch of the reader's union reads {_kind(w)}")
        if isinstance(r, str) or isinstance(w, str):
            if isinstance(r, str) and isinstance(w, str) and r in PROMOTIONS.get(w, {w}):
                return True
            return self._fail(path, f"the reader's {_kind(r)} cannot read the writer's {_kind(w)}")
        return self._named(r, w, path)

    def _quiet(self, reader: Any, writer: Any, path: str) -> bool:
        saved = len(self.problems)
        ok = self.check(reader, writer, path)
        del self.problems[saved:]
        return ok

    def _fail(self, path: str, why: str) -> bool:
        self.problems.append(f"{path or '/'}: {why}")
        return False

    def _named(self, r: dict[str, Any], w: dict[str, Any], path: str) -> bool:
        kind = r["type"]
        if kind != w["type"]:
            return self._fail(path, f"the reader's {kind} cannot read the writer's {w['type']}")
        if kind == "array":
            return self.check(r["items"], w["items"], f"{path}/items")
        if kind == "map":
            return self.check(r["values"], w["values"], f"{path}/values")
        if r["name"] != w["name"] and w["name"] not in r.get("aliases", []):  # rule 3
            return self._fail(path, f"the reader's {kind} {r['name']} is not {w['name']}")
        if kind == "fixed":
            if r["size"] != w["size"]:
                return self._fail(path, f"fixed size {r['size']} cannot read size {w['size']}")
            return True
        if kind == "enum":
            missing = [s for s in w["symbols"] if s not in r["symbols"]]
            if missing and "default" not in r:  # rule 5
                return self._fail(path, f"the reader's enum lacks the symbols {missing}")
            return True
        pair = (r["name"], w["name"])
        if pair in self.seen:
            return True
        self.seen.add(pair)
        return self._record(r, w, path)

    def _record(self, r: dict[str, Any], w: dict[str, Any], path: str) -> bool:
        written = {f["name"]: f for f in w["fields"]}
        ok = True
        for field in r["fields"]:  # rule 4
            names = [field["name"], *field.get("aliases", [])]
            source = next((written[n] for n in names if n in written), None)
            at = f"{path}/{field['name']}"
            if source is not None:
                ok = self.check(field["type"], source["type"], at) and ok
            elif "default" not in field:
                ok = self._fail(at, "a field the writer lacks needs a default in the reader")
        return ok


def problems(reader: str, writer: str) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader``; empty: it can."""
    r, rn = parse(reader)
    w, wn = parse(writer)
    walk = _Walk(rn, wn)
    walk.check(r, w, "")
    return walk.problems


def incompatibilities(level: str, new: str, live: Sequence[str]) -> list[str]:
    """What ``level`` finds wrong with ``new`` after the subject's live schemas (oldest
    first); empty: ``new`` may be registered."""
    if level == "NONE" or not live:
        return []
    against = live if level.endswith("_TRANSITIVE") else live[-1:]
    found: list[str] = []
    for old in against:
        if level.startswith(("BACKWARD", "FULL")):
            found += [f"reading old data: {p}" for p in problems(new, old)]
        if level.startswith(("FORWARD", "FULL")):
            found += [f"old readers of new data: {p}" for p in problems(old, new)]
    return found


def _kind(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return "union"
    name = node.get("name")
    return f"{node['type']} {name}" if name else str(node["type"])
