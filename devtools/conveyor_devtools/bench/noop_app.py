"""The app ``conveyor bench e2e`` runs in real guests: ``conveyor_devtools.bench.noop_app:app``.

- ``noop`` does nothing: what is left is the platform's own cost per task.
- ``stamp`` returns the wall clock at the moment the handler starts, so the bench can measure
  schedule-to-start as the user sees it (client and guests share the machine's clock).
- ``pause`` sleeps: the warm-up uses it to make the agent spawn every guest before measuring.
"""

from __future__ import annotations

import time
from typing import Any

import conveyor

app = conveyor.App("bench")


@app.task
def noop(ctx: conveyor.Context, payload: Any) -> None:
    return None


@app.task
def stamp(ctx: conveyor.Context, payload: Any) -> float:
    return time.time()


@app.task
def pause(ctx: conveyor.Context, payload: Any) -> None:
    time.sleep(float(payload or 0) / 1000)
