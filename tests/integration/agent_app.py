"""The app the agent tests run in real guest processes (imported there as ``agent_app:app``).

Handlers talk back to the test through files named in their payloads: the test and the guest
share nothing else.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import conveyor

app = conveyor.App("agent-tests")
FAST = conveyor.Retry(attempts=5, base="50ms", cap="200ms")


def mark(payload: dict[str, Any], text: str) -> None:
    with open(payload["marker"], "a") as fh:
        fh.write(text + "\n")


@app.task
def echo(ctx: conveyor.Context, payload: Any) -> Any:
    print(f"echo of {payload!r} in attempt {ctx.attempt}")
    return {"payload": payload, "pid": os.getpid(), "key": os.environ.get("CONVEYOR_API_KEY")}


@app.task(retry=FAST)
def die_once(ctx: conveyor.Context, payload: dict[str, Any]) -> str:
    if ctx.attempt == 1:
        mark(payload, f"pid {os.getpid()}")
        ctx.wait_cancelled(timeout=60)  # the test kills this process meanwhile
        return "not killed"
    return f"survived in attempt {ctx.attempt}"


@app.task(retry=conveyor.Retry(attempts=50, base="50ms", cap="100ms"))
def crash(ctx: conveyor.Context, payload: Any) -> None:
    os.kill(os.getpid(), 9)


@app.task
def wait_cancel(ctx: conveyor.Context, payload: dict[str, Any]) -> str:
    mark(payload, "started")
    if ctx.wait_cancelled(timeout=60):
        mark(payload, "saw cancel")
        return "stopped"
    return "never canceled"


@app.task
def poll_cancel(ctx: conveyor.Context, payload: dict[str, Any]) -> str:
    """Looks at ``ctx.cancelled`` between naps (no ``wait_cancelled``): a guest has no reader
    thread, so reading the flag is what takes the cancel off the socket."""
    mark(payload, "started")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if ctx.cancelled:
            mark(payload, "saw cancel")
            return "stopped"
        time.sleep(0.01)
    return "never canceled"


@app.task(timeout="1s", cancel_grace="500ms", retry=conveyor.Retry(attempts=1))
def stubborn(ctx: conveyor.Context, payload: dict[str, Any]) -> None:
    mark(payload, f"pid {os.getpid()}")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # ignores ctx.cancelled on purpose
        time.sleep(0.05)


@app.task(retry=conveyor.Retry(attempts=1))
def hog(ctx: conveyor.Context, payload: dict[str, Any]) -> int:
    blocks = [bytearray(64 * 2**20) for _ in range(int(payload["mb"]) // 64)]
    Path(payload["marker"]).write_text("allocated")
    return len(blocks)


@app.task
def gate(ctx: conveyor.Context, payload: dict[str, Any]) -> None:
    """Wait until the test creates the file ``payload["open"]``."""
    while not os.path.exists(payload["open"]):
        time.sleep(0.005)


@app.task
def refuse(ctx: conveyor.Context, payload: Any) -> None:
    raise conveyor.FatalError(f"refusing {payload!r}")


@app.task(retry=conveyor.Retry(attempts=1))
def spin(ctx: conveyor.Context, payload: Any) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # burns CPU until RLIMIT_CPU stops it
        pass


@app.task(retry=FAST)
def step_then_die(ctx: conveyor.Context, payload: dict[str, Any]) -> str:
    done = ctx.step.run("once", lambda: mark(payload, f"ran in step attempt {ctx.step.attempt}"))
    if ctx.attempt == 1:
        mark(payload, f"pid {os.getpid()}")
        ctx.wait_cancelled(timeout=60)  # the test kills this process meanwhile
    return f"memo {done!r} in attempt {ctx.attempt}"


@app.task(retry=FAST)
async def async_step_then_die(ctx: conveyor.Context, payload: dict[str, Any]) -> str:
    """``step_then_die`` with an async handler and an async step body (steps rule 7)."""

    async def once() -> str:
        await asyncio.sleep(0.01)
        mark(payload, f"ran in step attempt {ctx.step.attempt}")
        return "ran"

    done = await ctx.step.run("once", once)
    if ctx.attempt == 1:
        mark(payload, f"pid {os.getpid()}")
        await asyncio.to_thread(ctx.wait_cancelled, timeout=60)  # killed meanwhile
    return f"memo {done!r} in attempt {ctx.attempt}"


@app.task
def mark_then_step(ctx: conveyor.Context, payload: dict[str, Any]) -> str:
    """Marks that it started, then records a durable step: it waits for the agent's ack."""
    mark(payload, "started")
    return ctx.step.run("once", lambda: "stepped")


@app.task(retry=conveyor.Retry(attempts=500, base="10ms", cap="20ms"))
def many_steps(ctx: conveyor.Context, payload: dict[str, Any]) -> int:
    """``payload["steps"]`` durable steps. Each body marks ``start i pid`` before it returns;
    the task marks ``committed i`` once ``run`` returned (the commit is durable by then)."""
    total = 0
    for i in range(payload["steps"]):
        total += ctx.step.run(f"s{i}", lambda i=i: _started(payload, i))
        mark(payload, f"committed {i}")
    return total


def _started(payload: dict[str, Any], i: int) -> int:
    mark(payload, f"start {i} {os.getpid()}")
    return i


@dataclasses.dataclass
class Parcel:
    """A typed payload and result: dataclasses cross the wire (``conveyor.typed``)."""

    sku: str
    grams: int
    fragile: bool = False


@app.task
def weigh(parcel: Parcel) -> Parcel:
    return Parcel(parcel.sku, parcel.grams * 2, fragile=parcel.grams > 1000)


@app.task
def add(x: int, y: int) -> int:  # Celery-style arguments
    return x + y


_session: Any = None  # a module-level async client, kept across attempts (conveyor.loops)


@app.task
async def fetch_health(url: str) -> dict[str, Any]:
    """Uses one aiohttp session for every attempt this guest runs: it works only if every
    attempt runs on the same event loop."""
    import aiohttp

    global _session
    if _session is None:
        _session = aiohttp.ClientSession()
    async with _session.get(url) as reply:
        return {"status": reply.status, "pid": os.getpid(), "loop": id(asyncio.get_running_loop())}
