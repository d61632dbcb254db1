"""The dashboard at ``/ui``: static files shipped in the package (``gateway/ui/``), no build step.

Rule 1: the files are public like ``/healthz``: they hold no data. Everything the page shows
comes from the JSON API, called with the API key the user typed in (kept in localStorage).
Rule 2: only the files found in ``ui/`` at start are served, each with the content type of its
suffix; any other path under ``/ui/`` is a 404 (no file system lookups per request, so no
path tricks).
Rule 3: every file goes out with a strict Content-Security-Policy: scripts, styles and fetches
from this origin only, no inline script or style, no frames, no forms posting elsewhere. The
page never parses data as HTML (it builds DOM nodes and sets ``textContent``), and the policy
stops an injected ``<script>`` even if a bug did. Fetches may also go to this machine's
loopback, for a codec endpoint the user runs there (``conveyor codec-server``), which decodes
encoded payloads for the page; nowhere else.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from conveyor.errors import NotFound

UI_DIR = Path(__file__).with_name("ui")
PREFIX = "/ui"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; "
    "connect-src 'self' http://127.0.0.1:* http://localhost:*; "
    "img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
}
HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}
FILES: web.AppKey[dict[str, tuple[bytes, str]]] = web.AppKey("dashboard_files")


def is_public(path: str) -> bool:
    return path == PREFIX or path.startswith(PREFIX + "/")


def load_files(root: Path = UI_DIR) -> dict[str, tuple[bytes, str]]:
    """Relative path -> (bytes, content type) of every servable file under ``root``."""
    files: dict[str, tuple[bytes, str]] = {}
    for path in sorted(root.rglob("*")):
        content_type = CONTENT_TYPES.get(path.suffix)
        if path.is_file() and content_type is not None:
            files[path.relative_to(root).as_posix()] = (path.read_bytes(), content_type)
    return files


async def to_index(request: web.Request) -> web.StreamResponse:
    # Relative URLs in index.html (app.js, app.css) resolve against /ui/, not /.
    raise web.HTTPFound(PREFIX + "/")


async def serve_file(request: web.Request) -> web.Response:
    name = request.match_info["path"] or "index.html"
    found = request.app[FILES].get(name)
    if found is None:
        raise NotFound(f"no dashboard file {name!r}; open {PREFIX}/", field=None)
    body, content_type = found
    return web.Response(body=body, headers={"Content-Type": content_type, **HEADERS})


def add_routes(app: web.Application) -> None:
    app[FILES] = load_files()
    app.router.add_get(PREFIX, to_index, allow_head=False)
    app.router.add_get(PREFIX + "/{path:.*}", serve_file, allow_head=False)
