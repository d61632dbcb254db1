"""Queue commands: ``queue list|pause|resume`` (HTTP to a running node, like tasks.py).

A pause is the partitions' state: a paused queue's tasks stay ENQUEUED and are leased to no
agent (enqueues are still accepted) until it is resumed, across restarts of the node.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated
from urllib.parse import quote

import typer
from rich.table import Table

from conveyor.cli.common import (
    DEFAULT_URL,
    HomeOpt,
    JsonOpt,
    KeyOpt,
    Remote,
    UrlOpt,
    console,
    print_json,
)

QueueArg = Annotated[str, typer.Argument(help="Queue name (of the key's tenant)")]


def list_queues(
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the queues: state, tasks by status, the oldest ready one, the delayed ones."""
    rows = Remote.of(url, api_key, home).call("GET", "/v1/queues")["queues"]
    if as_json:
        print_json(rows)
        return
    table = Table("queue", "state", "tasks", "oldest ready", "delayed", "finished/s (5m)")
    for q in rows:
        depth = ", ".join(f"{status} {n}" for status, n in sorted(q["depth"].items()))
        age = q.get("oldest_ready_age_ms")
        rate = q["windows"].get("300s", {}).get("finished_per_s", 0)
        table.add_row(
            q["queue"],
            "paused" if q.get("paused") else "running",
            depth or "-",
            "-" if age is None else f"{age / 1000:.1f} s",
            str(q.get("delayed", 0)),
            str(rate),
        )
    console.print(table)
    console.print(f"[dim]{len(rows)} queue(s)[/]")


def pause(
    queue: QueueArg,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Pause a queue: its tasks stay ENQUEUED, none is leased; enqueues are still accepted."""
    _post(queue, "pause", url, api_key, home)
    console.print(f"paused queue [bold]{queue}[/]")


def resume(
    queue: QueueArg,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Resume a paused queue: its ready tasks are dealt to agents again at once."""
    _post(queue, "resume", url, api_key, home)
    console.print(f"resumed queue [bold]{queue}[/]")


def _post(queue: str, verb: str, url: str, api_key: str | None, home: Path | None) -> None:
    Remote.of(url, api_key, home).call("POST", f"/v1/queues/{quote(queue, safe='')}/{verb}")


def register(app: typer.Typer) -> None:
    """The ``queue`` command group, on ``app``."""
    group = typer.Typer(help="Queues: list, pause, resume.", no_args_is_help=True)
    group.command("list")(list_queues)
    group.command("pause")(pause)
    group.command("resume")(resume)
    app.add_typer(group, name="queue")
