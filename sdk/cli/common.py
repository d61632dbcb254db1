"""What every command shares: the console, the home dir, the API key and a tiny HTTP client.

The CLI talks to a node over the same HTTP API as the SDK (stdlib ``urllib``: no event loop
for a one-shot request). Platform modules are imported inside the commands that need them, so
``conveyor --help`` and the client commands start fast.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Column, Table

from conveyor.cli import exits
from conveyor.frozen import frozen

PIPE_WIDTH = 10_000  # the width of a table written to a pipe or a file: as wide as it needs


def _width(stream: Any) -> int | None:
    """None (the terminal's, or $COLUMNS) on a terminal; else wide enough for any table, so a
    listing piped to grep or a file is not cut at rich's default of 80 columns."""
    if os.environ.get("COLUMNS") or (hasattr(stream, "isatty") and stream.isatty()):
        return None
    return PIPE_WIDTH


# soft_wrap: never break a task id or an API key across lines, even on a pipe.
console = Console(highlight=False, soft_wrap=True, width=_width(sys.stdout))
errors = Console(stderr=True, highlight=False, soft_wrap=True, width=_width(sys.stderr))

DEFAULT_URL = "http://127.0.0.1:7400"
DEFAULT_HOME = ".conveyor"
KEYS_FILE = "keys.json"
DEV_TENANT = "default"
REQUEST_TIMEOUT_S = 30.0

HomeOpt = Annotated[
    Path | None,
    typer.Option(
        "--home",
        envvar="CONVEYOR_HOME",
        help="Data directory of the node [default: ./.conveyor]",
        show_default=False,
    ),
]
UrlOpt = Annotated[str, typer.Option("--url", envvar="CONVEYOR_URL", help="Gateway URL")]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key",
        envvar="CONVEYOR_API_KEY",
        help="API key [default: the dev key in the home dir]",
        show_default=False,
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the raw JSON reply")]


class CliError(Exception):
    """A failure to report in one line (no traceback: it is not a bug), exiting with ``code``
    (``exits``)."""

    def __init__(self, message: str, code: int = exits.FAILED) -> None:
        super().__init__(message)
        self.code = code


def fail(message: str, code: int = exits.FAILED) -> typer.Exit:
    """Print ``message`` as one error line; the ``typer.Exit`` to raise, with ``code``."""
    errors.print(f"[bold red]error[/]: {message}", soft_wrap=True)  # one line, even in a log
    return typer.Exit(code)


def failed(exc: Exception) -> typer.Exit:
    """``fail`` for a ``CliError`` (its own code) or a ``ContractError`` raised while a command
    reads its options (3 for a NotFound, else 2: the input is wrong)."""
    from conveyor.errors import NotFound

    if isinstance(exc, CliError):
        return fail(str(exc), exc.code)
    return fail(str(exc), exits.NOT_FOUND if isinstance(exc, NotFound) else exits.USAGE)


def home_dir(home: Path | None) -> Path:
    return home if home is not None else Path(DEFAULT_HOME)


def dev_key(home: Path, *, app: str | None = None) -> str | None:
    """A key of tenant ``default`` in ``home/keys.json``, without creating one: a client key,
    or with ``app`` an agent key bound to that app (``conveyor agent``); a key with no role
    (made before roles) serves both."""
    try:
        doc = json.loads((home / KEYS_FILE).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    for key, entry in (doc.get("keys") or {}).items():
        if isinstance(entry, dict) and entry.get("tenant") == DEV_TENANT:
            role = entry.get("role")
            wanted = "client" if app is None else "agent"
            if role is None or (role == wanted and entry.get("app") == app):
                return str(key)
    return None


@frozen
class Remote:
    url: str
    api_key: str

    @classmethod
    def of(cls, url: str, api_key: str | None, home: Path | None) -> Remote:
        key = api_key or dev_key(home_dir(home))
        if not key:
            raise CliError(
                "no API key: pass --api-key, set CONVEYOR_API_KEY, or point --home at the "
                "directory of a node started with `conveyor node`/`conveyor dev`",
                exits.REFUSED,
            )
        return cls(url.rstrip("/"), key)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        query: dict[str, str] | None = None,
        timeout_s: float = REQUEST_TIMEOUT_S,
    ) -> Any:
        """The decoded JSON reply; ``CliError`` with the server's code and message on 4xx/5xx."""
        url = self.url + path + (f"?{urllib.parse.urlencode(query)}" if query else "")
        data = None if body is None else json.dumps(body).encode("utf-8")
        request = urllib.request.Request(url, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.api_key}")
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as reply:
                return json.loads(reply.read() or b"null")
        except urllib.error.HTTPError as exc:
            raise CliError(_describe_error(exc.code, exc.read()), exits.of_http(exc.code)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise CliError(
                f"cannot reach {self.url}: {reason}; is `conveyor node` running?",
                exits.UNAVAILABLE,
            ) from None


def _describe_error(status: int, raw: bytes) -> str:
    try:
        error = json.loads(raw)["error"]
        text = f"{error['code']} (HTTP {status}): {error['message']}"
    except (ValueError, KeyError, TypeError):
        return f"HTTP {status}: {raw[:200].decode('utf-8', 'replace')}"
    return text


def fmt_ms(ms: int | None) -> str:
    """Epoch milliseconds as local time, for tables."""
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="milliseconds")


def fmt_clock(ms: int | None, *, millis: bool = False) -> str:
    """Epoch milliseconds as local time for narrow tables: the time of day when it is today,
    else the date too."""
    if ms is None:
        return "-"
    when = datetime.fromtimestamp(ms / 1000)
    if when.date() != datetime.now().date():
        return when.strftime("%Y-%m-%d %H:%M")
    return when.isoformat(timespec="milliseconds" if millis else "seconds")[11:]


def fmt_took(ms: int) -> str:
    """A duration for tables: ``850 ms``, ``12.4 s``, ``3 min 05 s``."""
    if ms < 1_000:
        return f"{ms} ms"
    if ms < 60_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms // 60_000} min {ms % 60_000 // 1000:02d} s"


def plain_table(*columns: Column | str) -> Table:
    """A table for narrow terminals: no borders, one space between columns."""
    return Table(*columns, box=None, padding=(0, 1, 0, 0), pad_edge=False, header_style="bold")


def id_column(name: str) -> Column:
    """A table column for task ids: never wrapped or cut, so they can be copied."""
    return Column(name, no_wrap=True, min_width=32)


def print_json(value: Any) -> None:
    # Plain print, not rich: scripts pipe this into jq.
    print(json.dumps(value, indent=2, ensure_ascii=False))
