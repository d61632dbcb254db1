"""Avro <-> dataclasses. The only module that imports fastavro.

Every schema under records/, state/ and events/ is parsed once at import. A log record is an
``Envelope`` whose ``body`` is the Avro encoding of the record named by ``kind``; encoding the
body separately lets a reader route on ``kind`` without decoding the body, and keeps each body
schema independent (adding a record kind never changes the envelope).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import itertools
import json
import keyword
import operator
import struct
from collections.abc import Callable, Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from fastavro import parse_schema, schemaless_reader, schemaless_writer
from fastavro.schema import expand_schema

from conveyor.errors import InvariantError
from conveyor.schemas import types as t

SCHEMA_DIR = Path(__file__).parent
T = TypeVar("T")

_named: dict[str, Any] = {}


def _load(relpath: str) -> Any:
    with open(SCHEMA_DIR / relpath) as fh:
        return parse_schema(json.load(fh), named_schemas=_named)


def _history(kind: str) -> list[Any]:
    """The schemas a record kind had before its current one, oldest first:
    ``records/history/<kind>.v<N>.avsc``, each parsed on its own (its names are old)."""
    found = sorted(
        (int(path.stem.rpartition(".v")[2]), path)
        for path in (SCHEMA_DIR / "records" / "history").glob(f"{kind}.v*.avsc")
    )
    if [n for n, _ in found] != list(range(1, len(found) + 1)):
        raise InvariantError(f"{kind}: gap in the schema history {[p.name for _, p in found]}")
    schemas = []
    for _, path in found:
        with open(path) as fh:
            schemas.append(parse_schema(json.load(fh), named_schemas={}))
    return schemas


# Nested dataclass fields and enum fields per class: what a plain dict must be turned into.
_NESTED: dict[type, dict[str, type]] = {
    t.GrantLeases: {"requests": t.LeaseRequest},
    t.CompleteAttempts: {"items": t.Completion},
    t.SaveCheckpoints: {"items": t.Checkpoint},
    t.RecordSteps: {"items": t.StepWrite},
    t.ExpireLeases: {"items": t.LeaseRef},
    t.FireTimers: {"timers": t.TimerRef},
    t.SendEvents: {"items": t.WorkflowEvent},
    t.LandChildren: {"items": t.ChildDone},
    t.RegisterTypes: {"types": t.TypeDefinition},
    t.EventExtras: {"steps": t.StepEvent, "schedules": t.ScheduleEvent},
}
# Optional nested records (a union of null and a record) per class.
_OPTIONAL: dict[type, dict[str, type]] = {
    t.Completion: {"sleep": t.SleepStep, "fan_out": t.FanOut, "wait": t.WaitStep},
}
_ENUMS: dict[type, dict[str, type[StrEnum]]] = {
    t.Completion: {"outcome": t.Outcome},
    t.StepWrite: {"op": t.StepOp},
    t.FanOut: {"mode": t.ParallelMode},
    t.TimerRef: {"kind": t.TimerKind},
    t.TaskEvent: {"kind": t.EventKind},
    t.UpsertSchedule: {"overlap": t.OverlapPolicy, "catch_up": t.CatchUp},
}


class Codec(Generic[T]):
    """Encode and decode one dataclass type with one parsed Avro schema."""

    def __init__(self, cls: type[T], schema: Any) -> None:
        self.cls = cls
        self.schema = schema
        self.names = [f.name for f in dataclasses.fields(cast(Any, cls))]
        self._to_dict = _make_to_dict(cls)
        self._from_dict = _make_from_dict(cls)
        try:
            self._write: Callable[[Any], bytes] | None = flat_writer(schema)
        except NotFlat:
            self._write = None

    def encode(self, obj: T) -> bytes:
        if self._write is not None:
            return self._write(obj)
        buf = io.BytesIO()
        schemaless_writer(buf, self.schema, self._to_dict(obj))
        return buf.getvalue()

    def decode(self, data: bytes) -> T:
        datum = cast(dict[str, Any], schemaless_reader(io.BytesIO(data), self.schema, None))
        return cast(T, self._from_dict(datum))

    def decode_exact(self, data: bytes, writer: Any = None) -> T:
        """``decode``, refusing bytes after the datum: a log record is exactly one datum.
        ``writer``: the schema the bytes were written with, when it is an older one (its
        datum is resolved to the current schema: fields added since take their defaults)."""
        buf = io.BytesIO(data)
        if writer is None:
            datum = cast(dict[str, Any], schemaless_reader(buf, self.schema, None))
        else:
            datum = cast(dict[str, Any], schemaless_reader(buf, writer, self.schema))
        if buf.tell() != len(data):
            raise ValueError(f"{len(data) - buf.tell()} bytes after the {self.cls.__name__}")
        return cast(T, self._from_dict(datum))


def _read(data: bytes, schema: Any) -> dict[str, Any]:
    return cast(dict[str, Any], schemaless_reader(io.BytesIO(data), schema, None))


# -- a faster writer ------------------------------------------------------------------------
#
# fastavro's schemaless_writer spends most of its time per call and per field (it re-walks the
# schema each time); the hot rows and records have simple schemas, so for those a writer made
# once from the schema gives the same bytes at about half the cost. Reading stays fastavro's.


class NotFlat(Exception):
    """A schema (or a part of it) the made writers do not handle: fastavro writes it."""


# An Avro long is the varint of its zigzag: little-endian base-128, the high bit of every
# byte but the last set. These hold every 14-bit number as the last chunk (1 or 2 bytes) and
# as a chunk that more follow (2 bytes, high bits set): one lookup per 14 bits, not a loop per 7.
_LAST = tuple(bytes((z,)) for z in range(0x80)) + tuple(
    bytes((lo | 0x80, hi)) for hi in range(1, 0x80) for lo in range(0x80)
)
_MORE = tuple(bytes((lo | 0x80, hi | 0x80)) for hi in range(0x80) for lo in range(0x80))


# The encodings of larger numbers met lately. A batch repeats its few large numbers many times
# (the time and the record offset in every row and event of a record), and a lookup here
# costs a seventh of working one out; cleared when full, so it holds at most ``_KNOWN_MAX``.
_KNOWN: dict[int, bytes] = {}
_KNOWN_MAX = 1 << 14
Key = TypeVar("Key", int, str)


def _write_long(n: int) -> bytes:
    """The Avro encoding of an int or long."""
    if 0 <= n < 0x2000:  # counts, attempts, lengths: the zigzag of n is 2n
        return _LAST[n << 1]
    known = _KNOWN.get(n)
    return known if known is not None else _keep(_KNOWN, n, _zigzag_varint(n))


def _keep(table: dict[Key, bytes], key: Key, written: bytes) -> bytes:
    """``written``, kept in ``table`` under ``key``; a full table starts empty again."""
    if len(table) >= _KNOWN_MAX:
        table.clear()
    table[key] = written
    return written


# The same for short strings: a batch's rows and events name the same few tenants, apps, task
# types, queues and statuses again and again. Only short ones, so the table stays small.
_KNOWN_TEXT: dict[str, bytes] = {}
_KNOWN_TEXT_LEN_MAX = 64


def _write_string(s: str) -> bytes:
    """The Avro encoding of a string: its UTF-8 length, then its UTF-8 bytes."""
    known = _KNOWN_TEXT.get(s)
    if known is not None:
        return known
    raw = s.encode()
    written = _write_long(len(raw)) + raw
    return _keep(_KNOWN_TEXT, s, written) if len(s) <= _KNOWN_TEXT_LEN_MAX else written


def _zigzag_varint(n: int) -> bytes:
    if not -(2**63) <= n < 2**63:
        raise OverflowError(f"{n} does not fit an Avro long")
    z = (n << 1) ^ (n >> 63)
    if z < 0x4000:
        return _LAST[z]
    if z < 1 << 28:
        return _MORE[z & 0x3FFF] + _LAST[z >> 14]
    if z < 1 << 42:  # a time in ms since 1970 (z ~ 2^41.7) takes this path, not the loop
        return _MORE[z & 0x3FFF] + _MORE[(z >> 14) & 0x3FFF] + _LAST[z >> 28]
    chunks = []
    while z >= 0x4000:
        chunks.append(_MORE[z & 0x3FFF])
        z >>= 14
    chunks.append(_LAST[z])
    return b"".join(chunks)


# A made writer is one expression, written out (``exec``, as ``dataclasses`` makes
# ``__init__``): each primitive field's encoding is inlined, not a call, and an int below 2^13
# (counts, attempts, lengths) is one lookup. The names a writer's code may use:
_SCOPE: dict[str, Any] = {
    "_L": _LAST,
    "_wl": _write_long,
    "_K": _KNOWN,
    "_KT": _KNOWN_TEXT,
    "_ws": _write_string,
    "_pd": struct.Struct("<d").pack,
    "_pf": struct.Struct("<f").pack,
}


def _long_expr(x: str, temps: Iterator[str]) -> str:
    t = next(temps)
    return f"(_L[{t} << 1] if 0 <= ({t} := {x}) < 0x2000 else _K.get({t}) or _wl({t}))"


def _sized_expr(data: str, temps: Iterator[str]) -> str:
    """The length of ``data`` (an expression of bytes), then the bytes."""
    t, n = next(temps), next(temps)
    return f"((_L[{n} << 1] if ({n} := len({t} := {data})) < 0x2000 else _wl({n})) + {t})"


_PRIMITIVE_EXPRS: dict[str, Callable[[str, Iterator[str]], str]] = {
    "null": lambda x, temps: 'b""',
    "int": _long_expr,
    "long": _long_expr,
    "string": lambda x, temps: f"(_KT.get({x}) or _ws({x}))",
    "bytes": _sized_expr,
    "boolean": lambda x, temps: f'(b"\\x01" if {x} else b"\\x00")',
    "double": lambda x, temps: f"_pd({x})",
    "float": lambda x, temps: f"_pf({x})",
}


def _value_expr(
    schema: Any,
    named: dict[str, Any],
    within: frozenset[str],
    x: str,
    scope: dict[str, Any],
    temps: Iterator[str],
) -> str:
    """An expression of the Avro encoding of the value of expression ``x``, of ``schema``: a
    primitive, an enum, a record (a dataclass or a dict), an array of these, or a union of
    null and one of these. Anything else, and a record within itself, raises ``NotFlat``.
    Writers it calls go in ``scope``; ``temps`` names the expression's local variables."""
    if isinstance(schema, str):
        if schema in _PRIMITIVE_EXPRS:
            return _PRIMITIVE_EXPRS[schema](x, temps)
        if schema in named and schema not in within:  # a named type defined elsewhere
            return _value_expr(named[schema], named, within, x, scope, temps)
        raise NotFlat(schema)
    if isinstance(schema, list):
        if len(schema) == 2 and schema[0] == "null" and schema[1] != "null":
            t = next(temps)
            inner = _value_expr(schema[1], named, within, t, scope, temps)
            return f'(b"\\x00" if ({t} := {x}) is None else b"\\x02" + {inner})'
        raise NotFlat(schema)
    kind = schema.get("type")
    if kind == "enum":
        index = {symbol: _write_long(i) for i, symbol in enumerate(schema["symbols"])}
        return f"{_bind(scope, index)}[{x}]"  # a StrEnum member finds its symbol
    if kind == "array":  # one block of all the items, then the empty block
        t, item = next(temps), next(temps)
        each = _value_expr(schema["items"], named, within, item, scope, temps)
        return (
            f'(b"\\x00" if not ({t} := {x}) else '
            f'b"".join([_wl(len({t})), *[{each} for {item} in {t}], b"\\x00"]))'
        )
    if kind == "record" and schema["name"] not in within:
        inner_within = within | {schema["name"]}
        names = [f["name"] for f in schema["fields"]]
        by_attribute = _joined(schema, [f"v.{name}" for name in names], named, inner_within)
        by_key = _joined(schema, [f"v[{name!r}]" for name in names], named, inner_within)

        def write_record(value: Any) -> bytes:
            return by_key(value) if isinstance(value, dict) else by_attribute(value)

        return f"{_bind(scope, write_record)}({x})"
    raise NotFlat(schema)  # maps, fixed, logical types


