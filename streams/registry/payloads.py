"""A JSON payload against its task type's Avro schema (the enqueue check).

A payload is plain JSON, as clients send it; it fits a schema when an Avro writer could
encode it: a record is an object with every field that has no default (fields it does not
name are left to the reader and allowed), a union takes a value any branch takes (JSON null
for "null"), int and long take integers in range, float and double any number, string,
bytes, enum and fixed take strings (an enum only its symbols), arrays and maps take lists
and objects whose items fit. ``mismatch`` names the first value that does not fit, by its
path in the payload, and the type the schema expects there.

An encoded payload (``conveyor.schemas.envelope``: compressed or encrypted by the client's
codec) is not checked: the node cannot read it, and the SDK checked it before encoding it.
"""

from __future__ import annotations

import functools
import json
from typing import Any

from conveyor.schemas.envelope import is_envelope
from conveyor.streams.registry.compatibility import PRIMITIVES, parse

INT_RANGE = (-(2**31), 2**31 - 1)
LONG_RANGE = (-(2**63), 2**63 - 1)
PARSED_MAX = 1_024  # parsed schemas kept


def mismatch(schema: str, payload: bytes) -> str | None:
    """Where ``payload`` (JSON) does not fit ``schema`` and what was expected; None if it
    fits, or if it is an encoded payload's envelope (unreadable here)."""
    parsed, names = _parsed(schema)
    value = json.loads(payload) if payload else None
    if is_envelope(value):
        return None
    return _check(parsed, value, "", names)


@functools.lru_cache(maxsize=PARSED_MAX)
def _parsed(schema: str) -> tuple[Any, dict[str, Any]]:
    """Parsing costs more than checking a payload; a schema text never changes meaning.
    (The result is only read.)"""
    return parse(schema)


def _expected(node: Any) -> str:
    if isinstance(node, str):
        return node
    if isinstance(node, list):
        return " or ".join(_expected(b) for b in node)
    if node.get("type") in PRIMITIVES:
        return str(node["type"])
    name = node.get("name")
    return f"{node['type']} {name}" if name else str(node["type"])


def _got(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check(node: Any, value: Any, path: str, names: dict[str, Any]) -> str | None:
    if isinstance(node, str) and node not in PRIMITIVES:
        node = names[node]
    if isinstance(node, dict) and node.get("type") in PRIMITIVES:
        node = node["type"]
    if isinstance(node, list):
        if any(_check(branch, value, path, names) is None for branch in node):
            return None
        return f"{path or '(the payload)'}: expected {_expected(node)}, got {_got(value)}"
    if isinstance(node, str):
        return None if _primitive(node, value) else _wrong(node, value, path)
    kind = node["type"]
    if kind == "record":
        if not isinstance(value, dict):
            return _wrong(node, value, path)
        for field in node["fields"]:
            at = f"{path}.{field['name']}"
            if field["name"] not in value:
                if "default" in field:
                    continue
                return f"{at}: missing; expected {_expected(field['type'])}"
            found = _check(field["type"], value[field["name"]], at, names)
            if found:
                return found
        return None
    if kind == "enum":
        ok = isinstance(value, str) and value in node["symbols"]
        where = path or "(the payload)"
        return None if ok else f"{where}: expected one of {node['symbols']}, got {_got(value)}"
    if kind == "fixed":
        return None if isinstance(value, str) else _wrong(node, value, path)
    if kind == "array":
        if not isinstance(value, list):
            return _wrong(node, value, path)
        for i, item in enumerate(value):
            if found := _check(node["items"], item, f"{path}[{i}]", names):
                return found
        return None
    if kind == "map":
        if not isinstance(value, dict):
            return _wrong(node, value, path)
        for key, item in value.items():
            if found := _check(node["values"], item, f"{path}.{key}", names):
                return found
        return None
    return _wrong(node, value, path)


def _wrong(node: Any, value: Any, path: str) -> str:
    return f"{path or '(the payload)'}: expected {_expected(node)}, got {_got(value)}"


def _primitive(kind: str, value: Any) -> bool:
    if kind == "null":
        return value is None
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in ("int", "long"):
        lo, hi = INT_RANGE if kind == "int" else LONG_RANGE
        return isinstance(value, int) and not isinstance(value, bool) and lo <= value <= hi
    if kind in ("float", "double"):
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, str)  # string, bytes
