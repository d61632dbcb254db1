"""The codec: dataclasses match their Avro schemas, every record round-trips, and hostile bytes
raise ``RecordDecodeError`` and nothing else (tests/PLAN.md: hostile Avro, huge lengths)."""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import inspect
import io
import itertools
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
from fastavro import parse_schema, schemaless_writer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conveyor.schemas import codec
from conveyor.schemas import types as t

SCHEMAS = Path(codec.__file__).parent
I32 = st.integers(-(2**31), 2**31 - 1)
I64 = st.integers(-(2**63), 2**63 - 1)
TEXT = st.text(max_size=12)
BLOB = st.binary(max_size=24)


# -- the schemas and the dataclasses agree -----------------------------------------------------


def _collect(node: Any, records: dict[str, dict[str, Any]], enums: dict[str, list[str]]) -> None:
    if isinstance(node, list):
        for item in node:
            _collect(item, records, enums)
    elif isinstance(node, dict):
        if node.get("type") == "record":
            records[node["name"]] = node
            for f in node["fields"]:
                _collect(f["type"], records, enums)
        elif node.get("type") == "enum":
            enums[node["name"]] = node["symbols"]
        elif node.get("type") == "array":
            _collect(node["items"], records, enums)


def _schemas() -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    records: dict[str, dict[str, Any]] = {}
    enums: dict[str, list[str]] = {}
    for path in sorted(SCHEMAS.rglob("*.avsc")):
        if path.parent.name != "history":  # former schemas: their names are the old shapes
            _collect(json.loads(path.read_text()), records, enums)
    return records, enums


RECORD_SCHEMAS, ENUM_SCHEMAS = _schemas()
DATACLASSES = [
    cls
    for _, cls in inspect.getmembers(t, inspect.isclass)
    if dataclasses.is_dataclass(cls) and cls.__module__ == t.__name__
]
ENUMS = [
    cls
    for _, cls in inspect.getmembers(t, inspect.isclass)
    if issubclass(cls, enum.Enum) and cls.__module__ == t.__name__
]
TASK_PARTS = ("TaskHead", "TaskState", "TaskDetail")


def _nullable(avro_type: Any) -> bool:
    return isinstance(avro_type, list) and "null" in avro_type


def test_every_schema_file_is_a_record_named_after_its_file() -> None:
    for path in sorted(SCHEMAS.rglob("*.avsc")):
        doc = json.loads(path.read_text())
        name = path.stem.partition(".v")[0]  # records/history/<Kind>.v<N>.avsc
        # events/history/v<N>/ holds self-contained schemas: their names are fully qualified
        assert doc["type"] == "record" and doc["name"].rpartition(".")[2] == name, path


@pytest.mark.parametrize(
    "cls",
    [c for c in DATACLASSES if c not in (t.Task, t.EventBatch)],
    ids=lambda c: c.__name__,
)
def test_dataclass_matches_its_avsc(cls: type) -> None:
    assert cls.__name__ in RECORD_SCHEMAS, f"no .avsc defines {cls.__name__}"
    schema = RECORD_SCHEMAS[cls.__name__]
    fields = dataclasses.fields(cls)
    assert [f.name for f in fields] == [f["name"] for f in schema["fields"]]
    for f, avro in zip(fields, schema["fields"], strict=True):
        optional = "None" in str(f.type)
        assert optional == _nullable(avro["type"]), f"{cls.__name__}.{f.name}: nullability"
        if "default" in avro and f.default is not dataclasses.MISSING:
            assert f.default == avro["default"], f"{cls.__name__}.{f.name}: default"


def test_event_batch_stores_one_column_per_event_field() -> None:
    schema = RECORD_SCHEMAS["EventBatch"]
    columns = [f["name"] for f in schema["fields"]][2:]
    assert [f["name"] for f in schema["fields"]][:2] == ["partition", "offset"]
    assert columns == [f.name for f in dataclasses.fields(t.TaskEvent)]
    event_types = {f["name"]: f["type"] for f in RECORD_SCHEMAS["TaskEvent"]["fields"]}
    for f in schema["fields"][2:]:
        items = f["type"]["items"]
        expected = event_types[f["name"]]
        if isinstance(expected, dict):  # a named enum, referenced by name in the batch
            expected = f"conveyor.{expected['name']}"
        assert items == expected, f["name"]


