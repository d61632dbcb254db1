"""The app ``conveyor bench cancel`` runs in real guests:
``conveyor_devtools.bench.cancel_app:app``.

``spin`` is a cooperative handler: it loops until ``ctx.cancelled`` and returns the wall clock
(ms) when it started and when it saw the cancel, so the bench measures cancel request -> handler
saw it as the user sees it (client and guests share the machine's clock).
"""

from __future__ import annotations

import time
from typing import Any

import conveyor

app = conveyor.App("bench-cancel")

SPIN_S_MAX = 120.0  # a spin nobody cancels ends by itself
LOOK_EVERY_S = 0.001


@app.task(cancel_grace="30s", timeout="5m")
def spin(ctx: conveyor.Context, payload: Any) -> dict[str, float]:
    started_ms = time.time() * 1000
    deadline = time.monotonic() + SPIN_S_MAX
    while not ctx.cancelled and time.monotonic() < deadline:
        time.sleep(LOOK_EVERY_S)
    return {"started_ms": started_ms, "saw_ms": time.time() * 1000}


@app.task
def noop(ctx: conveyor.Context, payload: Any) -> None:
    """The warm-up's: the agent registered and its guests are up."""
    return None