def _bind(scope: dict[str, Any], value: Any) -> str:
    """A new name for ``value`` in ``scope``."""
    name = f"_w{len(scope)}"
    scope[name] = value
    return name


def _temps() -> Iterator[str]:
    return (f"_t{i}" for i in itertools.count())


def _joined(
    schema: Any, values: list[str], named: dict[str, Any], within: frozenset[str]
) -> Callable[[Any], bytes]:
    """``lambda v: b"".join((<encoding of values[0]>, <of values[1]>, ...))`` for the fields
    of record ``schema``, each ``values[i]`` an expression of ``v`` reading field i: no loop,
    zip or tuple of values per call. Avro names are identifiers; anything else is refused
    (``NotFlat``) rather than put in code."""
    names = [f["name"] for f in schema["fields"]]
    if not all(name.isidentifier() and not keyword.iskeyword(name) for name in names):
        raise NotFlat(names)
    scope, temps = dict(_SCOPE), _temps()
    parts = [
        _value_expr(f["type"], named, within, value, scope, temps)
        for f, value in zip(schema["fields"], values, strict=True)
    ]
    exec(f"def write(v):\n    return b''.join(({', '.join(parts)},))\n", scope)
    return cast(Callable[[Any], bytes], scope["write"])


def tuple_writer(schema: Any) -> Callable[[tuple[Any, ...]], bytes]:
    """An encoder of the field values of record ``schema``, in field order, giving the bytes
    ``schemaless_writer`` gives (``tests/unit/test_codec.py`` holds them equal). Every field
    must be what ``_value_expr`` handles, or this raises ``NotFlat``."""
    named, within = _names_of(schema)
    return _joined(schema, [f"v[{i}]" for i in range(len(schema["fields"]))], named, within)


