"""Workflow commands: ``event send`` (HTTP to a running node, like tasks.py)."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import quote

import typer

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
from conveyor.cli.tasks import _json_option


def send_event(
    workflow_id: Annotated[str, typer.Argument(help="Workflow (task) id")],
    name: Annotated[str, typer.Argument(help="Event name, as in ctx.wait_for_event(name)")],
    payload: Annotated[str, typer.Option("--payload", help="JSON payload")] = "null",
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Send an event to a workflow: it wakes the workflow if it waits for that name, else it
    is kept for its next wait of that name."""
    body = {"name": name, "payload": _json_option(payload, "--payload")}
    path = f"/v1/workflows/{quote(workflow_id, safe='')}/events"
    reply = Remote.of(url, api_key, home).call("POST", path, body)
    if as_json:
        print_json(reply)
        return
    console.print(f"sent event [bold]{name}[/] to {workflow_id}: it is {reply['status']}")


def register(app: typer.Typer) -> None:
    """The ``event`` command group, on ``app``."""
    group = typer.Typer(help="Events for workflows (ctx.wait_for_event).", no_args_is_help=True)
    group.command("send")(send_event)
    app.add_typer(group, name="event")
