"""Typed handlers (``conveyor.typed``): how a signature takes its payload, what a payload and
a result become on the wire, and what is refused at decoration time."""

from __future__ import annotations

import dataclasses
import enum
import uuid
from datetime import UTC, datetime
from typing import Any, TypedDict

import msgspec
import pydantic
import pytest

import conveyor
from conveyor.context import Context
from conveyor.typed import PayloadInvalid, ResultNotSerializable, encode
from conveyor.wire import Enqueue, enqueue_body


@dataclasses.dataclass
class Item:
    sku: str
    qty: int = 1


@dataclasses.dataclass
class Order:
    order_id: uuid.UUID
    items: list[Item]
    placed: datetime


class Receipt(pydantic.BaseModel):
    order_id: str
    total_cents: int


class Point(msgspec.Struct):
    x: float
    y: float


class Opaque:
    """Not something a JSON payload can become."""


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


class Label(TypedDict):
    text: str
    color: Color


app = conveyor.App("typed")


@app.task
def place(ctx: Context, order: Order) -> Receipt:
    return Receipt(order_id=str(order.order_id), total_cents=sum(i.qty for i in order.items))


@app.task
def add(x: int, y: int = 10) -> int:
    return x + y


@app.task
def tick(ctx: Any) -> str:
    return "ticked"


@app.task
async def distance(p: Point) -> float:
    return float((p.x**2 + p.y**2) ** 0.5)


@app.task
def paint(label: Label) -> Label:
    return label


@app.task
def bad_result() -> object:
    return object()


def _ctx() -> Context:
    class Channel:
        def heartbeat(self, progress: Any) -> None: ...

        def checkpoint(self, value: Any) -> None: ...

    return Context(task_id="t", task_type="x", attempt=1, checkpoint=None, channel=Channel())


def _wire(task: conveyor.TaskType[Any, Any], payload: Any) -> Any:
    """The payload as an enqueue sends it, read back as the JSON the agent receives."""
    body = enqueue_body(Enqueue(task, payload), None)
    return msgspec.json.decode(msgspec.json.encode(body["payload"]))


def test_a_dataclass_payload_crosses_the_wire_and_a_pydantic_result_comes_back() -> None:
    order = Order(uuid.uuid4(), [Item("A", 2), Item("B")], datetime(2026, 1, 2, tzinfo=UTC))
    sent = _wire(place, order)
    assert sent["order_id"] == str(order.order_id) and sent["items"][1] == {"sku": "B", "qty": 1}
    result = place.invoke(_ctx(), sent)
    assert result == {"order_id": str(order.order_id), "total_cents": 3}  # encoded for the wire
    decoded = place.decode_result(result)
    assert isinstance(decoded, Receipt) and decoded.total_cents == 3


def test_celery_style_arguments_by_position_or_by_name() -> None:
    assert not add.takes_context and add.binding.style == "arguments"
    assert add.invoke(_ctx(), _wire(add, (2, 3))) == 5
    assert add.invoke(_ctx(), {"x": 2}) == 12  # y takes its default
    assert add.invoke(_ctx(), ["4"]) == 14  # "4" converts to the annotated int
    with pytest.raises(PayloadInvalid, match="lacks argument 'x'"):
        add.invoke(_ctx(), {"y": 1})
    with pytest.raises(PayloadInvalid, match="no argument 'z'"):
        add.invoke(_ctx(), {"x": 1, "z": 2})
    with pytest.raises(PayloadInvalid, match="takes 2 arguments"):
        add.invoke(_ctx(), [1, 2, 3])
    with pytest.raises(PayloadInvalid, match="argument 'x' is invalid"):
        add.invoke(_ctx(), {"x": "not a number"})


def test_a_context_alone_takes_no_payload() -> None:
    assert tick.takes_context and tick.binding.style == "none"
    assert tick.invoke(_ctx(), {"ignored": True}) == "ticked"


def test_async_handlers_and_structs_and_typeddicts() -> None:
    import asyncio

    assert asyncio.run(distance.invoke(_ctx(), {"x": 3, "y": 4})) == 5.0
    assert distance.decode_result(5.0) == 5.0
    assert paint.invoke(_ctx(), {"text": "hi", "color": "red"}) == {"text": "hi", "color": "red"}
    with pytest.raises(PayloadInvalid, match=r"\$\.color"):  # the field path
        paint.invoke(_ctx(), {"text": "hi", "color": "green"})


def test_a_payload_that_does_not_fit_is_fatal_not_retried() -> None:
    with pytest.raises(PayloadInvalid) as caught:
        place.invoke(_ctx(), {"order_id": "x", "items": [], "placed": "2026-01-01T00:00:00Z"})
    assert isinstance(caught.value, conveyor.FatalError) and "$.order_id" in str(caught.value)
    with pytest.raises(ResultNotSerializable):
        bad_result.invoke(_ctx(), None)


def test_signatures_that_cannot_be_bound_are_refused_at_decoration() -> None:
    local = conveyor.App("refused")
    with pytest.raises(conveyor.ContractError, match="cannot become"):

        @local.task
        def takes_opaque(ctx: Context, thing: Opaque) -> None: ...

    with pytest.raises(conveyor.ContractError, match="keyword-only"):

        @local.task
        def keyword(ctx: Context, *, mode: str) -> None: ...


def test_encode_leaves_plain_json_alone_and_refuses_what_is_not() -> None:
    plain = {"a": [1, 2.5, "x", None, True]}
    assert encode(plain) == plain
    assert encode(Color.BLUE) == "blue"
    with pytest.raises(conveyor.ContractError, match="not a JSON value"):
        encode({1: object()})
