"""Log records written by an earlier version decode; a changed record schema cannot slip in
without its history (records/history/, schemas.lock.json)."""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer

from conveyor.schemas import codec
from conveyor.schemas.types import CompleteAttempts, Completion, Envelope, Outcome

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


def test_every_record_schema_matches_its_lock() -> None:
    """A failure here means a record schema changed. Copy its last released form to
    records/history/<Kind>.v<N>.avsc (N = the next free number) so that records already in
    logs stay readable, then put the new fingerprint in schemas.lock.json."""
    lock = json.loads(LOCK.read_text())
    now = {kind: f"v{codec.VERSION[kind]}:{fingerprint(kind)}" for kind in codec.RECORDS}
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