def test_task_is_the_union_of_head_state_and_detail() -> None:
    parts = [[f["name"] for f in RECORD_SCHEMAS[name]["fields"]] for name in TASK_PARTS]
    stored = [name for part in parts for name in part]
    assert len(stored) == len(set(stored)), "a Task field is stored in two rows"
    task_fields = [f.name for f in dataclasses.fields(t.Task) if f.name != "detail_written"]
    assert sorted(stored) == sorted(task_fields)
    by_name = {f.name: f for f in dataclasses.fields(t.Task)}
    for name in TASK_PARTS:
        for avro in RECORD_SCHEMAS[name]["fields"]:
            assert ("None" in str(by_name[avro["name"]].type)) == _nullable(avro["type"]), avro


@pytest.mark.parametrize(
    "cls", [c for c in ENUMS if c is not t.CancelCause], ids=lambda c: c.__name__
)
def test_enums_match_their_avsc(cls: type[enum.Enum]) -> None:
    assert ENUM_SCHEMAS[cls.__name__] == [m.value for m in cls]


def test_cancel_cause_is_stored_as_a_plain_string() -> None:
    (field,) = [f for f in RECORD_SCHEMAS["TaskState"]["fields"] if f["name"] == "cancel_cause"]
    assert field["type"] == ["null", "string"]
    assert "CancelCause" not in ENUM_SCHEMAS


def test_every_record_kind_has_a_codec() -> None:
    kinds = {c.__name__ for c in t.Record.__args__}  # type: ignore[attr-defined]
    assert set(codec.RECORDS) == kinds


# -- round trips --------------------------------------------------------------------------------

