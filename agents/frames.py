"""Frames on the guest socket: a 4-byte big-endian length, then one JSON object.

A guest's stdout and stderr are its own log file, set up when the agent starts it; a "done"
frame reports the byte range the attempt wrote (``log_range``). ``BlockingFrames`` is the
guest's side (threads, blocking socket); ``AsyncFrames`` the agent's.

    agent -> guest   {"op": "run", "task_id", "task_type", "attempt", "payload", "checkpoint",
                      "steps", "started_ms", "run_key", "compensating", "cpu_s"}
                     {"op": "cancel", "task_id"}        {"op": "exit"}
                     {"op": "step_ack", "task_id", "seq", "ok", "lost", "transient", "reason"}
    guest -> agent   {"op": "hello", "ok", "pid", "error"}
                     {"op": "heartbeat", "task_id", "progress"}
                     {"op": "checkpoint", "task_id", "value"}
                     {"op": "step", "task_id", "seq", "step_op", "identity", "position",
                      "value"}   (the guest blocks until its step_ack)
                     {"op": "done", "task_id", "log_range", "outcome", "result", ...}
"""

from __future__ import annotations

import asyncio
import json
import socket
import struct
import threading
from typing import Any

FRAME_BYTES_MAX = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
_RECV_BYTES = 256 * 1024


class FrameError(Exception):
    """The peer broke the framing (too large, not JSON): the guest is not trusted further."""


def encode(obj: dict[str, Any]) -> bytes:
    body = json.dumps(obj, separators=(",", ":")).encode()
    if len(body) > FRAME_BYTES_MAX:
        raise FrameError(f"frame of {len(body)} bytes is over {FRAME_BYTES_MAX}")
    return _HEADER.pack(len(body)) + body


def _take(buf: bytearray) -> dict[str, Any] | None:
    """Pop one whole frame off ``buf``, or None if it does not hold one yet."""
    if len(buf) < _HEADER.size:
        return None
    (size,) = _HEADER.unpack_from(buf)
    if size > FRAME_BYTES_MAX:
        raise FrameError(f"frame of {size} bytes is over {FRAME_BYTES_MAX}")
    if len(buf) < _HEADER.size + size:
        return None
    body = bytes(buf[_HEADER.size : _HEADER.size + size])
    del buf[: _HEADER.size + size]
    try:
        obj = json.loads(body)
    except ValueError as exc:
        raise FrameError(f"frame is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise FrameError("frame is not a JSON object")
    return obj


class BlockingFrames:
    """The guest's end. ``recv`` from one reader thread; ``send`` from any thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self._buf = bytearray()
        self._lock = threading.Lock()

    def send(self, obj: dict[str, Any]) -> None:
        data = encode(obj)
        with self._lock:
            self.sock.sendall(data)

    def recv(self) -> dict[str, Any] | None:
        """The next frame; None at EOF."""
        while True:
            frame = _take(self._buf)
            if frame is not None:
                return frame
            data = self.sock.recv(_RECV_BYTES)
            if not data:
                return None
            self._buf.extend(data)


class AsyncFrames:
    """The agent's end, on a non-blocking socket in the agent's event loop."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock
        self._buf = bytearray()
        self._send_lock = asyncio.Lock()

    async def recv(self) -> dict[str, Any] | None:
        loop = asyncio.get_running_loop()
        while True:
            frame = _take(self._buf)
            if frame is not None:
                return frame
            try:
                data = await loop.sock_recv(self.sock, _RECV_BYTES)
            except (ConnectionError, OSError):
                return None
            if not data:
                return None
            self._buf.extend(data)

    async def send(self, obj: dict[str, Any]) -> None:
        data = encode(obj)
        async with self._send_lock:
            await asyncio.get_running_loop().sock_sendall(self.sock, data)

    def close(self) -> None:
        self.sock.close()
