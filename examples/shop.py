"""A small shop: the quickstart app.

    conveyor dev --app examples.shop:app      # a node, a gateway and an agent for this app
    python -m examples.shop                   # enqueue one of each task below

- ``charge_card`` fails twice, then succeeds: retries with backoff.
- ``send_receipt`` is enqueued with a delay: it runs a minute later.
- ``import_catalog`` always raises FatalError: it lands in FAILED at once, no retries.
- ``reindex`` is long: it checkpoints its cursor (a retry resumes there) and stops cleanly
  when canceled.
- ``fulfil_order`` is a workflow: a durable step charges once whatever fails later, a fan-out
  packs every item in parallel (one child task each) while the workflow holds no process, a
  durable sleep waits, and the receipt step runs last.
"""

from __future__ import annotations

import time
from typing import Any

import conveyor

app = conveyor.App("shop")


@app.task(retry=conveyor.Retry(attempts=5, base="200ms", cap="5s"))
def charge_card(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    # Key the side effect on the task id: a retried attempt must not charge twice.
    if ctx.attempt <= 2:
        raise conveyor.RetryableError(f"payment gateway timed out (attempt {ctx.attempt})")
    return {"charged": payload["amount"], "charge_key": ctx.task_id, "attempts": ctx.attempt}


@app.task(queue="email")
def send_receipt(payload: dict[str, Any]) -> dict[str, Any]:
    print(f"receipt for order {payload['order']} to {payload['email']}")
    return {"sent_to": payload["email"]}


@app.task
def import_catalog(ctx: conveyor.Context, payload: dict[str, Any]) -> None:
    raise conveyor.FatalError(f"catalog feed {payload.get('url')!r} is not valid CSV")


@app.task(timeout="1h", cancel_grace="10s")
def reindex(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    items = int(payload.get("items", 100))
    step_s = float(payload.get("step_s", 0.05))
    start = ctx.last_checkpoint or 0  # a retry resumes where the last attempt got to
    for i in range(start, items):
        if ctx.cancelled:
            ctx.logger.info("canceled at item %d", i)
            return {"stopped_at": i}
        time.sleep(step_s)
        if i % 10 == 0:
            ctx.checkpoint(i)
            ctx.heartbeat(progress={"done": i, "of": items})
    return {"indexed": items - start, "resumed_from": start}


@app.task(retry=conveyor.Retry(attempts=3, base="100ms"))
def pack_item(payload: dict[str, Any]) -> dict[str, Any]:
    return {"sku": payload["sku"], "box": f"box-{payload['sku'].lower()}"}


@app.workflow
def fulfil_order(ctx: conveyor.Context, order: dict[str, Any]) -> dict[str, Any]:
    # Side effects go inside steps: a retry or a resume returns the committed value instead.
    charge = ctx.step.run(
        "charge", lambda: {"amount": order["amount"], "key": ctx.step.idempotency_key}
    )
    boxes = ctx.parallel("pack", [(pack_item, {"sku": sku}) for sku in order["items"]])
    ctx.step.sleep("2s", name="wait_for_courier")
    receipt = ctx.step.run("receipt", lambda: f"order {order['order']}: {len(boxes)} boxes")
    return {"charge": charge, "boxes": boxes, "receipt": receipt}


def main() -> None:
    """Enqueue one of each. Talks to $CONVEYOR_URL (default http://127.0.0.1:7400) with
    $CONVEYOR_API_KEY, or with the key ``conveyor dev`` left in ./.conveyor."""
    with conveyor.Client() as client:
        handles = {
            "charge_card": client.enqueue(charge_card, {"order": 1, "amount": 1999}),
            "send_receipt": client.enqueue(
                send_receipt, {"order": 1, "email": "ada@example.com"}, delay="1m"
            ),
            "import_catalog": client.enqueue(import_catalog, {"url": "s3://feeds/catalog.csv"}),
            "reindex": client.enqueue(reindex, {"items": 200}),
            "fulfil_order": client.enqueue(
                fulfil_order, {"order": 2, "amount": 4200, "items": ["MUG", "TEE", "CAP"]}
            ),
        }
        for name, handle in handles.items():
            print(f"{name:15} {handle.id} {handle.status()}")


if __name__ == "__main__":
    main()
