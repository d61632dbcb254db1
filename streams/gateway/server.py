"""The gateway's HTTP server: aiohttp's, except for the answers its own parser gives.

aiohttp parses each request before any middleware runs. When the request line or a header is
malformed (a NUL or a bare CR in a header, a repeated Content-Length, a line over the size
limit, garbage for a method), its connection handler answers by itself, in plain text that
quotes the offending line, and logs that line with a traceback. The line is whatever the
client sent, an ``Authorization: Bearer <key>`` header included. So:

Rule 1: those answers are the documented JSON error body (``errors.py``), and their message
names the kind of fault only: it never quotes a byte of the request.
Rule 2: they are logged as one line (the client's address and the kind of fault), never with
the parser's message or a traceback, which hold the request's bytes.
Rule 3: a request that got past the parser and failed anyway (a 500 no middleware caught) is
answered like ``errors.render`` answers it: an incident id, with the traceback in the log.
"""

from __future__ import annotations

import logging

from aiohttp import web
from aiohttp.http_exceptions import (
    BadStatusLine,
    HttpProcessingError,
    InvalidHeader,
    InvalidURLError,
    LineTooLong,
)

from conveyor.streams.gateway import errors

log = logging.getLogger("conveyor.gateway")

# Most specific first: the first matching row wins. aiohttp raises these from its parser.
_PARSE_FAULTS: tuple[tuple[type[HttpProcessingError], str], ...] = (
    (LineTooLong, "the request line or a header is longer than the server accepts"),
    (BadStatusLine, "malformed request line; send 'METHOD /path HTTP/1.1'"),
    (InvalidURLError, "malformed request target; send a path such as /v1/tasks"),
    (InvalidHeader, "malformed header name or value"),
)
_PARSE_FAULT_DEFAULT = (
    "malformed HTTP request: a header or the body's framing is invalid (a control character "
    "or a bare CR in a header, a repeated Content-Length, a broken chunk)"
)


def parse_fault(exc: BaseException | None) -> str:
    """What was wrong with an unparseable request, in words that quote none of it."""
    for cls, text in _PARSE_FAULTS:
        if isinstance(exc, cls):
            return f"{text}; nothing was done"
    return f"{_PARSE_FAULT_DEFAULT}; nothing was done"


def error_response(status: int, exc: BaseException | None) -> web.Response:
    """The JSON answer to a request aiohttp failed before or around our handlers."""
    if status >= 500 and exc is not None:
        return errors.render(exc)  # Rule 3
    if status >= 500:
        code, message = "unavailable", "the request timed out on the server; send it again"
    else:
        code, message = "invalid_request", parse_fault(exc)
    return web.Response(
        status=status,
        text=errors.dumps(errors.error_body(code, message)),
        content_type="application/json",
    )


class _Connection(web.RequestHandler):
    """One client connection: aiohttp's handler with ``handle_error`` per Rules 1-3."""

    __slots__ = ()

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,  # aiohttp's text: it quotes the request, never used
    ) -> web.StreamResponse:
        if status < 500:  # Rule 2 (Rule 3 logs through errors.render)
            log.info("malformed request from %s: %s", request.remote, type(exc).__name__)
        if request.writer.output_size > 0:
            raise ConnectionError("the response has started; it cannot become an error")
        response = error_response(status, exc)
        response.force_close()  # the parser's state after a fault is unknown: start afresh
        return response


class _Server(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _Connection(self, loop=self._loop, **self._kwargs)


class GatewayRunner(web.AppRunner):
    """``web.AppRunner`` whose connections answer parser faults per the rules above."""

    async def _make_server(self) -> web.Server:
        made = await super()._make_server()  # starts the app, applies the runner's options
        return _Server(
            made.request_handler,
            request_factory=made.request_factory,
            handler_cancellation=made.handler_cancellation,
            **made._kwargs,
        )
