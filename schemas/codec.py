"""Avro <-> dataclasses. The only module that imports fastavro.

Every schema under records/, state/ and events/ is parsed once at import. A log record is an
``Envelope`` whose ``body`` is the Avro encoding of the record named by ``kind``; encoding the
body separately lets a reader route on ``kind`` without decoding the body, and keeps each body
schema independent (adding a record kind never changes the envelope).
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Any, Generic, TypeVar, cast

from fastavro import parse_schema, schemaless_reader, schemaless_writer

from conveyor.schemas import types as t

SCHEMA_DIR = Path(__file__).parent
T = TypeVar("T")

_named: dict[str, Any] = {}


def _load(relpath: str) -> Any:
    with open(SCHEMA_DIR / relpath) as fh:
        return parse_schema(json.load(fh), named_schemas=_named)


# Nested dataclass fields and enum fields per class: what a plain dict must be turned into.
_NESTED: dict[type, dict[str, type]] = {
    t.GrantLeases: {"requests": t.LeaseRequest},
    t.CompleteAttempts: {"items": t.Completion},
    t.SaveCheckpoints: {"items": t.Checkpoint},
    t.RecordSteps: {"items": t.StepWrite},
    t.ExpireLeases: {"items": t.LeaseRef},
    t.FireTimers: {"timers": t.TimerRef},
}
# Optional nested records (a union of null and a record) per class.
_OPTIONAL: dict[type, dict[str, type]] = {
    t.Completion: {"sleep": t.SleepStep, "fan_out": t.FanOut},
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

    def encode(self, obj: T) -> bytes:
        buf = io.BytesIO()
        schemaless_writer(buf, self.schema, self._to_dict(obj))
        return buf.getvalue()

    def decode(self, data: bytes) -> T:
        datum = cast(dict[str, Any], schemaless_reader(io.BytesIO(data), self.schema, None))
        return cast(T, self._from_dict(datum))


def _read(data: bytes, schema: Any) -> dict[str, Any]:
    return cast(dict[str, Any], schemaless_reader(io.BytesIO(data), schema, None))


class TaskCodec:
    """The in-memory ``Task`` stored as three rows, so a transition re-encodes only the small
    ``TaskState``: ``TaskHead`` is written once and ``TaskDetail`` only when it changes."""

    def __init__(self) -> None:
        self.head = [f["name"] for f in TASK_HEAD["fields"]]
        self.state = [f["name"] for f in TASK_STATE["fields"]]
        self.detail = [f["name"] for f in TASK_DETAIL["fields"]]

    @staticmethod
    def _write(schema: Any, names: list[str], task: t.Task) -> bytes:
        buf = io.BytesIO()
        schemaless_writer(buf, schema, {name: getattr(task, name) for name in names})
        return buf.getvalue()

    def encode_head(self, task: t.Task) -> bytes:
        return self._write(TASK_HEAD, self.head, task)

    def encode_state(self, task: t.Task) -> bytes:
        return self._write(TASK_STATE, self.state, task)

    def detail_of(self, task: t.Task) -> tuple[Any, ...]:
        return tuple(getattr(task, name) for name in self.detail)

    def encode_detail(self, task: t.Task) -> bytes:
        return self._write(TASK_DETAIL, self.detail, task)

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


class EventBatchCodec:
    """``EventBatch`` <-> its columnar Avro form (see events/EventBatch.avsc)."""

    def __init__(self, schema: Any) -> None:
        self.schema = schema
        self.columns = [f.name for f in dataclasses.fields(t.TaskEvent)]

    def encode(self, batch: t.EventBatch) -> bytes:
        datum: dict[str, Any] = {"partition": batch.partition, "offset": batch.offset}
        events = batch.events
        for name in self.columns:
            datum[name] = [getattr(e, name) for e in events]
        buf = io.BytesIO()
        schemaless_writer(buf, self.schema, datum)
        return buf.getvalue()

    def decode(self, data: bytes) -> t.EventBatch:
        datum = _read(data, self.schema)
        datum["kind"] = [t.EventKind(kind) for kind in datum["kind"]]
        names = self.columns
        rows = zip(*(datum[name] for name in names), strict=True)
        events = [t.TaskEvent(**dict(zip(names, row, strict=True))) for row in rows]
        return t.EventBatch(partition=datum["partition"], offset=datum["offset"], events=events)


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


def _make_from_dict(cls: type) -> Callable[[dict[str, Any]], Any]:
    nested = {name: _make_from_dict(sub) for name, sub in _NESTED.get(cls, {}).items()}
    optional = {name: _make_from_dict(sub) for name, sub in _OPTIONAL.get(cls, {}).items()}
    enums = _ENUMS.get(cls, {})
    if not nested and not enums and not optional:
        return lambda d: cls(**d)

    def from_dict(d: dict[str, Any]) -> Any:
        for name, conv in nested.items():
            d[name] = [conv(item) for item in d[name]]
        for name, conv in optional.items():
            if d[name] is not None:
                d[name] = conv(d[name])
        for name, enum in enums.items():
            d[name] = enum(d[name])
        return cls(**d)

    return from_dict


ENVELOPE = Codec(t.Envelope, _load("records/Envelope.avsc"))
TASK_SPEC = Codec(t.TaskSpec, _load("records/TaskSpec.avsc"))
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
CHILD_RESULT = Codec(t.ChildResult, _load("state/ChildResult.avsc"))
TASK_EVENT = Codec(t.TaskEvent, _load("events/TaskEvent.avsc"))
EVENT_BATCH = EventBatchCodec(_load("events/EventBatch.avsc"))


class RecordDecodeError(Exception):
    """A log record that is not a valid envelope or body; the processor quarantines it."""


def encode_record(record: t.Record, *, epoch: int, ts_ms: int, key: str) -> bytes:
    kind = type(record).__name__
    body = RECORDS[kind].encode(record)
    return ENVELOPE.encode(t.Envelope(kind=kind, epoch=epoch, ts_ms=ts_ms, key=key, body=body))


def decode_envelope(data: bytes) -> t.Envelope:
    try:
        return ENVELOPE.decode(data)
    except Exception as exc:  # fastavro raises many types on hostile input
        raise RecordDecodeError(f"bad envelope: {exc!r}") from exc


def decode_body(envelope: t.Envelope) -> t.Record:
    codec = RECORDS.get(envelope.kind)
    if codec is None:
        raise RecordDecodeError(f"unknown record kind {envelope.kind!r}")
    try:
        return cast(t.Record, codec.decode(envelope.body))
    except Exception as exc:
        raise RecordDecodeError(f"bad {envelope.kind} body: {exc!r}") from exc