def flat_writer(schema: Any) -> Callable[[Any], bytes]:
    """The encoder of ``tuple_writer``, of the attributes of an object named like the fields of
    ``schema``."""
    named, within = _names_of(schema)
    return _joined(schema, [f"v.{f['name']}" for f in schema["fields"]], named, within)


def _names_of(schema: Any) -> tuple[dict[str, Any], frozenset[str]]:
    return {**_named, **schema.get("__named_schemas", {})}, frozenset({schema["name"]})


class TaskCodec:
    """The in-memory ``Task`` stored as three rows, so a transition re-encodes only the small
    ``TaskState``: ``TaskHead`` is written once and ``TaskDetail`` only when it changes."""

    def __init__(self) -> None:
        self.head = [f["name"] for f in TASK_HEAD["fields"]]
        self.state = [f["name"] for f in TASK_STATE["fields"]]
        self.detail = [f["name"] for f in TASK_DETAIL["fields"]]
        self.encode_head = flat_writer(TASK_HEAD)
        self.encode_state = flat_writer(TASK_STATE)
        self._encode_detail = flat_writer(TASK_DETAIL)
        # The detail fields' values, compared with ``Task.detail_written`` at each commit.
        self.detail_of: Callable[[t.Task], tuple[Any, ...]] = operator.attrgetter(*self.detail)

    def encode_detail(self, task: t.Task) -> bytes:
        return self._encode_detail(task)

    def decode(self, head: bytes, state: bytes, detail: bytes | None) -> t.Task:
        fields: dict[str, Any] = {}
        fields.update(_read(head, TASK_HEAD))
        fields.update(_read(state, TASK_STATE))
        if detail is not None:
            fields.update(_read(detail, TASK_DETAIL))
        fields["status"] = t.TaskStatus(fields["status"])
        task = t.Task(**fields)
        task.detail_written = self.detail_of(task)
        return task


