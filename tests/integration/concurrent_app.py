"""Async handlers with ``concurrency``, run by the agent tests in real guests (imported there as
``concurrent_app:app``). Handlers talk back to the test through files named in their payloads."""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any

import conveyor

app = conveyor.App("concurrent-tests")
ONCE = conveyor.Retry(attempts=1)
FAST = conveyor.Retry(attempts=3, base="50ms", cap="100ms")


def mark(payload: dict[str, Any], text: str) -> None:
    with open(payload["marker"], "a") as fh:
        fh.write(text + "\n")


@app.task(concurrency=8)
async def nap(ctx: conveyor.Context, seconds: float) -> dict[str, Any]:
    """I/O-bound: eight of these share one guest's event loop."""
    await asyncio.sleep(seconds)
    return {"pid": os.getpid(), "loop": id(asyncio.get_running_loop())}


@app.task
def sync_nap(ctx: conveyor.Context, seconds: float) -> dict[str, Any]:
    time.sleep(seconds)
    return {"pid": os.getpid()}


@app.task(concurrency=4, retry=ONCE)
async def until_cancelled(ctx: conveyor.Context, payload: dict[str, Any]) -> str:
    """Runs until its own cancel (or the release file), looking at ``ctx.cancelled``."""
    mark(payload, f"started {os.getpid()}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists(payload["release"]):
        if ctx.cancelled:
            mark(payload, "saw cancel")
            return "stopped"
        await asyncio.sleep(0.01)
    mark(payload, "released")
    return "released"


@app.task(concurrency=4, timeout="1s", cancel_grace="300ms", retry=ONCE)
async def stubborn(ctx: conveyor.Context, payload: dict[str, Any]) -> None:
    """Ignores its cancel, but awaits: the agent's abort cancels the coroutine there."""
    mark(payload, f"started {os.getpid()}")
    try:
        await asyncio.sleep(60)
    except asyncio.CancelledError:
        mark(payload, "aborted")
        raise


@app.task(concurrency=4, timeout="1s", cancel_grace="300ms", retry=ONCE)
async def hog_loop(ctx: conveyor.Context, payload: dict[str, Any]) -> None:
    """Holds the event loop (a blocking call in a coroutine): an abort cannot reach it."""
    mark(payload, f"started {os.getpid()}")
    time.sleep(60)


@app.task(concurrency=4, retry=FAST)
async def patient(ctx: conveyor.Context, payload: dict[str, Any]) -> int:
    """Waits for the release file; attempt by attempt."""
    mark(payload, f"attempt {ctx.attempt} {os.getpid()}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists(payload["release"]):
        await asyncio.sleep(0.01)
    return ctx.attempt


@app.task(concurrency=4, retry=ONCE)
async def stepper(ctx: conveyor.Context, payload: dict[str, Any]) -> list[str]:
    """Durable steps from coroutines running side by side: each commit is acked to its own."""
    done = []
    for i in range(payload["steps"]):

        async def body(i: int = i) -> str:
            await asyncio.sleep(0.01)
            return f"{payload['name']}-{i}"

        done.append(await ctx.step.run(f"s{i}", body))
    return done


@app.task(concurrency=4, retry=ONCE)
async def checkpointer(ctx: conveyor.Context, payload: dict[str, Any]) -> str:
    """Checkpoints and heartbeats its own name, then waits for the release file."""
    ctx.heartbeat({"name": payload["name"]})
    ctx.checkpoint({"name": payload["name"]})
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not os.path.exists(payload["release"]):
        await asyncio.sleep(0.01)
    return payload["name"]
