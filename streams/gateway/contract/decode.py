"""Decode a parsed body into a model; a refusal names the field in the gateway's path form.

msgspec says ``Expected `int | null`, got `str` - at `$.tasks[3].priority```. The client reads
``tasks[3].priority: must be an integer 0..9, got "high"``: the path as ``fields.py`` writes
it (rule 2 there), what the model expects at that path (from ``msgspec.inspect``) and what was
sent. The body was parsed by ``fields.parse_json`` first, so its rule 1 (duplicate keys, depth,
64-bit integers, finite numbers) holds before any model sees it.
"""

from __future__ import annotations

import re
from typing import Any, TypeVar

import msgspec
import msgspec.inspect as mi

from conveyor.contract.limits import NAME_BYTES_MAX
from conveyor.contract.shapes import NAME_PATTERN
from conveyor.errors import ContractError
from conveyor.schemas import limits
from conveyor.streams.gateway.fields import describe, invalid, join

M = TypeVar("M")
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]*)`")
_STEP = re.compile(r"\.([^.\[]+)|\[(\d+)\]")


def model(body: Any, kind: type[M], path: str = "") -> M:
    """``body`` as a ``kind``, or a 400 naming the field at fault under ``path``. A number
    with no fraction (``2.0``) is an integer, as JSON Schema says: it is taken where an
    integer is expected (rarely sent, so handled on the error path, one field at a time)."""
    for _ in range(_INTEGRAL_FIXES_MAX):
        try:
            return msgspec.convert(body, kind, str_keys=True)
        except msgspec.ValidationError as exc:
            message = str(exc)
            if not _INTEGRAL.match(message) or not _make_integer(body, _steps(message)):
                raise refusal(message, body, kind, path) from None
    raise invalid(path, f"more than {_INTEGRAL_FIXES_MAX} integers written with a fraction")


def check_text(text: str | None, path: str, bytes_max: int = NAME_BYTES_MAX) -> None:
    """What a ``Text`` field's type cannot state: its byte limit (``check_bytes``)."""
    if text is not None and not text.isascii():
        check_bytes(text, path, bytes_max)


def check_bytes(text: str, path: str, bytes_max: int) -> None:
    """A byte limit no type states (``conveyor.contract.shapes`` rule 2): the model bounded
    ``text`` in characters, the node bounds its UTF-8. Only non-ASCII text can be over."""
    if not text.isascii():
        size = len(text.encode("utf-8"))
        if size > bytes_max:
            raise invalid(path, f"must be at most {bytes_max} bytes of UTF-8, got {size} bytes")


_INTEGRAL = re.compile(r"^Expected `int[^`]*`, got `float`")
_INTEGRAL_FIXES_MAX = 64


def _steps(message: str) -> list[str | int]:
    at = _AT.search(message)
    where = at.group("path") if at else ""
    return [name or int(index) for name, index in _STEP.findall(where)]


def _make_integer(body: Any, steps: list[str | int]) -> bool:
    """Replace the float at ``steps`` by its integer if it has no fraction; whether it did."""
    if not steps:
        return False
    parent = _value_at(body, steps[:-1])
    value = _value_at(body, steps)
    if not isinstance(value, float) or not value.is_integer():
        return False
    parent[steps[-1]] = int(value)
    return True


def refusal(message: str, body: Any, kind: type[Any], path: str = "") -> ContractError:
    """The ``ContractError`` for msgspec's ``message`` about ``body`` decoded as ``kind``."""
    at = _AT.search(message)
    where = at.group("path") if at else ""
    steps = _steps(message)
    field = join(path, where.lstrip(".")) if where else path
    if (unknown := _UNKNOWN.match(message)) is not None:
        name = unknown.group("name")
        known = ", ".join(sorted(_field_names(_at_path(kind, steps))))
        return invalid(join(field, name), f"unknown field; expected one of: {known}")
    if (missing := _MISSING.match(message)) is not None:
        name = missing.group("name")
        info = _field_type(_at_path(kind, steps), name)
        return invalid(join(field, name), f"is required ({expected(info)})")
    value = _value_at(body, steps)
    info = _at_path(kind, steps)
    if (name := _name_type(info)) is not None and isinstance(value, str):
        fault = limits.name_fault(value, name.max_length or limits.NAME_CHARS_MAX)
        if fault is not None:
            return invalid(field, fault)
    return invalid(field, f"must be {expected(info)}, got {_sent(value, _bare(info))}")


def _sent(value: Any, info: mi.Type | None) -> str:
    """What was sent: its length where the type bounds one, else its rendering."""
    if isinstance(value, list) and isinstance(info, mi.ListType):
        return f"{len(value)} items"
    if (
        isinstance(value, str)
        and isinstance(info, mi.StrType)
        and len(value) > (info.max_length or len(value))
    ):
        return f"{len(value)} characters"
    return describe(value)


def expected(info: mi.Type | None) -> str:
    """What a type accepts, in the words of ``fields.py``'s messages."""
    if info is None or isinstance(info, mi.AnyType):
        return "any JSON value"
    if isinstance(info, mi.Metadata):
        described = (info.extra_json_schema or {}).get("description")
        base = info.type
        if described and isinstance(base, mi.StrType) and base.pattern not in (None, NAME_PATTERN):
            return str(described)
        return expected(base)
    if isinstance(info, mi.UnionType):
        kinds = [expected(t) for t in info.types if not isinstance(t, mi.NoneType)]
        return " or ".join(kinds) if kinds else "null"
    return _simple(info)


def _simple(info: mi.Type) -> str:
    if isinstance(info, mi.IntType):
        return f"an integer {_span(info.ge, info.le)}"
    if isinstance(info, mi.FloatType):
        return f"a number {_span(info.ge, info.le)}"
    if isinstance(info, mi.BoolType):
        return "true or false"
    if isinstance(info, mi.StrType):
        if info.pattern == NAME_PATTERN:
            return limits.name_rule(info.max_length or limits.NAME_CHARS_MAX)
        if not info.min_length and info.max_length is None:
            return "a string"
        return f"a string of {_span(info.min_length or 0, info.max_length, 'characters')}"
    if isinstance(info, mi.LiteralType):
        return "one of " + "|".join(str(v) for v in info.values)
    if isinstance(info, mi.ListType):
        return f"an array of {_span(info.min_length or 0, info.max_length, 'items')}"
    if isinstance(info, mi.StructType | mi.DictType):
        return "an object"
    return type(info).__name__


def _span(lo: Any, hi: Any, unit: str = "") -> str:
    lo, hi = _number(lo), _number(hi)
    tail = f" {unit}" if unit else ""
    if hi is None:
        return f"at least {lo}{tail}" if lo else f"any number of{tail}" if unit else "any"
    if not lo and unit:
        return f"at most {hi}{tail}"
    return f"{lo if lo is not None else ''}{'..' if lo is not None else 'at most '}{hi}{tail}"


def _number(bound: Any) -> Any:
    """A bound as written: 30000 and 9223372036854775807, not 30000.0 or 9.22337e+18."""
    if isinstance(bound, float) and bound.is_integer():
        return int(bound)
    return bound


def _value_at(body: Any, steps: list[str | int]) -> Any:
    for step in steps:
        try:
            body = body[step]
        except (KeyError, IndexError, TypeError):
            return None
    return body


def _info(kind: Any) -> mi.Type:
    return mi.type_info(kind)  # on the error path only: not kept


def _bare(info: mi.Type | None) -> mi.Type | None:
    """``info`` without its metadata and, of a union with null, the one other type."""
    while isinstance(info, mi.Metadata):
        info = info.type
    if isinstance(info, mi.UnionType):
        rest = [t for t in info.types if not isinstance(t, mi.NoneType)]
        if len(rest) == 1:
            return _bare(rest[0])
    return info


def _at_path(kind: type[Any], steps: list[str | int]) -> mi.Type | None:
    info: mi.Type | None = _info(kind)
    for step in steps:
        bare = _bare(info)
        if isinstance(bare, mi.UnionType):  # several shapes: the first that has the step
            bare = next(
                (_bare(t) for t in bare.types if isinstance(_bare(t), mi.StructType | mi.ListType)),
                None,
            )
        if isinstance(step, int) and isinstance(bare, mi.ListType):
            info = bare.item_type
        elif isinstance(step, str) and isinstance(bare, mi.StructType):
            info = _field_type(bare, step)
        elif isinstance(step, str) and isinstance(bare, mi.DictType):
            info = bare.value_type
        else:
            return None
    return info


def _field_type(info: mi.Type | None, name: str) -> mi.Type | None:
    bare = _bare(info)
    if not isinstance(bare, mi.StructType):
        return None
    return next((f.type for f in bare.fields if f.encode_name == name), None)


def _field_names(info: mi.Type | None) -> list[str]:
    bare = _bare(info)
    return [f.encode_name for f in bare.fields] if isinstance(bare, mi.StructType) else []


def _name_type(info: mi.Type | None) -> mi.StrType | None:
    bare = _bare(info)
    return bare if isinstance(bare, mi.StrType) and bare.pattern == NAME_PATTERN else None