ids = st.text(alphabet="0123456789abcdef", min_size=1, max_size=32)
specs = st.builds(
    t.TaskSpec,
    task_id=ids,
    tenant=TEXT,
    app=TEXT,
    task_type=TEXT,
    queue=TEXT,
    priority=I32,
    payload=BLOB,
    run_at_ms=st.none() | I64,
    attempts_max=I32,
    backoff_base_ms=I64,
    backoff_factor=st.floats(allow_nan=False),
    backoff_cap_ms=I64,
    non_retryable=st.lists(TEXT, max_size=3),
    schedule_to_start_ms=st.none() | I64,
    start_to_close_ms=st.none() | I64,
    schedule_to_close_ms=st.none() | I64,
    cancel_grace_ms=I64,
    idempotency_key=st.none() | TEXT,
    idempotency_window_ms=I64,
)
opt_text = st.none() | TEXT
RECORDS: dict[type, st.SearchStrategy[Any]] = {
    t.EnqueueTasks: st.builds(
        t.EnqueueTasks, tasks=st.lists(specs.map(codec.TASK_SPEC.encode), max_size=3)
    ),
    t.CancelTasks: st.builds(t.CancelTasks, tenant=TEXT, task_ids=st.lists(ids), reason=TEXT),
    t.RetryFailed: st.builds(t.RetryFailed, tenant=TEXT, task_ids=st.lists(ids)),
    t.GrantLeases: st.builds(
        t.GrantLeases,
        requests=st.lists(
            st.builds(
                t.LeaseRequest,
                request_id=TEXT,
                agent_id=TEXT,
                app=TEXT,
                tenants=st.lists(TEXT, max_size=3),
                queues=st.lists(TEXT, max_size=3),
                capacity=I32,
                lease_ms=I64,
            ),
            max_size=3,
        ),
    ),
    t.CompleteAttempts: st.builds(
        t.CompleteAttempts,
        items=st.lists(
            st.builds(
                t.Completion,
                task_id=ids,
                lease_id=I64,
                outcome=st.sampled_from(t.Outcome),
                result=st.none() | BLOB,
                error_class=opt_text,
                error_message=opt_text,
                error_stack=opt_text,
                retry_after_ms=st.none() | I64,
                sleep=st.none()
                | st.builds(
                    t.SleepStep,
                    identity=TEXT,
                    position=I32,
                    sleep_ms=st.none() | I64,
                    wake_at_ms=st.none() | I64,
                ),
                fan_out=st.none()
                | st.builds(
                    t.FanOut,
                    identity=TEXT,
                    position=I32,
                    mode=st.sampled_from(t.ParallelMode),
                    children=st.lists(BLOB, max_size=3),
                ),
                wait=st.none()
                | st.builds(
                    t.WaitStep,
                    identity=TEXT,
                    position=I32,
                    name=TEXT,
                    timeout_ms=st.none() | I64,
                ),
            ),
            max_size=3,
        ),
    ),
    t.RecordSteps: st.builds(
        t.RecordSteps,
        items=st.lists(
            st.builds(
                t.StepWrite,
                task_id=ids,
                lease_id=I64,
                op=st.sampled_from(t.StepOp),
                identity=TEXT,
                position=I32,
                value=st.none() | BLOB,
            ),
            max_size=3,
        ),
    ),
    t.SaveCheckpoints: st.builds(
        t.SaveCheckpoints,
        items=st.lists(st.builds(t.Checkpoint, task_id=ids, lease_id=I64, value=BLOB), max_size=3),
    ),
    t.ExpireLeases: st.builds(
        t.ExpireLeases,
        items=st.lists(st.builds(t.LeaseRef, task_id=ids, lease_id=I64), max_size=3),
    ),
    t.FireTimers: st.builds(
        t.FireTimers,
        timers=st.lists(
            st.builds(
                t.TimerRef,
                fire_at_ms=I64,
                task_id=ids,
                kind=st.sampled_from(t.TimerKind),
                token=I64,
            ),
            max_size=3,
        ),
    ),
    t.AnnounceEpoch: st.builds(t.AnnounceEpoch, leader_id=TEXT),
    t.UpsertSchedule: st.builds(
        t.UpsertSchedule,
        tenant=TEXT,
        schedule_id=TEXT,
        cron=TEXT,
        timezone=TEXT,
        template=BLOB,
        overlap=st.sampled_from(t.OverlapPolicy),
        catch_up=st.sampled_from(t.CatchUp),
    ),
    t.DeleteSchedule: st.builds(t.DeleteSchedule, tenant=TEXT, schedule_id=TEXT),
    t.PauseSchedule: st.builds(
        t.PauseSchedule, tenant=TEXT, schedule_id=TEXT, paused=st.booleans()
    ),
    t.PauseQueue: st.builds(t.PauseQueue, tenant=TEXT, queue=TEXT, paused=st.booleans()),
    t.SendEvents: st.builds(
        t.SendEvents,
        tenant=TEXT,
        items=st.lists(
            st.builds(t.WorkflowEvent, task_id=ids, name=TEXT, payload=BLOB), max_size=3
        ),
    ),
    t.EnqueueChildren: st.builds(
        t.EnqueueChildren,
        parent_id=ids,
        identity=TEXT,
        indexes=st.lists(I32, max_size=3),
        tasks=st.lists(BLOB, max_size=3),
    ),
    t.LandChildren: st.builds(
        t.LandChildren,
        items=st.lists(
            st.builds(
                t.ChildDone,
                child_id=ids,
                parent_id=ids,
                identity=TEXT,
                index=I32,
                status=TEXT,
                result=st.none() | BLOB,
                error_class=st.none() | TEXT,
                error_message=st.none() | TEXT,
            ),
            max_size=3,
        ),
    ),
    t.RegisterTypes: st.builds(
        t.RegisterTypes,
        tenant=TEXT,
        app=TEXT,
        version=opt_text,
        deploy=st.none() | I64,
        pinned=st.none() | st.lists(TEXT, max_size=3),
        types=st.lists(
            st.builds(
                t.TypeDefinition,
                task_type=TEXT,
                queue=opt_text,
                priority=st.none() | I32,
                non_retryable=st.none() | st.lists(TEXT, max_size=2),
                backoff_factor=st.none() | st.floats(allow_nan=False),
                start_to_close_ms=st.none() | I64,
                payload_schema_id=st.none() | I32,
            ),
            max_size=3,
        ),
    ),
    t.RegisterSchema: st.builds(
        t.RegisterSchema, tenant=TEXT, subject=TEXT, schema=TEXT, expect_latest=I32
    ),
    t.DeleteSchemas: st.builds(
        t.DeleteSchemas,
        tenant=TEXT,
        subject=TEXT,
        version=st.none() | I32,
        permanent=st.booleans(),
    ),
    t.SetCompatibility: st.builds(
        t.SetCompatibility, tenant=TEXT, subject=opt_text, level=opt_text
    ),
}
records = st.one_of(*RECORDS.values())


def test_every_record_type_has_a_strategy() -> None:
    assert set(RECORDS) == set(t.Record.__args__)  # type: ignore[attr-defined]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(record=records, epoch=I64, ts_ms=st.integers(0, codec.TS_MS_END - 1), key=TEXT)
