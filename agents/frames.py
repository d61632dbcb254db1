"""Frames on the guest socket: a 4-byte big-endian length, then one JSON object.

A guest's stdout and stderr are its own log file, set up when the agent starts it; a "done"
frame reports the byte range the attempt wrote (``log_range``). ``BlockingFrames`` is the
guest's side (blocking socket, read by one thread at a time); ``AsyncFrames`` the agent's (an
asyncio protocol: the socket stays registered with the loop, frames are pushed to callbacks).

    agent -> guest   {"op": "run", "task_id", "task_type", "attempt", "payload", "checkpoint",
                      "steps", "started_ms", "run_key", "compensating", "cpu_s", "cpu_hard",
                      "concurrent", "trace_context"}
                     {"op": "cancel", "task_id"}        {"op": "exit"}
                     {"op": "withdraw", "task_id"}      (a queued job: answered "withdrawn")
                     {"op": "abort", "task_id"}         (a concurrent attempt's coroutine)
                     {"op": "step_ack", "task_id", "seq", "ok", "lost", "transient", "reason"}
    guest -> agent   {"op": "hello", "ok", "pid", "error"}
                     {"op": "heartbeat", "task_id", "progress"}
                     {"op": "checkpoint", "task_id", "value"}
                     {"op": "step", "task_id", "seq", "step_op", "identity", "position",
                      "value"}   (the guest blocks until its step_ack)
                     {"op": "done", "task_id", "log_range", "outcome", "result", ...}
                     {"op": "withdrawn", "task_id"}

Every frame about an attempt names its task id: a guest may run several concurrent attempts
at once ("run" with ``concurrent``, ``conveyor.agents.pool``), each reporting on its own.
"""

from __future__ import annotations

import asyncio
import json
import select
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

import msgspec

FRAME_BYTES_MAX = 64 * 1024 * 1024
_HEADER = struct.Struct(">I")
_RECV_BYTES = 256 * 1024


class FrameError(Exception):
    """The peer broke the framing (too large, not JSON): the guest is not trusted further."""


# msgspec reads and writes a frame in a fraction of the json module's time (a frame each way
# per attempt, on the guest's and the agent's hot path). What it does not take as the json
# module does goes through the json module instead, so a frame means what it always meant: a
# lone surrogate (its escape, read), a dict keyed by None or a bool, a number out of a float's
# range (read). Also unlike it, msgspec writes NaN and infinities as null; a result, a
# checkpoint or a step value with one is refused before it is framed (JSON has none).
_ENCODER = msgspec.json.Encoder()
_DECODER = msgspec.json.Decoder()


def encode(obj: dict[str, Any]) -> bytes:
    try:
        body = _ENCODER.encode(obj)
    except (TypeError, UnicodeEncodeError):
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
        obj = _DECODER.decode(body)
    except msgspec.DecodeError:
        try:
            obj = json.loads(body)
        except ValueError as exc:
            raise FrameError(f"frame is not JSON: {exc}") from exc
    if not isinstance(obj, dict):
        raise FrameError("frame is not a JSON object")
    return obj


class BlockingFrames:
    """The guest's end. ``recv`` from one thread at a time; ``send`` from any thread."""

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

    def buffered(self) -> bool:
        """Whether a whole frame is already here (``recv`` returns it without a syscall)."""
        if len(self._buf) < _HEADER.size:
            return False
        size: int = _HEADER.unpack_from(self._buf)[0]
        return len(self._buf) >= _HEADER.size + size

    def readable(self, timeout_s: float) -> bool:
        """Whether ``recv`` has something to return (a frame, or the start of one, or EOF)
        within ``timeout_s``."""
        if len(self._buf) >= _HEADER.size:
            return True
        return bool(select.select([self.sock], [], [], max(0.0, timeout_s))[0])


class AsyncFrames(asyncio.Protocol):
    """The agent's end: a protocol on the guest socket, in the agent's event loop. Each whole
    frame goes to ``on_frame`` as it arrives; the end of the stream (EOF, an error, or broken
    framing, then kept in ``broken``) to ``on_close``, once. ``send`` does not wait: the frames
    sent in one turn of the loop go out in one write at its end (one wakeup of the guest)."""

    def __init__(
        self, on_frame: Callable[[dict[str, Any]], None], on_close: Callable[[], None]
    ) -> None:
        self._on_frame = on_frame
        self._on_close = on_close
        self._buf = bytearray()
        self._transport: asyncio.Transport | None = None
        self._out: list[bytes] = []  # frames sent in this turn of the loop: one write
        self.closed = False
        self.broken: str | None = None

    @classmethod
    async def open(
        cls,
        sock: socket.socket,
        on_frame: Callable[[dict[str, Any]], None],
        on_close: Callable[[], None],
    ) -> AsyncFrames:
        loop = asyncio.get_running_loop()
        _, frames = await loop.create_unix_connection(lambda: cls(on_frame, on_close), sock=sock)
        return frames

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        if self.broken is not None:
            return
        self._buf.extend(data)
        try:
            while (frame := _take(self._buf)) is not None:
                self._on_frame(frame)
        except FrameError as exc:
            self.broken = str(exc)
            self.close()

    def eof_received(self) -> bool:
        return False  # close our end too

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed:
            self.closed = True
            self._on_close()

    def send(self, obj: dict[str, Any]) -> None:
        if self.closed or self._transport is None or self._transport.is_closing():
            raise ConnectionResetError("the guest socket is closed")
        if not self._out:
            asyncio.get_running_loop().call_soon(self._flush)
        self._out.append(encode(obj))

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(out))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.abort()
