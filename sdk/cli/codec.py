"""``conveyor codec-server --codec mymod:codec``: the codec endpoint the user runs, so the
dashboard can show encoded payloads decoded (``conveyor.codec_server`` has the protocol)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from typing import Annotated

import typer

from conveyor.cli.common import console, fail
from conveyor.cli.exits import USAGE
from conveyor.codecs import CodecError, load_codec

TOKEN_ENV = "CONVEYOR_CODEC_TOKEN"


def codec_server(
    codec: Annotated[
        str,
        typer.Option(
            "--codec",
            help="The payload codec, as module:attr (an object with encode and decode, or a "
            "function returning one); its module is imported from the current directory",
        ),
    ],
    host: Annotated[str, typer.Option("--host", help="Address to listen on")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535)] = 7410,
    allow_origin: Annotated[
        list[str] | None,
        typer.Option(
            "--allow-origin",
            help="A dashboard origin that may call it from a browser (repeat for more) "
            "[default: http://127.0.0.1:7400 and http://localhost:7400]",
        ),
    ] = None,
) -> None:
    """Serve POST /decode and /encode with your payload codec, for the dashboard (set its URL
    under "Codec endpoint" there). The keys stay in this process; with $CONVEYOR_CODEC_TOKEN
    set, callers must send it as a bearer token."""
    from aiohttp import web

    from conveyor.codec_server import DEFAULT_ORIGINS, codec_app

    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        loaded = load_codec(codec)
    except (CodecError, ImportError, AttributeError) as exc:
        raise fail(f"--codec {codec}: {exc}", USAGE) from None
    origins = tuple(allow_origin or DEFAULT_ORIGINS)
    token = os.environ.get(TOKEN_ENV) or None
    app = codec_app(loaded, origins=origins, token=token)

    async def serve() -> None:
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        console.print(f"codec endpoint on http://{host}:{bound} (origins: {', '.join(origins)})")
        if token is not None:
            console.print(f"  requests must carry the bearer token from ${TOKEN_ENV}")
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: a normal way to stop it
        asyncio.run(serve())
