"""The app of the cluster routing tests (imported by the agent's guests as ``routing_app:app``).

``hold`` appends ``+ <monotonic s> <task id>`` when it starts and ``- <monotonic s> <task id>``
when it ends to the file its payload names, so the test counts how many ran at once.
CLOCK_MONOTONIC is one clock for every process of the host.
"""

from __future__ import annotations

import time
from typing import Any

import conveyor

app = conveyor.App("routing")


def _mark(path: str, sign: str, task_id: str) -> None:
    with open(path, "a") as fh:
        fh.write(f"{sign} {time.monotonic():.6f} {task_id}\n")


@app.task
def hold(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    _mark(payload["log"], "+", ctx.task_id)
    time.sleep(payload["ms"] / 1000)
    _mark(payload["log"], "-", ctx.task_id)
    return {"key": payload["key"]}