class NewerEvents(ValueError):
    """An events batch written by a newer Conveyor: refused by name, never misread."""


EVENTS_MARK = 0xFF


class EventBatchCodec:
    """``EventBatch`` <-> its columnar Avro form (see events/EventBatch.avsc), versioned.

    A batch is ``EVENTS_MARK``, its version (one byte), the EventBatch datum and, only when
    there are step or schedule events, the EventExtras datum (the trailer). A batch without the
    mark is version 1: every batch written before batches carried a version. The mark is never
    the first byte of such a batch, which is the zigzag varint of a partition number (even).
    Former versions keep their two schemas, self-contained, in ``events/history/v<N>/``: a batch
    of an older version is read with them and resolved to the current schemas (fields added
    since take their defaults), and one of a newer version raises ``NewerEvents``. The outbox
    rows and the events log hold these bytes, so a reader (the projector) meets batches of
    every version a node ever ran.

    ``encode(batch, keep=True)`` keeps the batch as it was for the next ``decode`` of the same
    bytes: a node's projector decodes what its processors encoded moments before, and
    decoding was a fifth of its time. A memo of this decoder (equal bytes decode to equal
    batches, and batches are not edited), bounded by ``KEEP_EVENTS``: past that it starts
    empty again, as in a node that projects nothing.
    """

    KEEP_EVENTS = 32_768

    def __init__(
        self, schema: Any, extras: Codec[t.EventExtras], history: list[tuple[Any, Any]]
    ) -> None:
        self.schema = schema
        self.extras = extras
        self.history = history  # [version N - 1]: the (EventBatch, EventExtras) of version N
        self.version = len(history) + 1
        self._head = bytes([EVENTS_MARK, self.version])
        self.columns = [f.name for f in dataclasses.fields(t.TaskEvent)]
        # (name, default) per field: a field no event has a column for writes its default
        self._fields = [(f["name"], f.get("default")) for f in schema["fields"]]
        self._write = tuple_writer(schema)
        self._column_getters = [(name, operator.attrgetter(name)) for name in self.columns]
        self._kinds = {kind.value: kind for kind in t.EventKind}
        self._rows = _column_builder(t.TaskEvent, self.columns)
        self._kept: dict[bytes, t.EventBatch] = {}
        self._kept_events = 0

    def encode(self, batch: t.EventBatch, *, keep: bool = False) -> bytes:
        datum: dict[str, Any] = {"partition": batch.partition, "offset": batch.offset}
        events = batch.events
        for name, column in self._column_getters:
            datum[name] = list(map(column, events))
        data = self._head + self._write(tuple(datum.get(n, d) for n, d in self._fields))
        if batch.steps or batch.schedules:
            extras = t.EventExtras(steps=batch.steps, schedules=batch.schedules)
            data += self.extras.encode(extras)
        if keep:
            if self._kept_events >= self.KEEP_EVENTS:
                self._kept.clear()
                self._kept_events = 0
            self._kept[data] = batch
            self._kept_events += len(events)
        return data

    def decode(self, data: bytes) -> t.EventBatch:
        kept = self._kept.pop(data, None)
        if kept is not None:
            self._kept_events -= len(kept.events)
            return kept
        version, start = (data[1], 2) if data[:1] == self._head[:1] else (1, 0)
        if version < 1:
            raise ValueError("an events batch of version 0: versions start at 1")
        if version > self.version:
            raise NewerEvents(
                f"an events batch of version {version}, written by a newer Conveyor (this one "
                f"reads versions up to {self.version}): upgrade this reader before it goes on"
            )
        writer, extras_writer = (
            (None, None) if version == self.version else self.history[version - 1]
        )
        buf = io.BytesIO(data)
        buf.seek(start)
        if writer is None:
            datum = cast(dict[str, Any], schemaless_reader(buf, self.schema, None))
        else:
            datum = cast(dict[str, Any], schemaless_reader(buf, writer, self.schema))
        datum["kind"] = list(map(self._kinds.__getitem__, datum["kind"]))
        if writer is not None:
            _fill_added_columns(datum, self.columns)
        events = self._rows(datum)
        batch = t.EventBatch(partition=datum["partition"], offset=datum["offset"], events=events)
        if buf.tell() == len(data):
            return batch
        extras = self.extras.decode_exact(data[buf.tell() :], extras_writer)
        return dataclasses.replace(batch, steps=extras.steps, schedules=extras.schedules)


