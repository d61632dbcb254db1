"""The app the chaos agents run: ``conveyor.streams.chaos.app:app``.

``work`` appends one line per execution to the file named in its payload, so the checker can
count executions per task (at-least-once: a kill between the handler and the completion makes a
second execution). Guests get an environment without ``CONVEYOR_*`` variables, which is why the
path travels in the payload rather than in the environment. One short ``O_APPEND`` write is
atomic on Linux, so lines from concurrent guests never interleave.

A line is ``task_id attempt guest_pid``, written after an optional ``sleep_ms`` (the zombie run
of ``zombie.py`` needs handlers that are still busy when their agent is paused, and needs to
tell which guest wrote a line). Readers that only count executions use the first field.
"""

from __future__ import annotations

import os
import time
from typing import Any

import conveyor

app = conveyor.App("chaos")


@app.task
def work(ctx: conveyor.Context, payload: Any) -> int:
    sleep_ms = payload.get("sleep_ms", 0)
    if sleep_ms:
        time.sleep(sleep_ms / 1000)
    line = f"{ctx.task_id} {ctx.attempt} {os.getpid()}\n".encode()
    fd = os.open(str(payload["log"]), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
    return int(ctx.attempt)
