"""The app the chaos agents run: ``conveyor_devtools.chaos.app:app``.

``work`` appends one line per execution to the file named in its payload, so the checker can
count executions per task (at-least-once: a kill between the handler and the completion makes a
second execution). Guests get an environment without ``CONVEYOR_*`` variables, which is why the
path travels in the payload rather than in the environment. One short ``O_APPEND`` write is
atomic on Linux, so lines from concurrent guests never interleave.

A line is ``task_id attempt guest_pid``, written after an optional ``sleep_ms`` (the zombie run
of ``zombie.py`` needs handlers that are still busy when their agent is paused, and needs to
tell which guest wrote a line). Readers that only count executions use the first field.

``fan_in`` and ``child`` are W1's (``fanin.py``): a workflow fans out to ``n`` children, some
of which fail, and returns what its one parallel step gave it, so the checker can compare that
with the answer it computes itself (``expected``).
"""

from __future__ import annotations

import hashlib
import json
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
    _journal(str(payload["log"]), ctx)
    return int(ctx.attempt)


@app.task
def child(ctx: conveyor.Context, payload: Any) -> int:
    _journal(str(payload["log"]), ctx)
    if payload["fail"]:
        raise conveyor.FatalError(f"child {payload['i']} fails by design")
    return int(payload["i"]) * 3


@app.workflow
def fan_in(ctx: conveyor.Context, payload: Any) -> dict[str, Any]:
    failing = set(payload["fail"])
    children = [
        (child, {"log": payload["log"], "wf": payload["wf"], "i": i, "fail": i in failing})
        for i in range(payload["n"])
    ]
    results = ctx.parallel("children", children)
    seen = [f"error:{r.status}" if isinstance(r, conveyor.ChildError) else r for r in results]
    return summary(seen)


def expected(n: int, failing: list[int]) -> dict[str, Any]:
    """What ``fan_in`` must return for these children, computed without the platform."""
    bad = set(failing)
    return summary(["error:FAILED" if i in bad else i * 3 for i in range(n)])


def summary(seen: list[Any]) -> dict[str, Any]:
    digest = hashlib.sha256(json.dumps(seen).encode()).hexdigest()[:16]
    return {"n": len(seen), "errors": sum(isinstance(v, str) for v in seen), "digest": digest}


def _journal(path: str, ctx: conveyor.Context) -> None:
    line = f"{ctx.task_id} {ctx.attempt} {os.getpid()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