def test_records_round_trip(record: t.Record, epoch: int, ts_ms: int, key: str) -> None:
    raw = codec.encode_record(record, epoch=epoch, ts_ms=ts_ms, key=key)
    envelope = codec.decode_envelope(raw)
    assert (envelope.kind, envelope.epoch, envelope.ts_ms, envelope.key) == (
        codec.wire_kind(type(record).__name__),
        epoch,
        ts_ms,
        key,
    )
    decoded = codec.decode_body(envelope)
    assert decoded == record
    assert type(decoded) is type(record)
    for name in ("outcome", "kind"):  # enums come back as enums, not bare strings
        for item in getattr(decoded, "items", []) + getattr(decoded, "timers", []):
            if hasattr(item, name):
                assert isinstance(getattr(item, name), enum.Enum)


@given(record=records, ts_ms=st.sampled_from([-(2**63), -1, codec.TS_MS_END, 2**63 - 1]))
def test_records_stamped_outside_real_time_or_with_trailing_bytes_do_not_decode(
    record: t.Record, ts_ms: int
) -> None:
    with pytest.raises(codec.RecordDecodeError, match="timestamp"):
        codec.decode_envelope(codec.encode_record(record, epoch=0, ts_ms=ts_ms, key="k"))
    raw = codec.encode_record(record, epoch=0, ts_ms=0, key="k")
    with pytest.raises(codec.RecordDecodeError, match="bytes after"):
        codec.decode_envelope(raw + b"\x00")


def _fastavro_bytes(c: codec.Codec[Any], obj: Any) -> bytes:
    buf = io.BytesIO()
    schemaless_writer(buf, c.schema, c._to_dict(obj))
    return buf.getvalue()


def test_the_hot_codecs_use_the_made_writer() -> None:
    """A schema change that makes one of these fall back to fastavro costs engine CPU."""
    hot = [codec.ENVELOPE, codec.TASK_SPEC, codec.ATTEMPT, codec.EVENT_EXTRAS]
    hot += [codec.RECORDS[k] for k in ("EnqueueTasks", "GrantLeases", "CompleteAttempts")]
    assert all(c._write is not None for c in hot)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(record=records, epoch=I64, ts_ms=I64, key=TEXT)
def test_made_writers_write_what_fastavro_writes(
    record: t.Record, epoch: int, ts_ms: int, key: str
) -> None:
    c = codec.RECORDS[type(record).__name__]
    body = c.encode(record)
    assert body == _fastavro_bytes(c, record)
    envelope = t.Envelope(kind="k", epoch=epoch, ts_ms=ts_ms, key=key, body=body)
    assert codec.ENVELOPE.encode(envelope) == _fastavro_bytes(codec.ENVELOPE, envelope)


@settings(max_examples=100)
@given(spec=specs)
def test_task_specs_are_written_as_fastavro_writes_them(spec: t.TaskSpec) -> None:
    assert codec.TASK_SPEC.encode(spec) == _fastavro_bytes(codec.TASK_SPEC, spec)


@settings(max_examples=100)
@given(spec=specs)
def test_task_spec_round_trips(spec: t.TaskSpec) -> None:
    assert codec.TASK_SPEC.decode(codec.TASK_SPEC.encode(spec)) == spec


tasks = st.builds(
    t.Task,
    task_id=ids,
    tenant=TEXT,
    app=TEXT,
    task_type=TEXT,
    queue=TEXT,
    priority=I32,
    status=st.sampled_from(t.TaskStatus),
    attempt=I32,
    budget_base=I32,
    lease_id=I64,
    created_ms=I64,
    run_at_ms=I64,
    updated_ms=I64,
    ready_seq=I64,
    version=I64,
    cancel_grace_ms=I64,
    start_to_close_ms=st.none() | I64,
    start_by_ms=st.none() | I64,
    close_by_ms=st.none() | I64,
    grace_until_ms=st.none() | I64,
    agent_id=opt_text,
    leased_ms=st.none() | I64,
    cancel_cause=st.none() | st.sampled_from([c.value for c in t.CancelCause]),
    cancel_reason=opt_text,
    checkpoint=st.none() | BLOB,
    result=st.none() | BLOB,
    error_class=opt_text,
    error_message=opt_text,
    error_stack=opt_text,
    finished_ms=st.none() | I64,
)


