"""Avro schemas derived from a handler's payload and result annotations, and the definitions
an agent registers for its app's task types.

A payload annotated with a dataclass or a TypedDict of JSON-like fields gets an Avro record
schema, which the agent registers with the node at start (the subject
``<app>.<task_type>-value``; the result's, ``-result``): enqueues of the type are then checked
against it, and Confluent clients can read it. What maps:

    str -> string      int -> long      float -> double      bool -> boolean
    None -> null       X | None, Optional[X] -> ["null", X] (X first when its default is not None)
    list[X] -> array   dict[str, X] -> map       a nested dataclass or TypedDict -> a record
    a field with a default (dataclass default or default_factory of [] / {}, a TypedDict key
    that is NotRequired or of a total=False class) -> a field with that default

What is refused (``AvroSchemaError`` naming the field): Any or no annotation, unions of two
non-None types, dict keys other than str, tuples, sets, bytes, enums, datetimes and other
classes, and a type that contains itself. A payload that is not a dataclass or a TypedDict
(a plain ``dict``, a scalar, Celery-style arguments) gets no schema: nothing is checked.
"""

from __future__ import annotations

import dataclasses
import inspect
import types
import typing
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NotRequired, Required, Union, get_args, get_origin

from conveyor.errors import ContractError

if TYPE_CHECKING:
    from conveyor.app import App, TaskType

PRIMITIVES: dict[Any, str] = {str: "string", int: "long", float: "double", bool: "boolean"}
_NONE = type(None)


class AvroSchemaError(ContractError):
    """An annotation that maps to no Avro schema; the message names where and why."""


def derivable(annotation: Any) -> bool:
    """Whether ``annotation`` is a class this module derives a record from."""
    return isinstance(annotation, type) and (
        dataclasses.is_dataclass(annotation) or typing.is_typeddict(annotation)
    )


def schema_of(annotation: Any) -> dict[str, Any]:
    """The Avro record schema of a dataclass or TypedDict."""
    if not derivable(annotation):
        raise AvroSchemaError(f"{annotation!r} is not a dataclass or a TypedDict")
    schema: dict[str, Any] = _Deriver().record(annotation, annotation.__name__)
    return schema


class _Deriver:
    def __init__(self) -> None:
        self.defined: set[str] = set()
        self.open: set[type] = set()

    def record(self, cls: type, path: str) -> Any:
        name = _full_name(cls)
        if cls in self.open:
            raise AvroSchemaError(f"{path}: {cls.__name__} contains itself; it is refused")
        if name in self.defined:
            return name  # a second use of a named type names it
        self.open.add(cls)
        fields = [self._field(*spec, path) for spec in _fields_of(cls)]
        self.open.discard(cls)
        self.defined.add(name)
        namespace, _, short = name.rpartition(".")
        out: dict[str, Any] = {"type": "record", "name": short, "fields": fields}
        if namespace:
            out["namespace"] = namespace
        return out

    def _field(self, name: str, annotation: Any, default: Any, path: str) -> dict[str, Any]:
        at = f"{path}.{name}"
        schema = self.type_of(annotation, at, default_is_none=default is None)
        out: dict[str, Any] = {"name": name, "type": schema}
        if default is not _MISSING:
            out["default"] = default
        return out

    def type_of(self, annotation: Any, at: str, *, default_is_none: bool = True) -> Any:
        origin, args = get_origin(annotation), get_args(annotation)
        if origin in (Required, NotRequired):
            return self.type_of(args[0], at, default_is_none=default_is_none)
        if annotation is None or annotation is _NONE:
            return "null"
        if annotation in PRIMITIVES:
            return PRIMITIVES[annotation]
        if origin in (Union, types.UnionType):
            others = [a for a in args if a is not _NONE]
            if len(others) != 1:
                raise AvroSchemaError(
                    f"{at}: a union of {', '.join(map(_name, others))}; only X | None maps"
                )
            inner = self.type_of(others[0], at)
            return ["null", inner] if default_is_none else [inner, "null"]
        if origin is list and len(args) == 1:
            return {"type": "array", "items": self.type_of(args[0], f"{at}[]")}
        if origin is dict and len(args) == 2:
            if args[0] is not str:
                raise AvroSchemaError(f"{at}: dict keys must be str, got {_name(args[0])}")
            return {"type": "map", "values": self.type_of(args[1], f"{at}{{}}")}
        if derivable(annotation):
            return self.record(annotation, at)
        raise AvroSchemaError(
            f"{at}: {_name(annotation)} has no Avro schema here (str, int, float, bool, None, "
            "X | None, list[X], dict[str, X], a dataclass or a TypedDict)"
        )