def _fill_added_columns(datum: dict[str, Any], names: list[str]) -> None:
    """A column added since a batch's version resolves to its default, an empty array: one
    null per event instead (every added column is nullable)."""
    count = len(datum["kind"])
    for name in names:
        if count and not datum[name]:
            datum[name] = [None] * count


def self_contained(schema: Any) -> dict[str, Any]:
    """A parsed schema with every named type it uses written out in place: what a history
    file holds, so that it parses on its own however the current schemas change."""

    def strip(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: strip(v) for k, v in node.items() if not k.startswith("__")}
        if isinstance(node, list):
            return [strip(v) for v in node]
        return node

    return cast(dict[str, Any], strip(expand_schema(schema)))


def _events_history() -> list[tuple[Any, Any]]:
    """The (EventBatch, EventExtras) schemas of every former events version, oldest first."""
    root = SCHEMA_DIR / "events" / "history"
    found = sorted((int(d.name[1:]), d) for d in root.glob("v*") if d.is_dir())
    if [n for n, _ in found] != list(range(1, len(found) + 1)):
        raise InvariantError(f"events: gap in the schema history {[p.name for _, p in found]}")
    out = []
    for _, folder in found:
        pair = []
        for name in ("EventBatch.avsc", "EventExtras.avsc"):
            with open(folder / name) as fh:
                pair.append(parse_schema(json.load(fh), named_schemas={}))
        out.append((pair[0], pair[1]))
    return out


