"""A codec endpoint the user runs: ``conveyor codec-server --codec mymod:codec``.

The node never holds the keys of an encoded payload (``conveyor.codecs``), so the dashboard
shows such a payload as ``encoded (conveyor/v1, zlib+aes-gcm)``. Given this server's URL (a
setting on the dashboard, kept in the browser), it sends the envelopes here and shows what
comes back. The keys stay with the user, in the process that runs this server.

    POST /decode   {"payloads": [<JSON value>, ...]}  ->  {"payloads": [<JSON value>, ...]}
    POST /encode   the same shapes, the other way
    GET  /healthz  {"ok": true}

A value that is not an envelope passes through /decode as it is, so a caller can send a whole
task's fields. A payload that does not decode refuses the whole request (400) with its index
and the cause; nothing is half answered. Rules:
1. It listens on 127.0.0.1 unless told otherwise: whoever can reach it can read the payloads.
2. Browsers may call it only from the origins given (``--allow-origin``; the local dashboard's
   by default): the CORS answer names the caller's origin only when it is listed.
3. With ``$CONVEYOR_CODEC_TOKEN`` set, a request must carry ``Authorization: Bearer <token>``
   (the dashboard sends the token set beside the URL); /healthz needs none. The token is never
   logged or echoed.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from aiohttp import web

from conveyor.codecs import CodecError, PayloadCodec, decode_values, encode_values

PAYLOADS_MAX = 1_000  # payloads in one request
BODY_BYTES_MAX = 16 * 1024 * 1024
DEFAULT_ORIGINS = ("http://127.0.0.1:7400", "http://localhost:7400")
ALLOWED_HEADERS = "Content-Type, Authorization"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def codec_app(
    codec: PayloadCodec, *, origins: Sequence[str] = DEFAULT_ORIGINS, token: str | None = None
) -> web.Application:
    """The codec endpoint's aiohttp application (rules 2 and 3)."""
    allowed = frozenset(o.rstrip("/") for o in origins)

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        origin = request.headers.get("Origin")
        if request.method == "OPTIONS":
            reply: web.StreamResponse = web.Response(status=204)
        elif token is not None and request.path != "/healthz" and not _bearer_ok(request, token):
            reply = _refusal(401, "unauthorized", "send Authorization: Bearer <the codec token>")
        else:
            try:
                reply = await handler(request)
            except web.HTTPException as exc:
                reply = _refusal(exc.status, "not_found", exc.reason)
        if origin is not None and origin in allowed:
            reply.headers["Access-Control-Allow-Origin"] = origin
            reply.headers["Access-Control-Allow-Methods"] = "POST, GET, OPTIONS"
            reply.headers["Access-Control-Allow-Headers"] = ALLOWED_HEADERS
            reply.headers["Vary"] = "Origin"
        return reply

    app = web.Application(middlewares=[guard], client_max_size=BODY_BYTES_MAX)

    async def decode(request: web.Request) -> web.Response:
        return await _convert(request, lambda values: decode_values(codec, values))

    async def encode(request: web.Request) -> web.Response:
        return await _convert(request, lambda values: encode_values(codec, values))

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_post("/decode", decode)
    app.router.add_post("/encode", encode)
    app.router.add_get("/healthz", healthz)
    return app


def _bearer_ok(request: web.Request, token: str) -> bool:
    given = request.headers.get("Authorization", "")
    scheme, _, value = given.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(value.encode(), token.encode())


async def _convert(request: web.Request, convert: Callable[[list[Any]], list[Any]]) -> web.Response:
    try:
        body = await request.json()
    except (ValueError, UnicodeDecodeError):
        return _refusal(400, "invalid_request", 'the body is JSON: {"payloads": [...]}')
    payloads = body.get("payloads") if isinstance(body, dict) else None
    if not isinstance(payloads, list):
        return _refusal(400, "invalid_request", 'the body is {"payloads": [...]}: a list')
    if len(payloads) > PAYLOADS_MAX:
        too_many = f"at most {PAYLOADS_MAX} payloads a request, got {len(payloads)}"
        return _refusal(400, "invalid_request", too_many)
    out: list[Any] = []
    for index, value in enumerate(payloads):  # one by one, so a refusal names its payload
        try:
            out.extend(convert([value]))
        except CodecError as exc:
            return _refusal(400, "codec_error", f"payloads[{index}]: {exc}")
    return web.json_response({"payloads": out}, dumps=_dumps)


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _refusal(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)
