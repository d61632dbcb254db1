"""Enqueue from a plain WSGI app (Flask, Django and friends are WSGI apps too): one sync
``conveyor.Client`` for the process.

    conveyor dev --app examples.shop:app                 # a node and an agent for the shop
    CONVEYOR_URL=http://127.0.0.1:7070 CONVEYOR_API_KEY=... python -m examples.wsgi_app
    curl -X POST localhost:8001/receipts -d 'order=7&email=ada@example.com'
    curl localhost:8001/tasks/<task_id>

``conveyor.Client`` is thread-safe: a threaded server (gunicorn --threads, wsgiref's threading
server here) shares one, with its connection pool, across requests. ``make_app`` takes the
client, so a test or another server can hand it its own.
"""

from __future__ import annotations

import json
import socketserver
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import parse_qs
from wsgiref.simple_server import WSGIServer, make_server

import conveyor
from conveyor.errors import NotFound
from examples import shop

StartResponse = Callable[[str, list[tuple[str, str]]], Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]
BODY_BYTES_MAX = 64 * 1024


def make_app(client: conveyor.Client) -> WsgiApp:
    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        if method == "POST" and path == "/receipts":
            status, reply = send_receipt(client, _form(environ))
        elif method == "GET" and path.startswith("/tasks/"):
            status, reply = task(client, path.removeprefix("/tasks/"))
        else:
            status, reply = "404 Not Found", {"error": f"no route {method} {path}"}
        body = json.dumps(reply).encode()
        start_response(status, [("Content-Type", "application/json")])
        return [body]

    return app


def send_receipt(client: conveyor.Client, form: dict[str, str]) -> tuple[str, dict[str, Any]]:
    if not form.get("order", "").isascii() or not form.get("order", "").isdigit():
        return "400 Bad Request", {"error": "order must be a number, as order=7"}
    if "@" not in form.get("email", ""):
        return "400 Bad Request", {"error": "email must be an address, as email=ada@example.com"}
    receipt = {"order": int(form["order"]), "email": form["email"]}
    handle = client.enqueue(shop.send_receipt, receipt, idempotency_key=f"receipt-{form['order']}")
    return "202 Accepted", {"task_id": handle.id, "created": handle.created}


def task(client: conveyor.Client, task_id: str) -> tuple[str, dict[str, Any]]:
    try:
        info = client.get(task_id)
    except NotFound as exc:
        return "404 Not Found", {"error": str(exc)}
    return "200 OK", {"status": info.status, "attempt": info.attempt, "result": info.result}


def _form(environ: dict[str, Any]) -> dict[str, str]:
    try:
        size = min(int(environ.get("CONTENT_LENGTH") or 0), BODY_BYTES_MAX)
    except ValueError:
        size = 0
    fields = parse_qs(environ["wsgi.input"].read(size).decode(errors="replace"))
    return {name: values[0] for name, values in fields.items()}


class ThreadingWSGIServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


def serve(client: conveyor.Client, port: int = 8001) -> WSGIServer:
    """A threaded wsgiref server on 127.0.0.1 (``serve_forever`` it; port 0 picks one)."""
    return make_server("127.0.0.1", port, make_app(client), server_class=ThreadingWSGIServer)


if __name__ == "__main__":
    with conveyor.Client() as client, serve(client) as server:
        print(f"serving on http://127.0.0.1:{server.server_port}")
        server.serve_forever()