@settings(max_examples=150)
@given(task=tasks)
def test_task_round_trips_through_its_three_rows(task: t.Task) -> None:
    c = codec.TASK
    detail = c.encode_detail(task) if any(v is not None for v in c.detail_of(task)) else None
    back = c.decode(c.encode_head(task), c.encode_state(task), detail)
    assert back == task  # detail_written does not take part in ==
    assert back.detail_written == c.detail_of(task)


@settings(max_examples=150)
@given(
    task=tasks,
    run_key=opt_text,
    app_version=opt_text,
    compensable=st.booleans(),
    compensating=st.booleans(),
)
def test_task_rows_are_written_as_fastavro_writes_them(
    task: t.Task,
    run_key: str | None,
    app_version: str | None,
    compensable: bool,
    compensating: bool,
) -> None:
    """The hand-made row writers (``flat_writer``) give fastavro's bytes, byte for byte."""
    task = dataclasses.replace(
        task,
        run_key=run_key,
        app_version=app_version,
        compensable=compensable,
        compensating=compensating,
    )
    c = codec.TASK
    for schema, names, written in (
        (codec.TASK_HEAD, c.head, c.encode_head(task)),
        (codec.TASK_STATE, c.state, c.encode_state(task)),
        (codec.TASK_DETAIL, c.detail, c.encode_detail(task)),
    ):
        buf = io.BytesIO()
        schemaless_writer(buf, schema, {name: getattr(task, name) for name in names})
        assert written == buf.getvalue()


def test_the_flat_writer_refuses_a_long_out_of_range() -> None:
    task = t.Task(
        task_id="t1",
        tenant="acme",
        app="app",
        task_type="noop",
        queue="default",
        priority=0,
        status=t.TaskStatus.ENQUEUED,
        attempt=0,
        budget_base=0,
        lease_id=0,
        created_ms=0,
        run_at_ms=0,
        updated_ms=0,
        ready_seq=0,
        version=2**63,
        cancel_grace_ms=0,
    )
    with pytest.raises(OverflowError, match="does not fit an Avro long"):
        codec.TASK.encode_state(task)


@given(numbers=st.lists(I64, min_size=1, max_size=50))
def test_longs_written_from_the_table_of_known_ones_are_fastavros(numbers: list[int]) -> None:
    schema = parse_schema({"type": "array", "items": "long"})
    for _ in range(2):  # the second time, every large number comes from the table
        buf = io.BytesIO()
        schemaless_writer(buf, schema, numbers)
        assert (
            b"".join([codec._write_long(len(numbers)), *map(codec._write_long, numbers)])
            + (b"\x00")
            == buf.getvalue()
        )


@given(texts=st.lists(st.text(max_size=80), min_size=1, max_size=20))
def test_strings_written_from_the_table_of_known_ones_are_fastavros(texts: list[str]) -> None:
    for _ in range(2):  # the second time, every short string comes from the table
        for text in texts:
            buf = io.BytesIO()
            schemaless_writer(buf, parse_schema("string"), text)
            assert codec._write_string(text) == buf.getvalue()
    assert all(len(text) <= codec._KNOWN_TEXT_LEN_MAX for text in codec._KNOWN_TEXT)


def test_the_table_of_known_strings_is_bounded() -> None:
    for n in range(3 * codec._KNOWN_MAX):
        codec._write_string(f"tenant-{n}")
        assert len(codec._KNOWN_TEXT) <= codec._KNOWN_MAX


def test_the_table_of_known_longs_is_bounded() -> None:
    for n in range(2**40, 2**40 + 3 * codec._KNOWN_MAX):
        codec._write_long(n)
        assert len(codec._KNOWN) <= codec._KNOWN_MAX
    assert codec._write_long(2**40) == codec._zigzag_varint(2**40)


@settings(max_examples=100)
@given(
    events=st.lists(
        st.builds(
            t.TaskEvent,
            kind=st.sampled_from(t.EventKind),
            task_id=ids,
            tenant=TEXT,
            app=TEXT,
            task_type=TEXT,
            queue=TEXT,
            status=st.sampled_from([s.value for s in t.TaskStatus]),
            attempt=I32,
            ts_ms=I64,
            version=I64,
            agent_id=opt_text,
            error_class=opt_text,
            error_message=opt_text,
        ),
        max_size=4,
    ),
    partition=I32,
    offset=I64,
)
def test_event_batches_round_trip(events: list[t.TaskEvent], partition: int, offset: int) -> None:
    batch = t.EventBatch(partition=partition, offset=offset, events=events)
    data = codec.EVENT_BATCH.encode(batch)
    assert codec.EVENT_BATCH.decode(data) == batch
    datum: dict[str, Any] = {"partition": partition, "offset": offset}
    for name in codec.EVENT_BATCH.columns:
        datum[name] = [getattr(e, name) for e in events]
    buf = io.BytesIO()
    schemaless_writer(buf, codec.EVENT_BATCH.schema, datum)
    assert data == bytes([codec.EVENTS_MARK, codec.EVENT_BATCH.version]) + buf.getvalue()