def _make_to_dict(cls: type) -> Callable[[Any], dict[str, Any]]:
    names = [f.name for f in dataclasses.fields(cls)]
    nested = {name: _make_to_dict(sub) for name, sub in _NESTED.get(cls, {}).items()}
    optional = {name: _make_to_dict(sub) for name, sub in _OPTIONAL.get(cls, {}).items()}

    def to_dict(obj: Any) -> dict[str, Any]:
        d = {name: getattr(obj, name) for name in names}
        for name, conv in nested.items():
            d[name] = [conv(item) for item in d[name]]
        for name, conv in optional.items():
            if d[name] is not None:
                d[name] = conv(d[name])
        return d

    return to_dict


def _make_init(cls: type) -> Callable[[dict[str, Any]], Any]:
    """``cls(**d)``; for a frozen slotted dataclass, without its generated ``__init__``, which
    sets each field through ``object.__setattr__`` (most of the cost of decoding a spec).
    ``d`` must hold every field, as a datum of the class's schema does."""
    fields = dataclasses.fields(cls)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    plain = params.frozen and "__slots__" in cls.__dict__ and all(f.init for f in fields)
    if not plain or hasattr(cls, "__post_init__"):
        return lambda d: cls(**d)
    setters = [(cls.__dict__[f.name].__set__, f.name) for f in fields]
    new = object.__new__

    def init(d: dict[str, Any]) -> Any:
        obj: Any = new(cls)
        for set_field, name in setters:
            set_field(obj, d[name])
        return obj

    return init


