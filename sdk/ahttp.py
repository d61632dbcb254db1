"""The HTTP session of the asyncio clients: the SDK's ``AsyncClient`` and the agent's worker API.

aiohttp, the library the gateway serves with: a request costs its client ~0.3 ms of CPU here,
against ~1 ms through httpx's asyncio client, and the agent makes two of them per task when
tasks trickle in. The session is opened on first use, inside the running loop, so that a client
can be built anywhere (at import time, in a sync ``__init__``). Like the sync ``Client`` (httpx),
it goes through the proxy that ``HTTP_PROXY``/``HTTPS_PROXY`` name, unless ``NO_PROXY`` exempts
the server; read once, when the session is built.

aiohttp is imported by the first request, not with this module: ``conveyor.AsyncClient`` is part
of ``import conveyor``'s light surface (tests/unit/test_import_boundaries.py), and aiohttp takes
longer to import than the rest of the client. Its errors come out as ``TransportError`` and
``NotSent``, which need no aiohttp to be caught.
"""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from conveyor.frozen import frozen

if TYPE_CHECKING:
    import aiohttp

JSON_BODY = {"Content-Type": "application/json"}


class TransportError(Exception):
    """A request that failed in transit: it may or may not have reached the server. The message
    is aiohttp's error (the cause), e.g. ``ServerDisconnectedError('Server disconnected')``."""


class NotSent(TransportError):
    """A request that never left (no connection was made): sending it again cannot apply it
    twice."""


@frozen
class Reply:
    status: int
    content: bytes
    headers: Mapping[str, str]


class Session:
    """Requests to one server (``url``), with the headers every request carries."""

    def __init__(self, url: str, headers: Mapping[str, str], timeout: float) -> None:
        self.url = url.rstrip("/")
        self.proxy = proxy_for(self.url)
        self._headers = dict(headers)
        self.timeout = timeout  # seconds per request, unless the request says otherwise
        self._session: aiohttp.ClientSession | None = None

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        params: Mapping[str, Any] | None = None,
        timeout: float | None = None,
    ) -> Reply:
        import aiohttp  # imported by the first request (see above); then a dict look-up

        if self._session is None:
            self._session = aiohttp.ClientSession(headers=self._headers)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        try:
            async with self._session.request(
                method,
                self.url + path,
                data=data,
                headers=None if data is None else JSON_BODY,
                params=params,
                proxy=self.proxy,
                timeout=aiohttp.ClientTimeout(total=timeout or self.timeout),
            ) as response:
                return Reply(response.status, await response.read(), response.headers)
        except aiohttp.ClientConnectorError as exc:
            raise NotSent(repr(exc)) from exc
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise TransportError(repr(exc)) from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url``, or None."""
    parts = urllib.parse.urlsplit(url)
    if parts.hostname is None or urllib.request.proxy_bypass(parts.hostname):
        return None
    return urllib.request.getproxies().get(parts.scheme)
