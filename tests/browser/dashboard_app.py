"""The app ``conveyor dev`` runs for the dashboard tests (imported as ``dashboard_app:app``)."""

from __future__ import annotations

import time
from typing import Any

import conveyor

app = conveyor.App("dashboard-tests")


@app.task(retry=conveyor.Retry(attempts=2, base="50ms", cap="100ms"))
def explode(ctx: conveyor.Context, payload: dict[str, Any]) -> None:
    print(f"charging order {payload['order']} in attempt {ctx.attempt}")
    raise ValueError(f"card declined for order {payload['order']}")


@app.task
def double(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, int]:
    return {"twice": payload["n"] * 2}


@app.task
def nap(ctx: conveyor.Context, payload: dict[str, Any]) -> None:
    """Holds a slot for a while: the agents page shows it running."""
    time.sleep(payload["s"])


@app.workflow
def checkout(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    price = ctx.step.run("price", lambda: payload["n"] * 10)
    hold = f"{payload['hold_s']}s" if payload.get("hold_s") else None  # children wait that long
    children = [conveyor.Enqueue(double, {"n": i}, delay=hold) for i in range(3)]
    doubled = ctx.parallel("fan", children)
    return {"price": price, "doubled": doubled}


@app.workflow
def approval(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Waits for the event ``approved`` (sent from the workflow page or the CLI)."""
    order = ctx.step.run("prepare", lambda: payload["order"])
    decision = ctx.wait_for_event("approved", timeout="1h")
    return {"order": order, "decision": decision}