def _column_builder(cls: type, names: list[str]) -> Callable[[dict[str, Any]], list[Any]]:
    """The ``cls`` objects whose fields ``names`` are the equal-length columns of a datum,
    built a column at a time: each column's values go through the field's slot setter in one
    ``map`` (no ``__init__``, no dict per row). ``cls`` is a frozen slotted dataclass."""
    setters = [cls.__dict__[name].__set__ for name in names]
    new = object.__new__

    def build(datum: dict[str, Any]) -> list[Any]:
        columns = [datum[name] for name in names]
        count = len(columns[0]) if columns else 0
        if any(len(column) != count for column in columns):
            raise ValueError("the columns of an events batch differ in length")
        objs: list[Any] = [new(cls) for _ in range(count)]
        for set_field, column in zip(setters, columns, strict=True):
            collections.deque(map(set_field, objs, column), maxlen=0)
        return objs

    return build


def _make_from_dict(cls: type) -> Callable[[dict[str, Any]], Any]:
    nested = {name: _make_from_dict(sub) for name, sub in _NESTED.get(cls, {}).items()}
    optional = {name: _make_from_dict(sub) for name, sub in _OPTIONAL.get(cls, {}).items()}
    enums = _ENUMS.get(cls, {})
    init = _make_init(cls)
    if not nested and not enums and not optional:
        return init

    def from_dict(d: dict[str, Any]) -> Any:
        for name, conv in nested.items():
            d[name] = [conv(item) for item in d[name]]
        for name, conv in optional.items():
            if d[name] is not None:
                d[name] = conv(d[name])
        for name, enum in enums.items():
            d[name] = enum(d[name])
        return init(d)

    return from_dict


class SpecCodec(Codec[t.TaskSpec]):
    """TaskSpec datums are nested in records and state rows (EnqueueTasks items, fan-out
    children, schedule templates, the ``specs`` table), so they carry no version of their own.
    A field is only ever added at the end, with a default: a datum of an older schema is
    exactly that schema's bytes and ends before the new fields, while a current one always
    holds at least one byte more. So a datum the current schema cannot read to its end is read
    with the older schemas (``records/history/TaskSpec.v<N>.avsc``), newest first."""

    def __init__(self) -> None:
        super().__init__(t.TaskSpec, _load("records/TaskSpec.avsc"))
        self.history = _history("TaskSpec")

    def decode(self, data: bytes) -> t.TaskSpec:
        try:
            return self.decode_exact(data)
        except Exception:
            for writer in reversed(self.history):
                try:
                    return self.decode_exact(data, writer)
                except Exception:
                    continue
            raise


ENVELOPE = Codec(t.Envelope, _load("records/Envelope.avsc"))
TASK_SPEC = SpecCodec()
RECORDS: dict[str, Codec[Any]] = {
    cls.__name__: Codec(cls, _load(f"records/{cls.__name__}.avsc"))
    for cls in (
        t.EnqueueTasks,
        t.CancelTasks,
        t.RetryFailed,
        t.GrantLeases,
        t.CompleteAttempts,
        t.SaveCheckpoints,
        t.RecordSteps,
        t.ExpireLeases,
        t.FireTimers,
        t.AnnounceEpoch,
        t.UpsertSchedule,
        t.DeleteSchedule,
        t.PauseSchedule,
        t.PauseQueue,
        t.SendEvents,
        t.EnqueueChildren,
        t.LandChildren,
        t.RegisterTypes,
        t.RegisterSchema,
        t.DeleteSchemas,
        t.SetCompatibility,
    )
}
TASK_HEAD = _load("state/TaskHead.avsc")
TASK_STATE = _load("state/TaskState.avsc")
TASK_DETAIL = _load("state/TaskDetail.avsc")
TASK = TaskCodec()
ATTEMPT = Codec(t.Attempt, _load("state/Attempt.avsc"))
IDEMPOTENCY = Codec(t.IdempotencyEntry, _load("state/IdempotencyEntry.avsc"))
STEP_ROW = Codec(t.StepRow, _load("state/StepRow.avsc"))
SCHEDULE = Codec(t.Schedule, _load("state/Schedule.avsc"))
STEP_TOTALS = Codec(t.StepTotals, _load("state/StepTotals.avsc"))
BARRIER = Codec(t.Barrier, _load("state/Barrier.avsc"))
CHILD_LINK = Codec(t.ChildLink, _load("state/ChildLink.avsc"))
EVENT_WAIT = Codec(t.EventWait, _load("state/EventWait.avsc"))
CHILD_RESULT = Codec(t.ChildResult, _load("state/ChildResult.avsc"))
TASK_EVENT = Codec(t.TaskEvent, _load("events/TaskEvent.avsc"))
STEP_EVENT = Codec(t.StepEvent, _load("events/StepEvent.avsc"))
SCHEDULE_EVENT = Codec(t.ScheduleEvent, _load("events/ScheduleEvent.avsc"))
EVENT_EXTRAS = Codec(t.EventExtras, _load("events/EventExtras.avsc"))
EVENT_BATCH = EventBatchCodec(_load("events/EventBatch.avsc"), EVENT_EXTRAS, _events_history())


