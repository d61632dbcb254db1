"""``conveyor types list|show``: the task types a node knows, their defaults and where each
definition came from (HTTP to a running node, like tasks.py)."""

from __future__ import annotations

from typing import Annotated, Any
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
    fmt_ms,
    print_json,
)

app = typer.Typer(help="Task types the node knows (registered by agents).", no_args_is_help=True)


def _origin(t: dict[str, Any]) -> str:
    origin = t.get("origin") or {}
    deploy = origin.get("deploy")
    text = f"version {origin.get('version') or '?'}"
    return text + (f", deploy {deploy}" if deploy is not None else "")


@app.command("list")
def list_types(
    app_name: Annotated[str | None, typer.Option("--app", help="Only this app's types")] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the task types of the key's tenant."""
    rows = Remote.of(url, api_key, home).call("GET", "/v1/task-types")["task_types"]
    rows = [t for t in rows if app_name is None or t["app"] == app_name]
    if as_json:
        print_json(rows)
        return
    table = Table("app", "task_type", "queue", "priority", "attempts", "schema", "from", "state")
    for t in rows:
        d = t["defaults"]
        table.add_row(
            t["app"],
            t["task_type"],
            str(d.get("queue", "default")),
            str(d.get("priority", 0)),
            str(d.get("attempts_max", "")),
            "" if t["payload_schema_id"] is None else f"id {t['payload_schema_id']}",
            _origin(t),
            f"removed by {t['removed_by']}" if t["removed_by"] else "served",
        )
    console.print(table)
    console.print(f"[dim]{len(rows)} task type(s)[/]")


@app.command("show")
def show(
    app_name: Annotated[str, typer.Argument(help="App")],
    task_type: Annotated[str, typer.Argument(help="Task type")],
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One task type: its defaults, schemas and the registration it came from."""
    path = f"/v1/task-types/{quote(app_name, safe='')}/{quote(task_type, safe='')}"
    t = Remote.of(url, api_key, home).call("GET", path)
    if as_json:
        print_json(t)
        return
    console.print(f"[bold]{t['app']}.{t['task_type']}[/] ({_origin(t)})")
    registered = (t.get("origin") or {}).get("registered_ms")
    if registered is not None:
        console.print(f"  registered {fmt_ms(registered)}")
    for name, value in sorted(t["defaults"].items()):
        console.print(f"  {name}: {value}")
    for part in ("payload", "result"):
        schema_id = t[f"{part}_schema_id"]
        if schema_id is not None:
            console.print(
                f"  {part} schema: id {schema_id} (subject {t['app']}.{t['task_type']}-"
                f"{'value' if part == 'payload' else 'result'})"
            )
    if t["removed_by"]:
        console.print(f"  removed by version {t['removed_by']}")