def test_an_event_batch_whose_columns_differ_in_length_is_refused() -> None:
    event = t.TaskEvent(
        kind=t.EventKind.TaskEnqueued, task_id="t" * 32, tenant="a", app="x", task_type="y",
        queue="default", status="ENQUEUED", attempt=1, ts_ms=1, version=0,
    )  # fmt: skip
    datum: dict[str, Any] = {"partition": 0, "offset": 0}
    for name in codec.EVENT_BATCH.columns:
        datum[name] = [getattr(event, name)] * 2
    datum["attempt"] = [1]  # one value short
    buf = io.BytesIO()
    schemaless_writer(buf, codec.EVENT_BATCH.schema, datum)
    with pytest.raises(ValueError, match="differ in length"):
        codec.EVENT_BATCH.decode(
            bytes([codec.EVENTS_MARK, codec.EVENT_BATCH.version]) + buf.getvalue()
        )


def test_step_and_schedule_events_ride_in_a_trailer_only_when_there_are_some() -> None:
    plain = t.EventBatch(partition=1, offset=9, events=[])
    bare = codec.EVENT_BATCH.encode(plain)
    step = t.StepEvent(
        task_id="x", tenant="a", identity="charge#0", position=0, state="COMMITTED", claims=2,
        value=b'"ch_1"', wake_at_ms=None, ts_ms=5, version=9,
    )  # fmt: skip
    schedule = t.ScheduleEvent(
        tenant="a", schedule_id="s", cron="* * * * *", timezone="UTC", app="shop",
        task_type="x", queue="q", overlap="SKIP", catch_up="NONE", paused=True, deleted=False,
        next_fire_ms=None, fired=3, skipped=1, created_ms=1, updated_ms=5, version=9,
    )  # fmt: skip
    full = dataclasses.replace(plain, steps=[step], schedules=[schedule])
    encoded = codec.EVENT_BATCH.encode(full)
    assert encoded.startswith(bare)  # the columns first, unchanged: old readers' layout
    extras = t.EventExtras(steps=[step], schedules=[schedule])
    assert encoded[len(bare) :] == _fastavro_bytes(codec.EVENT_EXTRAS, extras)
    assert codec.EVENT_BATCH.decode(encoded) == full
    assert codec.EVENT_BATCH.decode(bare) == plain  # a batch written before the trailer


def test_a_kept_event_batch_is_handed_to_the_next_decode_of_its_bytes_once() -> None:
    event = t.TaskEvent(
        kind=t.EventKind.TaskLeased, task_id="k" * 32, tenant="a", app="x", task_type="y",
        queue="default", status="LEASED", attempt=1, ts_ms=7, version=3, agent_id="agent-1",
    )  # fmt: skip
    batch = t.EventBatch(partition=2, offset=3, events=[event])
    data = codec.EVENT_BATCH.encode(batch, keep=True)
    read_back = bytes(bytearray(data))  # as the events log returns it: equal, not the same
    assert codec.EVENT_BATCH.decode(read_back) is batch
    again = codec.EVENT_BATCH.decode(read_back)  # a second delivery is decoded
    assert again == batch and again is not batch
    assert codec.EVENT_BATCH.encode(batch) == data  # keeping changes no byte


def test_kept_event_batches_are_bounded() -> None:
    codec.EVENT_BATCH.KEEP_EVENTS, saved = 4, codec.EVENT_BATCH.KEEP_EVENTS
    try:
        event = t.TaskEvent(
            kind=t.EventKind.TaskEnqueued, task_id="e" * 32, tenant="a", app="x", task_type="y",
            queue="default", status="ENQUEUED", attempt=1, ts_ms=1, version=1,
        )  # fmt: skip
        events = [event] * 3
        first = t.EventBatch(partition=0, offset=1, events=events)
        second = t.EventBatch(partition=0, offset=2, events=events)
        first_data = codec.EVENT_BATCH.encode(first, keep=True)
        codec.EVENT_BATCH.encode(second, keep=True)  # 6 kept: the next keep starts afresh
        third_data = codec.EVENT_BATCH.encode(dataclasses.replace(first, offset=3), keep=True)
        assert codec.EVENT_BATCH.decode(first_data) is not first  # dropped at the bound
        assert codec.EVENT_BATCH.decode(third_data).offset == 3
    finally:
        codec.EVENT_BATCH.KEEP_EVENTS = saved


