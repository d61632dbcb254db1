"""Avro schemas derived from handler annotations (``conveyor.avro_schema``): what maps, what
is refused and why, and that what the SDK sends for such a payload fits the schema the node
checks it against."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, NotRequired, TypedDict

import pytest
from fastavro import parse_schema

from conveyor.app import App
from conveyor.avro_schema import AvroSchemaError, definitions, schema_of
from conveyor.streams.registry.payloads import mismatch


@dataclasses.dataclass
class Item:
    sku: str
    qty: int = 1


@dataclasses.dataclass
class Order:
    id: str
    items: list[Item]
    paid: bool
    total: float
    note: str | None = None
    tags: dict[str, float] = dataclasses.field(default_factory=dict)
    gift: Item | None = None


class Receipt(TypedDict):
    total: float
    memo: NotRequired[str]


def test_a_dataclass_maps_field_by_field() -> None:
    schema = schema_of(Order)
    parse_schema(schema)  # a valid Avro schema
    fields = {f["name"]: f for f in schema["fields"]}
    assert schema["name"] == "Order" and schema["namespace"] == __name__
    assert fields["id"]["type"] == "string" and "default" not in fields["id"]
    assert fields["paid"]["type"] == "boolean" and fields["total"]["type"] == "double"
    assert fields["items"]["type"]["type"] == "array"
    item = fields["items"]["type"]["items"]
    assert item["name"] == "Item" and item["fields"][1] == {
        "name": "qty",
        "type": "long",
        "default": 1,
    }
    assert fields["note"] == {"name": "note", "type": ["null", "string"], "default": None}
    assert fields["tags"] == {
        "name": "tags",
        "type": {"type": "map", "values": "double"},
        "default": {},
    }
    assert fields["gift"]["type"] == ["null", f"{__name__}.Item"]  # a named type, named again


def test_a_typeddict_not_required_key_is_optional() -> None:
    schema = schema_of(Receipt)
    parse_schema(schema)
    assert schema["fields"] == [
        {"name": "total", "type": "double"},
        {"name": "memo", "type": ["null", "string"], "default": None},
    ]


@dataclasses.dataclass
class Loop:
    next: Loop | None = None


@dataclasses.dataclass
class Mixed:
    value: int | str


@dataclasses.dataclass
class IntKeys:
    by_id: dict[int, str]


@dataclasses.dataclass
class Loose:
    anything: Any


@dataclasses.dataclass
class Pair:
    both: tuple[int, int]


@pytest.mark.parametrize(
    ("cls", "why"),
    [
        (Loop, "Loop.next: Loop contains itself"),
        (Mixed, "Mixed.value: a union of int, str"),
        (IntKeys, "IntKeys.by_id: dict keys must be str"),
        (Loose, "Loose.anything: Any has no Avro schema"),
        (Pair, "Pair.both: "),
    ],
)
def test_what_is_refused_names_the_field(cls: type, why: str) -> None:
    with pytest.raises(AvroSchemaError) as refused:
        schema_of(cls)
    assert str(refused.value).startswith(why), refused.value


def test_the_agents_definitions_carry_options_and_schemas() -> None:
    app = App("shop")

    @app.task(queue="payments", priority=3)
    def charge(ctx: Any, order: Order) -> Receipt:
        return {"total": order.total}

    @app.task
    def ping(ctx: Any, payload: dict[str, Any]) -> None:
        return None

    (one, two) = definitions(app)
    assert one["task_type"] == "charge" and one["queue"] == "payments" and one["priority"] == 3
    assert one["payload_schema"] == schema_of(Order)
    assert one["result_schema"] == schema_of(Receipt)
    assert two["task_type"] == "ping" and "payload_schema" not in two  # a plain dict: none
    order = Order(id="o", items=[Item(sku="s")], paid=False, total=2.5)
    sent = json.dumps(dataclasses.asdict(order)).encode()  # what the SDK sends
    assert mismatch(json.dumps(one["payload_schema"]), sent) is None
