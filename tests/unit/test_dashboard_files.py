"""The dashboard's static files: served with the right types and a strict CSP, only files that
exist, without an API key; and the sources keep the rules the CSP and escaping rely on."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from conveyor.streams.gateway import dashboard
from conveyor.streams.gateway.errors import error_middleware

Check = Callable[[TestClient[web.Request, web.Application]], Awaitable[None]]


def serve(check: Check) -> None:
    async def main() -> None:
        app = web.Application(middlewares=[error_middleware])
        dashboard.add_routes(app)
        async with TestClient(TestServer(app)) as client:
            await check(client)

    asyncio.run(main())


def test_ui_redirects_to_the_index_with_a_strict_policy() -> None:
    async def check(client: TestClient[web.Request, web.Application]) -> None:
        reply = await client.get("/ui", allow_redirects=False)
        assert (reply.status, reply.headers["Location"]) == (302, "/ui/")
        reply = await client.get("/ui/")
        assert reply.status == 200
        assert reply.headers["Content-Type"] == "text/html; charset=utf-8"
        csp = reply.headers["Content-Security-Policy"]
        assert "default-src 'none'" in csp and "script-src 'self'" in csp
        assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp
        assert reply.headers["X-Content-Type-Options"] == "nosniff"
        assert '<script type="module" src="app.js">' in await reply.text()

    serve(check)


@pytest.mark.parametrize(
    ("path", "content_type"),
    [
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/views/task.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
    ],
)
def test_assets_have_their_content_type(path: str, content_type: str) -> None:
    async def check(client: TestClient[web.Request, web.Application]) -> None:
        reply = await client.get(path)
        assert reply.status == 200
        assert reply.headers["Content-Type"] == content_type
        assert "Content-Security-Policy" in reply.headers

    serve(check)


@pytest.mark.parametrize(
    "path", ["/ui/nope.js", "/ui/../auth.py", "/ui/%2e%2e/auth.py", "/ui/views", "/ui/x.py"]
)
def test_only_shipped_files_are_served(path: str) -> None:
    async def check(client: TestClient[web.Request, web.Application]) -> None:
        reply = await client.get(path)
        assert reply.status == 404
        assert (await reply.json())["error"]["code"] == "not_found"

    serve(check)


def test_public_paths_are_the_ui_only() -> None:
    assert dashboard.is_public("/ui") and dashboard.is_public("/ui/app.js")
    assert not dashboard.is_public("/uix") and not dashboard.is_public("/v1/ui")


def test_every_shipped_file_is_package_data() -> None:
    files = dashboard.load_files()
    assert {"index.html", "app.js", "app.css", "api.js", "dom.js"} <= set(files)
    assert all(name.count("/") <= 1 for name in files)  # pyproject globs ui/* and ui/views/*


def test_sources_never_parse_data_as_html() -> None:
    """The CSP forbids inline script and style; the views build DOM nodes, never HTML text."""
    files = dashboard.load_files()
    for name, (body, _) in files.items():
        text = body.decode()
        if name.endswith(".js"):
            banned = re.findall(
                r"innerHTML|outerHTML|insertAdjacentHTML|document\.write|eval\(", text
            )
            assert not banned, (name, banned)
        if name.endswith(".html"):
            assert not re.search(r"<script(?![^>]*\bsrc=)", text), name
            assert not re.search(r"\sstyle=|<style|\son[a-z]+=", text), name
