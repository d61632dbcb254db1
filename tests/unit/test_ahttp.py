"""``conveyor.ahttp``: aiohttp's failures as ``TransportError`` and ``NotSent``, which the async
client and the agent catch without importing aiohttp, and what each one means for a retry."""

from __future__ import annotations

import asyncio
import socket
from typing import Any

import aiohttp
import pytest

from conveyor.aclient import AsyncClient
from conveyor.ahttp import NotSent, Session, TransportError
from conveyor.errors import TransientError

pytestmark = pytest.mark.timeout(30)


def closed_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """A server that reads a request and closes the connection without answering."""
    await reader.readuntil(b"\r\n\r\n")
    writer.close()


def test_no_connection_is_not_sent() -> None:
    async def main() -> None:
        session = Session(f"http://127.0.0.1:{closed_port()}", {}, 5.0)
        try:
            with pytest.raises(NotSent) as caught:
                await session.request("POST", "/v1/tasks", body={"task_type": "a"})
        finally:
            await session.close()
        assert isinstance(caught.value.__cause__, aiohttp.ClientConnectorError)
        assert "ClientConnectorError" in str(caught.value)  # the cause, in logs and errors

    asyncio.run(main())


def test_a_connection_dropped_mid_request_may_have_been_sent() -> None:
    """The server read the request and closed: it may have applied it, so not ``NotSent``."""

    async def main() -> None:
        server = await asyncio.start_server(drop, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        session = Session(f"http://127.0.0.1:{port}", {}, 5.0)
        try:
            with pytest.raises(TransportError) as caught:
                await session.request("GET", "/v1/tasks")
        finally:
            await session.close()
            server.close()
        assert not isinstance(caught.value, NotSent)
        assert isinstance(caught.value.__cause__, aiohttp.ClientError)

    asyncio.run(main())


async def tries_of(url: str) -> tuple[int, TransientError]:
    """How many times the async client sent a request that is not idempotent (a bulk
    cancel), and the error it ended with."""
    async with AsyncClient(url, "k", retries=2) as client:
        sent = 0
        request = client._http.request

        async def counted(*args: Any, **kwargs: Any) -> Any:
            nonlocal sent
            sent += 1
            return await request(*args, **kwargs)

        client._http.request = counted  # type: ignore[method-assign]
        with pytest.raises(TransientError) as caught:
            await client.cancel_where(queue="default")
    return sent, caught.value


def test_the_async_client_resends_a_request_only_if_it_never_left() -> None:
    async def main() -> None:
        sent, error = await tries_of(f"http://127.0.0.1:{closed_port()}")
        assert sent == 3  # never left: sent again, as retries=2 allows
        assert str(error).startswith("POST /v1/tasks:cancel: ClientConnectorError")
        assert isinstance(error.__cause__, NotSent)

        server = await asyncio.start_server(drop, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        try:
            sent, error = await tries_of(f"http://127.0.0.1:{port}")
        finally:
            server.close()
        assert sent == 1  # it may have been applied: not sent twice
        assert isinstance(error.__cause__, TransportError)
        assert not isinstance(error.__cause__, NotSent)

    asyncio.run(main())
