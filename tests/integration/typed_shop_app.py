"""An app whose handler takes a dataclass payload: its agent registers the payload's Avro
schema and the type's options at start (``test_schema_registry.py``)."""

from __future__ import annotations

import dataclasses

import conveyor

app = conveyor.App("typed-shop")


@dataclasses.dataclass
class Line:
    sku: str
    qty: int = 1


@dataclasses.dataclass
class Order:
    order_id: str
    lines: list[Line]
    note: str | None = None


@app.task(queue="orders", priority=4, retry=conveyor.Retry(attempts=7))
def place(ctx: conveyor.Context, order: Order) -> dict[str, int]:
    return {"lines": len(order.lines)}
