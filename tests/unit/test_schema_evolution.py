"""Log records and events batches written by an earlier version decode; a changed record or
events schema cannot slip in without its history (records/history/, events/history/,
schemas.lock.json)."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from conveyor.schemas import codec
from conveyor.schemas.types import (
    CompleteAttempts,
    Completion,
    Envelope,
    EventBatch,
    EventKind,
    Outcome,
    TaskEvent,
    TaskSpec,
)

RECORDS = Path(codec.SCHEMA_DIR) / "records"
LOCK = RECORDS / "history" / "schemas.lock.json"


def _canonical(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _canonical(v) for k, v in sorted(node.items()) if k != "doc"}
    if isinstance(node, list):
        return [_canonical(v) for v in node]
    return node


def fingerprint(kind: str) -> str:
    doc = _canonical(json.loads((RECORDS / f"{kind}.avsc").read_text()))
    return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()[:16]


def events_fingerprint() -> str:
    pair = [codec.self_contained(s) for s in (codec.EVENT_BATCH.schema, codec.EVENT_EXTRAS.schema)]
    return hashlib.sha256(json.dumps(_canonical(pair), sort_keys=True).encode()).hexdigest()[:16]


def test_every_record_schema_matches_its_lock() -> None:
    """A failure here means a record schema changed. Copy its last released form to
    records/history/<Kind>.v<N>.avsc (N = the next free number) so that records already in
    logs stay readable, then put the new fingerprint in schemas.lock.json.

    TaskSpec (nested in records and state rows, so unversioned itself) the same way: its
    history is records/history/TaskSpec.v<N>.avsc, and fields are only ever added at the end.
    For "events" (EventBatch, EventExtras and the types they use): write the last released
    pair, self-contained (``codec.self_contained(codec.EVENT_BATCH.schema)`` and the same for
    ``codec.EVENT_EXTRAS.schema``, from the released code), as events/history/v<N>/
    EventBatch.avsc and EventExtras.avsc; new fields need defaults."""
    lock = json.loads(LOCK.read_text())
    now = {kind: f"v{codec.VERSION[kind]}:{fingerprint(kind)}" for kind in codec.RECORDS}
    now["events"] = f"v{codec.EVENT_BATCH.version}:{events_fingerprint()}"
    now["TaskSpec"] = f"v{len(codec.TASK_SPEC.history) + 1}:{fingerprint('TaskSpec')}"
    assert now == lock


def test_a_record_written_before_its_schema_changed_still_decodes() -> None:
    old = parse_schema(
        json.loads((RECORDS / "history" / "CompleteAttempts.v1.avsc").read_text()),
        named_schemas={},
    )
    item = {
        "task_id": "0" * 32,
        "lease_id": 3,
        "outcome": "SUCCEEDED",
        "result": b'"done"',
        "error_class": None,
        "error_message": None,
        "error_stack": None,
        "retry_after_ms": None,
        "sleep": None,
    }
    buf = io.BytesIO()
    schemaless_writer(buf, old, {"items": [item]})
    envelope = Envelope(kind="CompleteAttempts", epoch=1, ts_ms=1, key="k", body=buf.getvalue())
    record = codec.decode_body(envelope)
    assert isinstance(record, CompleteAttempts)
    (done,) = record.items
    assert (done.task_id, done.lease_id, done.outcome, done.result) == (
        "0" * 32,
        3,
        Outcome.SUCCEEDED,
        b'"done"',
    )
    assert done.fan_out is None and done.wait is None  # added since: their defaults


def test_records_are_written_under_their_current_version() -> None:
    record = CompleteAttempts(
        items=[Completion(task_id="0" * 32, lease_id=1, outcome=Outcome.SUCCEEDED)]
    )
    data = codec.encode_record(record, epoch=1, ts_ms=1, key="k")
    envelope = codec.decode_envelope(data)
    assert envelope.kind == f"CompleteAttempts.v{codec.VERSION['CompleteAttempts']}"
    assert codec.decode_body(envelope) == record


def test_a_record_from_a_newer_version_is_refused_by_name_not_quarantined() -> None:
    envelope = Envelope(kind="CompleteAttempts.v99", epoch=1, ts_ms=1, key="k", body=b"")
    with pytest.raises(codec.NewerRecord, match="written by a newer Conveyor"):
        codec.decode_body(envelope)
    assert not issubclass(codec.NewerRecord, codec.RecordDecodeError)  # halts, never skipped


def _batch() -> EventBatch:
    event = TaskEvent(
        kind=EventKind.TaskEnqueued,
        task_id="0" * 32,
        tenant="t",
        app="a",
        task_type="noop",
        queue="default",
        status="ENQUEUED",
        attempt=0,
        ts_ms=5,
        version=9,
    )
    return EventBatch(partition=3, offset=9, events=[event])


def _version_1() -> codec.EventBatchCodec:
    """A writer of version 1 batches, from its schemas in events/history/v1/."""
    batch, _ = codec.EVENT_BATCH.history[0]
    return codec.EventBatchCodec(batch, codec.EVENT_EXTRAS, [])


def test_an_events_batch_written_before_batches_carried_a_version_decodes() -> None:
    data = codec.EVENT_BATCH.encode(_batch())
    assert data[0] == codec.EVENTS_MARK and data[1] == codec.EVENT_BATCH.version
    old = _version_1().encode(_batch())
    assert old[:2] == bytes([codec.EVENTS_MARK, 1])
    assert codec.EVENT_BATCH.decode(old[2:]) == _batch()  # no mark: version 1


def test_a_version_1_batch_reads_run_at_as_null_for_every_event() -> None:
    """Version 2 added the ``run_at_ms`` column (a delayed TaskEnqueued says when it is
    due); a version 1 batch has none, and each of its events reads it as null."""
    events = [dataclasses.replace(_batch().events[0], task_id=f"{i:032d}") for i in range(3)]
    batch = EventBatch(partition=3, offset=9, events=events)
    decoded = codec.EVENT_BATCH.decode(_version_1().encode(batch))
    assert decoded == batch and [e.run_at_ms for e in decoded.events] == [None] * 3
    delayed = dataclasses.replace(events[0], run_at_ms=1_000)
    now = EventBatch(partition=3, offset=9, events=[delayed, events[1]])
    assert codec.EVENT_BATCH.decode(codec.EVENT_BATCH.encode(now)) == now


def test_a_version_2_batch_reads_payload_fields_as_null_for_every_event() -> None:
    """Version 3 added the ``payload_fields`` column (a TaskEnqueued carries the payload's
    searchable fields to the snapshot); a version 2 batch has none: null for each event,
    its other columns as written."""
    batch_v2, _ = codec.EVENT_BATCH.history[1]
    writer = codec.EventBatchCodec(batch_v2, codec.EVENT_EXTRAS, codec.EVENT_BATCH.history[:1])
    delayed = dataclasses.replace(_batch().events[0], run_at_ms=1_000)
    events = [delayed, dataclasses.replace(delayed, task_id="1" * 32, run_at_ms=None)]
    batch = EventBatch(partition=3, offset=9, events=events)
    data = writer.encode(batch)
    assert data[:2] == bytes([codec.EVENTS_MARK, 2])
    decoded = codec.EVENT_BATCH.decode(data)
    assert decoded == batch and [e.payload_fields for e in decoded.events] == [None, None]
    searchable = dataclasses.replace(events[0], payload_fields='{"customer":"acme"}')
    now = EventBatch(partition=3, offset=9, events=[searchable, events[1]])
    assert codec.EVENT_BATCH.decode(codec.EVENT_BATCH.encode(now)) == now


def test_a_task_spec_written_before_payload_fields_decodes_without_them() -> None:
    """TaskSpec v5 added ``payload_fields`` at the end: a v4 datum (in logs, the specs
    table and schedule templates) ends before it and reads it as null."""
    v4 = parse_schema(
        json.loads((RECORDS / "history" / "TaskSpec.v4.avsc").read_text()), named_schemas={}
    )
    spec = TaskSpec(task_id="0" * 32, tenant="t", app="a", task_type="noop", payload=b"{}")
    datum = {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec)}
    del datum["payload_fields"]
    buf = io.BytesIO()
    schemaless_writer(buf, v4, datum)
    assert codec.TASK_SPEC.decode(buf.getvalue()) == spec
    kept = dataclasses.replace(spec, payload_fields='{"n":3}')
    assert codec.TASK_SPEC.decode(codec.TASK_SPEC.encode(kept)) == kept


def test_an_events_batch_of_a_former_version_is_resolved_to_the_current_schema() -> None:
    # A release that adds a column with a default: today's pair becomes the newest former one.
    released = [
        codec.self_contained(s) for s in (codec.EVENT_BATCH.schema, codec.EVENT_EXTRAS.schema)
    ]
    grown = codec.self_contained(codec.EVENT_BATCH.schema)
    grown["fields"].append({"name": "note", "type": "string", "default": ""})
    v1 = tuple(parse_schema(s, named_schemas={}) for s in released)
    history = [*codec.EVENT_BATCH.history, v1]
    later = codec.EventBatchCodec(
        parse_schema(grown, named_schemas={}), codec.EVENT_EXTRAS, history
    )
    assert later.version == codec.EVENT_BATCH.version + 1
    written = codec.EVENT_BATCH.encode(_batch())  # by today's code
    assert later.decode(written) == _batch()
    assert later.decode(later.encode(_batch())) == _batch()


def test_an_events_batch_of_a_newer_version_is_refused_by_name() -> None:
    data = bytes([codec.EVENTS_MARK, codec.EVENT_BATCH.version + 1]) + b"\x00"
    with pytest.raises(codec.NewerEvents, match="written by a newer Conveyor"):
        codec.EVENT_BATCH.decode(data)
    with pytest.raises(ValueError, match="version 0"):  # never read with the wrong schemas
        codec.EVENT_BATCH.decode(bytes([codec.EVENTS_MARK, 0]) + b"\x00")
