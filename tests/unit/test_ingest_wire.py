"""Confluent's wire format and an ingest datum as a payload's plain JSON
(``streams/ingest/wire.py``), and the task events topic's name for a tenant."""

from __future__ import annotations

import json

import pytest

from conveyor.streams.ingest import wire
from conveyor.streams.sinks import task_events

ORDER = json.dumps(
    {
        "type": "record",
        "name": "Order",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
            {"name": "blob", "type": "bytes"},
            {"name": "note", "type": ["null", "string"], "default": None},
            {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["A", "B"]}},
        ],
    }
)
ORDER_V2 = json.dumps(
    {
        **json.loads(ORDER),
        "fields": [*json.loads(ORDER)["fields"], {"name": "qty", "type": "int", "default": 1}],
    }
)
DATUM = {"id": "o1", "at": 1_700_000_000_123, "blob": b"\x00\xff", "note": None, "kind": "B"}


def test_a_datum_reads_as_the_json_a_client_would_send() -> None:
    value = wire.frame(7, wire.encode(ORDER, DATUM))
    assert wire.schema_id_of(value) == 7
    assert wire.decode(value, ORDER, ORDER) == {
        "id": "o1",
        "at": 1_700_000_000_123,  # the long under the logical type, not a datetime
        "blob": "\x00\xff",  # bytes as code points 0-255, Avro's JSON encoding
        "note": None,  # a union is its value
        "kind": "B",
    }


def test_a_datum_of_an_older_version_is_resolved_to_the_reader() -> None:
    value = wire.frame(7, wire.encode(ORDER, DATUM))
    assert wire.decode(value, ORDER, ORDER_V2)["qty"] == 1


@pytest.mark.parametrize(
    ("value", "fault"),
    [
        (None, "tombstone"),
        (b"\x00\x00", "shorter than"),
        (b"\x01\x00\x00\x00\x07abc", "magic byte 1"),
    ],
)
def test_a_value_not_in_the_wire_format_is_refused_by_name(value: bytes | None, fault: str) -> None:
    with pytest.raises(wire.WireError, match=fault):
        wire.schema_id_of(value)


def test_a_truncated_or_overlong_datum_is_refused() -> None:
    value = wire.frame(7, wire.encode(ORDER, DATUM))
    with pytest.raises(wire.WireError, match="truncated"):
        wire.decode(value[:-3], ORDER, ORDER)
    with pytest.raises(wire.WireError, match="1 bytes follow"):
        wire.decode(value + b"\x00", ORDER, ORDER)


def test_a_nan_is_refused_for_json_cannot_carry_it() -> None:
    schema = json.dumps(
        {"type": "record", "name": "M", "fields": [{"name": "x", "type": "double"}]}
    )
    value = wire.frame(1, wire.encode(schema, {"x": float("nan")}))
    with pytest.raises(wire.WireError, match="JSON cannot carry"):
        wire.decode(value, schema, schema)


def test_each_tenant_has_a_topic_of_its_own() -> None:
    names = ["acme", "a:b", "a_3ab", "a.b-c", "ünï", "a b"]
    topics = [task_events.topic_of("prod", n) for n in names]
    assert topics[:2] == ["prod-task-events.acme", "prod-task-events.a_3ab"]
    assert topics[3] == "prod-task-events.a.b-c"
    assert len(set(topics)) == len(names)  # "a_3ab" is not "a:b": "_" is escaped too
    assert all(
        set(t) <= set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        for t in topics
    )


def test_the_faust_module_names_the_topics_as_the_node_does() -> None:
    import conveyor.faust as faust_module  # make test installs faust: never skipped

    for name in ["acme", "a:b", "ünï", "a b"]:
        assert faust_module.topic_of("prod", name) == task_events.topic_of("prod", name)
