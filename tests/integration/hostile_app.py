"""A hostile app: each handler tries one way out of its guest and reports what it got.

Handlers return what they saw (never raise on a failed escape), so a test reads the outcome of
every probe from the task's result, from inside a real guest.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import conveyor

app = conveyor.App("hostile")
ONCE = conveyor.Retry(attempts=1)


def attempt(probe: Any, *args: Any) -> dict[str, Any]:
    try:
        return {"ok": True, "value": probe(*args)}
    except (OSError, MemoryError) as exc:
        return {"ok": False, "error": f"{type(exc).__name__}: {exc}"}


@app.task
def whoami(ctx: conveyor.Context, payload: Any) -> dict[str, Any]:
    return {"uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(), "env": dict(os.environ)}


@app.task
def read_file(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    return attempt(lambda: Path(payload["path"]).read_bytes().decode(errors="replace"))


@app.task
def read_memory(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    """16 bytes from the first readable mapping of process ``pid``."""

    def peek() -> str:
        maps = Path(f"/proc/{payload['pid']}/maps").read_text().splitlines()
        start = next(int(m.split("-")[0], 16) for m in maps if m.split()[1].startswith("r"))
        with open(f"/proc/{payload['pid']}/mem", "rb") as mem:
            mem.seek(start)
            return mem.read(16).hex()

    return attempt(peek)


@app.task
def steal_key(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Everything a forger would look through for the agent's key: every process's environ and
    command line it can see, its own environment, then a call to the node's port."""
    found = [k for k, v in os.environ.items() if payload["key"] in v]
    for proc in Path("/proc").glob("[0-9]*"):
        for name in ("environ", "cmdline"):
            got = attempt((proc / name).read_bytes)
            if got["ok"] and payload["key"].encode() in got["value"]:
                found.append(f"{proc.name}/{name}")
    node = attempt(socket.create_connection, ("127.0.0.1", payload["port"]), 2)
    if node["ok"]:
        node["value"].close()
        node["value"] = "connected"
    return {"found": found, "node": node}


@app.task
def connect(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    def call() -> str:
        with socket.create_connection((payload["host"], payload["port"]), timeout=2) as sock:
            return sock.recv(16).decode()

    return attempt(call)


@app.task
def write_files(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    return {path: attempt(Path(path).write_text, "written by a guest") for path in payload["paths"]}


@app.task
def write_big(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    chunk = b"x" * 2**20
    with open(payload["path"], "wb") as fh:
        return attempt(lambda: sum(fh.write(chunk) for _ in range(payload["mb"])))


@app.task
def stash(ctx: conveyor.Context, payload: dict[str, Any]) -> str:
    """Leave a secret in the guest's scratch space and stay alive ``hold_s``."""
    Path(payload["path"]).write_text(payload["secret"])
    time.sleep(payload["hold_s"])
    return "held"


@app.task(retry=ONCE)
def fork_bomb(ctx: conveyor.Context, payload: dict[str, Any]) -> dict[str, Any]:
    """Fork children that wait on a pipe until the fork fails or ``cap`` of them run; then
    let them all go. Bounded either way, so the test stops by itself."""
    read_end, write_end = os.pipe()
    children, error = [], None
    for _ in range(payload["cap"]):
        try:
            pid = os.fork()
        except OSError as exc:
            error = f"{type(exc).__name__}: {exc}"
            break
        if pid == 0:
            os.close(write_end)
            os.read(read_end, 1)
            os._exit(0)
        children.append(pid)
    os.close(write_end)
    for pid in children:
        os.waitpid(pid, 0)
    os.close(read_end)
    return {"forked": len(children), "error": error}


@app.task(retry=ONCE)
def hog(ctx: conveyor.Context, payload: dict[str, Any]) -> int:
    blocks = [bytearray(64 * 2**20) for _ in range(int(payload["mb"]) // 64)]
    return len(blocks)