def test_state_rows_round_trip() -> None:
    attempt = t.Attempt(
        task_id="x",
        attempt=2,
        lease_id=3,
        agent_id="a",
        started_ms=1,
        finished_ms=2,
        outcome="FAILED",
        error_class="E",
        error_message=None,
        error_stack="tb",
    )
    assert codec.ATTEMPT.decode(codec.ATTEMPT.encode(attempt)) == attempt
    entry = t.IdempotencyEntry(task_id="x", expires_ms=2**62)
    assert codec.IDEMPOTENCY.decode(codec.IDEMPOTENCY.encode(entry)) == entry
    schedule = t.Schedule(
        tenant="a",
        schedule_id="s",
        cron="* * * * *",
        timezone="UTC",
        template=b"\x00",
        overlap="SKIP",
        catch_up="ONCE",
        generation=2,
        created_ms=1,
        updated_ms=2,
        next_fire_ms=3,
        last_task_id="x",
        fired=4,
    )
    assert codec.SCHEDULE.decode(codec.SCHEDULE.encode(schedule)) == schedule


# -- hostile input ------------------------------------------------------------------------------

ALLOCATION_MAX = 4 << 20  # bytes: decoding a small hostile input must not allocate more


def _decode(data: bytes) -> t.Record:
    """decode_envelope + decode_body, with a bound on what decoding may allocate."""
    tracemalloc.start()
    try:
        return codec.decode_body(codec.decode_envelope(data))
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        assert peak < ALLOCATION_MAX + 4 * len(data), f"decoding allocated {peak} bytes"


def _refused_or_decoded(data: bytes) -> None:
    """Hostile input may happen to decode; anything but a refusal fails the test. A refusal is
    RecordDecodeError (quarantined), or NewerRecord when a flipped bit turned a version suffix
    into a newer one ("GrantLeases.v2" -> ".v6": the partition halts, by design)."""
    with contextlib.suppress(codec.RecordDecodeError, codec.NewerRecord):
        _decode(data)


