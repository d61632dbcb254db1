"""Schedule commands: ``schedule add|list|pause|resume|run|rm`` (HTTP to a running node, like
tasks.py)."""

from __future__ import annotations

import enum
import uuid
from pathlib import Path
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
from conveyor.cli.tasks import _json_option


class Overlap(enum.StrEnum):
    allow = "allow"
    skip = "skip"
    cancel_previous = "cancel_previous"


def add(
    schedule_id: Annotated[str, typer.Argument(help="Schedule id (replaces one of that id)")],
    cron: Annotated[str, typer.Option("--cron", help='Five fields, e.g. "*/5 * * * *"')],
    task_type: Annotated[str, typer.Option("--task", help="Registered task type to run")],
    app: Annotated[
        str, typer.Option("--app", envvar="CONVEYOR_APP", help="App the task type belongs to")
    ],
    payload: Annotated[str, typer.Option("--payload", help="JSON payload")] = "null",
    timezone: Annotated[
        str, typer.Option("--timezone", help="IANA zone the expression is read in")
    ] = "UTC",
    overlap: Annotated[
        Overlap, typer.Option("--overlap", help="While the previous firing's task runs")
    ] = Overlap.allow,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Create or replace a cron schedule."""
    task: dict[str, Any] = {"task_type": task_type, "app": app}
    task["payload"] = _json_option(payload, "--payload")
    body = {
        "schedule_id": schedule_id,
        "cron": cron,
        "timezone": timezone,
        "overlap": overlap.value,
        "task": task,
    }
    reply = Remote.of(url, api_key, home).call("POST", "/v1/schedules", body)
    if as_json:
        print_json(reply)
        return
    console.print(
        f"scheduled [bold]{reply['schedule_id']}[/] ({reply['cron']} {reply['timezone']}), "
        f"next firing {fmt_ms(reply['next_fire_ms'])}"
    )


def list_schedules(
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the schedules (of the key's tenant)."""
    reply = Remote.of(url, api_key, home).call("GET", "/v1/schedules")
    rows = reply["schedules"]
    if as_json:
        print_json(rows)
        return
    table = Table(
        "schedule_id",
        "cron",
        "timezone",
        "app",
        "task_type",
        "overlap",
        "state",
        "next",
        "last",
        "fired",
    )
    for s in rows:
        table.add_row(
            s["schedule_id"],
            s["cron"],
            s["timezone"],
            s["task"]["app"],
            s["task"]["task_type"],
            s["overlap"],
            "paused" if s.get("paused") else "active",
            fmt_ms(s["next_fire_ms"]),
            fmt_ms(s["last_fire_ms"]),
            str(s["fired"]),
        )
    console.print(table)
    console.print(f"[dim]{len(rows)} schedule(s)[/]")


def rm(
    schedule_id: Annotated[str, typer.Argument(help="Schedule id")],
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Delete a schedule (tasks it already enqueued are untouched)."""
    Remote.of(url, api_key, home).call("DELETE", f"/v1/schedules/{quote(schedule_id, safe='')}")
    console.print(f"deleted schedule [bold]{schedule_id}[/]")


def pause(
    schedule_id: Annotated[str, typer.Argument(help="Schedule id")],
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Pause a schedule: it keeps its definition and history but fires no more."""
    _pause_or_resume(schedule_id, "pause", url, api_key, home)
    console.print(f"paused schedule [bold]{schedule_id}[/]")


def resume(
    schedule_id: Annotated[str, typer.Argument(help="Schedule id")],
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Resume a paused schedule from its next occurrence (passed ones never fire)."""
    reply = _pause_or_resume(schedule_id, "resume", url, api_key, home)
    console.print(
        f"resumed schedule [bold]{schedule_id}[/], next firing {fmt_ms(reply['next_fire_ms'])}"
    )


def run(
    schedule_id: Annotated[str, typer.Argument(help="Schedule id")],
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run a schedule's task now, once; its next firing stays as it was."""
    path = f"/v1/schedules/{quote(schedule_id, safe='')}/run"
    body = {"idempotency_key": uuid.uuid4().hex}  # a resend of this request runs it once
    reply = Remote.of(url, api_key, home).call("POST", path, body)
    if as_json:
        print_json(reply)
        return
    console.print(f"ran schedule [bold]{schedule_id}[/]: task {reply['task_id']}")


def _pause_or_resume(
    schedule_id: str, verb: str, url: str, api_key: str | None, home: Path | None
) -> dict[str, Any]:
    path = f"/v1/schedules/{quote(schedule_id, safe='')}/{verb}"
    reply: dict[str, Any] = Remote.of(url, api_key, home).call("POST", path)
    return reply