# Schema evolution of log records. A record kind whose body schema changed keeps its former
# schemas in records/history/<Kind>.v<N>.avsc; the current one is the next version. A record is
# written as kind "<Kind>.v<N>" ("<Kind>" alone is version 1, as every record written before a
# kind first changed), and read with the schema it was written with, resolved to the current
# one. So a node reads every record any earlier version wrote, and refuses, by name, one that
# a newer version wrote.
HISTORY: dict[str, list[Any]] = {kind: _history(kind) for kind in RECORDS}
VERSION: dict[str, int] = {kind: len(schemas) + 1 for kind, schemas in HISTORY.items()}


class RecordDecodeError(Exception):
    """A log record that is not a valid envelope or body; the processor quarantines it."""


class NewerRecord(Exception):
    """A record a newer version of Conveyor wrote. Not a bad record: skipping it would drop
    acknowledged work, so the processor halts that partition instead (run the newer version)."""


def wire_kind(kind: str) -> str:
    """The envelope's kind for a record of ``kind`` written now."""
    version = VERSION[kind]
    return kind if version == 1 else f"{kind}.v{version}"


def kind_of(envelope: t.Envelope) -> tuple[str, int]:
    """(record kind, schema version) of an envelope."""
    kind, _, version = envelope.kind.partition(".v")
    return kind, int(version) if version.isdigit() else 1


def encode_record(record: t.Record, *, epoch: int, ts_ms: int, key: str) -> bytes:
    kind = type(record).__name__
    body = RECORDS[kind].encode(record)
    return ENVELOPE.encode(
        t.Envelope(kind=wire_kind(kind), epoch=epoch, ts_ms=ts_ms, key=key, body=body)
    )


# Stamps at or after 10000-01-01T00:00:00Z are no real time and break datetime arithmetic; with
# every duration in a record capped at 2^53 ms, stamp + duration still fits a long.
TS_MS_END = 253_402_300_800_000


def decode_envelope(data: bytes) -> t.Envelope:
    try:
        envelope = ENVELOPE.decode_exact(data)
    except Exception as exc:  # fastavro raises many types on hostile input
        raise RecordDecodeError(f"bad envelope: {exc!r}") from exc
    if not 0 <= envelope.ts_ms < TS_MS_END:
        raise RecordDecodeError(f"bad envelope: timestamp {envelope.ts_ms} ms is out of range")
    return envelope


def decode_body(envelope: t.Envelope) -> t.Record:
    kind, version = kind_of(envelope)
    codec = RECORDS.get(kind)
    if codec is None:
        raise RecordDecodeError(f"unknown record kind {envelope.kind!r}")
    if version > VERSION[kind]:
        raise NewerRecord(
            f"{envelope.kind}: written by a newer Conveyor (schema version {version}, this one "
            f"reads up to {VERSION[kind]}); run the newer version"
        )
    writer = HISTORY[kind][version - 1] if version < VERSION[kind] else None
    try:
        return cast(t.Record, codec.decode_exact(envelope.body, writer))
    except Exception as exc:
        raise RecordDecodeError(f"bad {envelope.kind} body: {exc!r}") from exc