def _varint(n: int) -> bytes:
    """Avro's zig-zag varint of a long."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while True:
        low, z = z & 0x7F, z >> 7
        out.append(low | (0x80 if z else 0))
        if not z:
            return bytes(out)


def _string(s: str | bytes) -> bytes:
    raw = s.encode() if isinstance(s, str) else s
    return _varint(len(raw)) + raw


def _envelope(kind: str, body: bytes, *, epoch: int = 0, ts_ms: int = 0, key: str = "") -> bytes:
    return _string(kind) + _varint(epoch) + _varint(ts_ms) + _string(key) + _string(body)


def test_the_hand_made_envelope_is_the_codec_s() -> None:
    record = t.AnnounceEpoch(leader_id="n1")
    raw = codec.encode_record(record, epoch=4, ts_ms=9, key="k")
    assert raw == _envelope("AnnounceEpoch", _string("n1"), epoch=4, ts_ms=9, key="k")


@settings(max_examples=500)
@given(data=st.binary(max_size=256))
def test_random_bytes_are_refused_or_decoded(data: bytes) -> None:
    _refused_or_decoded(data)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(record=records, cut=st.integers(min_value=0), flip=st.integers(min_value=0))
def test_truncated_and_bit_flipped_records_raise_record_decode_error(
    record: t.Record, cut: int, flip: int
) -> None:
    raw = codec.encode_record(record, epoch=1, ts_ms=2, key="k")
    truncated = raw[: cut % len(raw)]
    with pytest.raises(codec.RecordDecodeError):
        _decode(truncated)
    flipped = bytearray(raw)
    flipped[flip % len(raw)] ^= 1 << (flip % 8)
    _refused_or_decoded(bytes(flipped))  # may decode into something else; must not blow up


@pytest.mark.parametrize("length", [2**31, 2**62, 2**63 - 1, -1, -(2**62)])
def test_huge_or_negative_length_prefixes_are_refused(length: int) -> None:
    cases = [
        _varint(length) + b"Cancel",  # the envelope's kind string
        _string("CancelTasks") + _varint(0) + _varint(0) + _string("") + _varint(length),  # body
        _envelope("CancelTasks", _string("t") + _varint(length)),  # task_ids array count
        _envelope("CancelTasks", _string("t") + _varint(1) + _varint(length)),  # one task id
        _envelope("EnqueueTasks", _varint(length) + _varint(2**40)),  # tasks array + a bytes
    ]
    for data in cases:
        with pytest.raises(codec.RecordDecodeError):
            _decode(data)


@settings(max_examples=300)
@given(
    kind=st.sampled_from(sorted(codec.RECORDS)),
    body=st.binary(max_size=64)
    | st.lists(st.integers(-(2**63), 2**63 - 1).map(_varint), max_size=8).map(b"".join),
)
def test_hostile_bodies_are_refused_or_decoded(kind: str, body: bytes) -> None:
    _refused_or_decoded(_envelope(kind, body))


def test_unknown_kind_is_refused() -> None:
    with pytest.raises(codec.RecordDecodeError, match="unknown record kind"):
        _decode(_envelope("DropTables", b""))
    with pytest.raises(codec.RecordDecodeError):
        _decode(_envelope("Envelope", b""))  # a schema, but not a record kind


def test_bad_enum_index_and_bad_utf8_are_refused() -> None:
    timer = _varint(0) + _string("x") + _varint(99) + _varint(0)  # TimerKind #99
    with pytest.raises(codec.RecordDecodeError):
        _decode(_envelope("FireTimers", _varint(1) + timer + _varint(0)))
    with pytest.raises(codec.RecordDecodeError):
        _decode(_envelope("AnnounceEpoch", _string(b"\xff\xfe")))
    with pytest.raises(codec.RecordDecodeError):
        _decode(_string(b"\xc3\x28") + b"\x00" * 8)  # kind is not UTF-8


# Where the writer changes its path (small, 14-bit chunks) and where a varint grows a byte.
BOUNDARIES = [0, 1, -1, 0x1FFF, 0x2000, -0x2000, -0x2001, 2**63 - 1, -(2**63)]
BOUNDARIES += [s * 2 ** (7 * k) + d for k in range(9) for d in (-1, 0) for s in (1, -1)]
BOUNDARIES += [s * 2 ** (b - 1) + d for b in (28, 42) for d in (-1, 0) for s in (1, -1)]


@given(n=I64 | st.sampled_from(BOUNDARIES))
def test_longs_are_written_as_zigzag_varints(n: int) -> None:
    assert codec._write_long(n) == _varint(n)


def test_a_field_name_that_is_no_identifier_is_never_put_in_code() -> None:
    with pytest.raises(codec.NotFlat):
        codec.flat_writer(
            {"type": "record", "name": "R", "fields": [{"name": "x); os.exit(1", "type": "long"}]}
        )


def test_made_writers_give_fastavros_bytes_at_every_encoding_boundary() -> None:
    schema = parse_schema(
        {
            "type": "record",
            "name": "Edges",
            "fields": [
                {"name": "n", "type": "long"},
                {"name": "s", "type": "string"},
                {"name": "b", "type": "bytes"},
                {"name": "o", "type": ["null", "long"]},
                {"name": "flag", "type": "boolean"},
                {"name": "d", "type": "double"},
                {"name": "e", "type": {"type": "enum", "name": "E", "symbols": ["A", "B"]}},
                {"name": "xs", "type": {"type": "array", "items": ["null", "string"]}},
                {
                    "name": "r",
                    "type": [
                        "null",
                        {"type": "record", "name": "In", "fields": [{"name": "k", "type": "int"}]},
                    ],
                },
            ],
        }
    )
    write = codec.tuple_writer(schema)
    longs = [0, 1, -1, 0x1FFF, 0x2000, -0x2000, 2**41, 2**63 - 1, -(2**63)]
    sizes = [0, 1, 0x1FFF, 0x2000, 0x10000]
    for n, size in itertools.zip_longest(longs, sizes, fillvalue=7):
        datum = {
            "n": n,
            "s": "é" * size,
            "b": b"\x00" * size,
            "o": None if size % 2 else n,
            "flag": bool(size % 2),
            "d": n / 3,
            "e": "B",
            "xs": [] if size == 0 else ["x" * size, None],
            "r": None if size == 1 else {"k": size},
        }
        buf = io.BytesIO()
        schemaless_writer(buf, schema, datum)
        assert write(tuple(datum.values())) == buf.getvalue(), (n, size)
