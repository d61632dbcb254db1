"""A TCP proxy on 127.0.0.1 that loses replies (the lost-replies run of tests/PLAN.md).

Each client connection carries one HTTP/1.1 request: the proxy reads its head and its
``Content-Length`` body, sends it upstream on a fresh connection with ``Connection: close``,
and reads the whole reply (the upstream closes after it). Then, for a request whose method and
path match ``drop`` and with the seeded probability ``p``, it closes the client connection
without a byte: the request committed upstream, the client saw a reset and cannot tell. Else
it forwards the reply (which says ``connection: close``) and closes.

It counts what it forwarded and dropped per ``METHOD path`` (path without the query), so a run
can prove faults happened. Only plain requests with ``Content-Length`` (or no body) are
supported, which is what the SDK and the agent send.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
from collections import Counter
from dataclasses import dataclass, field

HEAD_MAX = 64 * 1024
IO_TIMEOUT_S = 30.0


@dataclass
class LossyProxy:
    upstream_port: int
    p: float
    rng: random.Random
    drop: tuple[tuple[str, str], ...]  # (method, path prefix) whose replies may be lost
    port: int = 0
    forwarded: Counter[str] = field(default_factory=Counter)
    dropped: Counter[str] = field(default_factory=Counter)
    _server: asyncio.Server | None = None
    _serving: set[asyncio.Task[None]] = field(default_factory=set)

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        sock: socket.socket = self._server.sockets[0]
        self.port = int(sock.getsockname()[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None
        for task in list(self._serving):  # e.g. an agent's long poll, still open
            task.cancel()
        await asyncio.gather(*self._serving, return_exceptions=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        me = asyncio.current_task()
        if me is not None:
            self._serving.add(me)
        try:
            await asyncio.wait_for(self._one(reader, writer), IO_TIMEOUT_S)
        except Exception:  # a client gone, an upstream down: the client sees a reset
            pass
        finally:
            writer.close()
            if me is not None:
                self._serving.discard(me)

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        if len(head) > HEAD_MAX:
            return
        lines = head.decode("latin-1").split("\r\n")
        method, target, _ = lines[0].split(" ", 2)
        path = target.split("?", 1)[0]
        headers = [h for h in lines[1:] if h]
        length = 0
        kept = []
        for h in headers:
            name, _, value = h.partition(":")
            if name.strip().lower() == "content-length":
                length = int(value.strip())
            if name.strip().lower() not in ("connection", "keep-alive"):
                kept.append(h)
        body = await reader.readexactly(length) if length else b""
        request = "\r\n".join([lines[0], *kept, "Connection: close", "", ""]).encode("latin-1")
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        try:
            up_writer.write(request + body)
            await up_writer.drain()
            reply = await up_reader.read()  # until the upstream closes: the whole reply
        finally:
            up_writer.close()
            with contextlib.suppress(Exception):
                await up_writer.wait_closed()
        if not reply:
            return
        name = f"{method} {path}"
        if self._droppable(method, path) and self.rng.random() < self.p:
            self.dropped[name] += 1
            return  # committed upstream; the client gets a closed connection
        self.forwarded[name] += 1
        writer.write(reply)
        await writer.drain()

    def _droppable(self, method: str, path: str) -> bool:
        return any(method == m and path.startswith(prefix) for m, prefix in self.drop)
