"""One table from exception class to (HTTP status, stable code), and the error body.

Rule: every 4xx/5xx body is ``{"error": {"code", "message", "field"?}}`` (PROTOCOL.md). An
exception the table does not know is a bug: it becomes a 500 ``internal`` with an incident id
that is also logged with the traceback; the client never sees the traceback.
"""

from __future__ import annotations

import json
import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from conveyor.errors import (
    Conflict,
    ContractError,
    FencedError,
    Forbidden,
    NotFound,
    RateLimited,
    TransientError,
    Unauthorized,
)

log = logging.getLogger("conveyor.gateway")


class UnknownTaskType(ContractError):
    """The app has no registered handler for this task type."""

    code = "unknown_task_type"


class PayloadTooLarge(ContractError):
    code = "payload_too_large"
    http_status = 413


class UnsupportedMediaType(ContractError):
    code = "unsupported_media_type"
    http_status = 415


# Most specific first: the first matching row wins.
ERRORS: tuple[tuple[type[BaseException], int, str], ...] = (
    (UnknownTaskType, 400, "unknown_task_type"),
    (PayloadTooLarge, 413, "payload_too_large"),
    (UnsupportedMediaType, 415, "unsupported_media_type"),
    (Unauthorized, 401, "unauthorized"),
    (Forbidden, 403, "forbidden"),
    (NotFound, 404, "not_found"),
    (Conflict, 409, "conflict"),
    (ContractError, 400, "invalid_request"),
    (RateLimited, 429, "rate_limited"),
    (TransientError, 503, "unavailable"),
    # A fenced append means a leader change is under way: the same request succeeds soon.
    (FencedError, 503, "unavailable"),
)

# aiohttp's own errors (no route, wrong method, body over client_max_size).
_HTTP_CODES = {401: "unauthorized", 404: "not_found", 413: "payload_too_large"}
RETRY_AFTER_MS_DEFAULT = 1_000


def dumps(body: Any) -> str:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False)


def error_body(code: str, message: str, field: str | None = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if field is not None:
        error["field"] = field
    return {"error": error}


def classify(exc: BaseException) -> tuple[int, str] | None:
    for cls, status, code in ERRORS:
        if isinstance(exc, cls):
            return status, code
    return None


def render(exc: BaseException) -> web.Response:
    """The response for a known error; a 500 ``internal`` for anything else."""
    known = classify(exc)
    if known is None:
        incident = secrets.token_hex(6)
        log.error("internal error %s: %r", incident, exc, exc_info=exc)
        message = f"internal error {incident}; the server logged the details"
        return web.Response(
            status=500, text=dumps(error_body("internal", message)), content_type="application/json"
        )
    status, code = known
    field = exc.field if isinstance(exc, ContractError) else None
    headers: dict[str, str] = {}
    if status in (429, 503):
        retry_ms = getattr(exc, "retry_after_ms", RETRY_AFTER_MS_DEFAULT)
        headers["Retry-After"] = str(max(1, -(-int(retry_ms) // 1000)))
    return web.Response(
        status=status,
        text=dumps(error_body(code, str(exc), field)),
        content_type="application/json",
        headers=headers,
    )


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        code = _HTTP_CODES.get(exc.status, "invalid_request")
        message = f"{request.method} {request.path}: {exc.reason}"
        return web.Response(
            status=exc.status,
            text=dumps(error_body(code, message)),
            content_type="application/json",
            headers=_allow(exc),
        )
    except Exception as exc:
        return render(exc)


def _allow(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}