_MISSING: Any = object()


def _fields_of(cls: type) -> list[tuple[str, Any, Any]]:
    """(name, annotation, default or _MISSING) of a dataclass's or TypedDict's fields."""
    hints = typing.get_type_hints(cls, include_extras=True)
    if typing.is_typeddict(cls):
        optional = set(getattr(cls, "__optional_keys__", ())) | {
            n for n, h in hints.items() if get_origin(h) is NotRequired
        }
        if not getattr(cls, "__total__", True):
            optional |= {n for n, h in hints.items() if get_origin(h) is not Required}
        return [
            (n, hints[n] | None if n in optional else hints[n], None if n in optional else _MISSING)
            for n in hints
        ]
    out = []
    for f in dataclasses.fields(cls):
        default: Any = _MISSING
        if f.default is not dataclasses.MISSING:
            default = _json_default(f.default, f"{cls.__name__}.{f.name}")
        elif f.default_factory is not dataclasses.MISSING:
            default = _json_default(f.default_factory(), f"{cls.__name__}.{f.name}")
        out.append((f.name, hints[f.name], default))
    return out


def _json_default(value: Any, at: str) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if value == [] or value == {}:
        return value
    raise AvroSchemaError(f"{at}: its default {value!r} is not a JSON scalar, [] or {{}}")


def _full_name(cls: type) -> str:
    module = cls.__module__.replace("__main__", "main").replace("<", "").replace(">", "")
    return f"{module}.{cls.__qualname__.replace('.<locals>', '').replace('<', '')}"


def _name(annotation: Any) -> str:
    return getattr(annotation, "__name__", repr(annotation))


# -- the definitions an agent registers ------------------------------------------------------


def payload_schema(task: TaskType[Any, Any]) -> dict[str, Any] | None:
    """The Avro schema of ``task``'s payload: its one payload parameter's annotation, when
    it derives one (a handler taking several arguments, or none, gets no schema)."""
    params = [
        p
        for p in inspect.signature(task.fn).parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    if task.takes_context and params:
        params = params[1:]
    if len(params) != 1:
        return None
    annotation = _hints(task).get(params[0].name)
    return schema_of(annotation) if derivable(annotation) else None


def result_schema(task: TaskType[Any, Any]) -> dict[str, Any] | None:
    returns = _hints(task).get("return")
    return schema_of(returns) if derivable(returns) else None


def _hints(task: TaskType[Any, Any]) -> dict[str, Any]:
    try:
        return typing.get_type_hints(task.fn)
    except (NameError, TypeError):  # a forward reference not defined yet: no schema
        return {}


def definitions(app: App, *, warn: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Each task type of ``app`` as ``/worker/register`` takes it: its options (those of
    ``@app.task``) and its schemas. A handler whose annotation derives no schema (refused
    above) is registered without one, and ``warn`` is told why."""
    out = []
    for name, task in sorted(app.tasks.items()):
        o = task.options
        body: dict[str, Any] = {
            "task_type": name,
            "queue": o.queue,
            "priority": o.priority,
            "retry": o.retry.to_wire(),
            "timeouts": {k: v for k, v in o.timeouts().items() if v is not None},
            "cancel_grace_ms": o.cancel_grace_ms,
        }
        if task.is_workflow:
            body["resume"] = o.resume
        for key, derive in (("payload_schema", payload_schema), ("result_schema", result_schema)):
            try:
                schema = derive(task)
            except AvroSchemaError as exc:
                if warn is not None:
                    warn(f"task type {name!r}: no {key.replace('_', ' ')}: {exc}")
                continue
            if schema is not None:
                body[key] = schema
        out.append(body)
    return out
