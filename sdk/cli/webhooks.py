"""Webhook commands: ``webhooks create|list|delete|deliveries|redeliver`` (HTTP to a running
node, like tasks.py), and the node's webhook options (``--webhooks-*``, serve.py)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
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
    fmt_ms,
    plain_table,
    print_json,
)

if TYPE_CHECKING:
    from aiohttp import web

    from conveyor.streams.log.api import Log
    from conveyor.streams.webhooks.deliver import Settings

# -- the node's options ---------------------------------------------------------------------

WebhooksAllowPrivateOpt = Annotated[
    bool,
    typer.Option(
        "--webhooks-allow-private",
        help="Let webhooks go to loopback, link-local and private addresses [default: public "
        "addresses only; conveyor dev allows loopback]",
    ),
]
WebhooksRetryOpt = Annotated[
    float,
    typer.Option(
        "--webhooks-retry-s",
        min=1.0,
        help="How long a webhook delivery is retried before it is kept as failed",
    ),
]
WebhooksBackoffOpt = Annotated[
    float,
    typer.Option(
        "--webhooks-backoff-max-s",
        min=0.1,
        help="The longest wait between two attempts of a delivery (full jitter below it)",
    ),
]
RETRY_S_DEFAULT = 86_400.0
BACKOFF_MAX_S_DEFAULT = 600.0


def webhook_settings(
    allow_private: bool = False,
    retry_s: float = RETRY_S_DEFAULT,
    backoff_max_s: float = BACKOFF_MAX_S_DEFAULT,
    *,
    loopback: bool = False,
) -> Settings:
    from conveyor.streams.webhooks.addresses import AddressPolicy
    from conveyor.streams.webhooks.deliver import Settings

    backoff_max_ms = int(backoff_max_s * 1000)
    return Settings(
        policy=AddressPolicy(allow_private=allow_private, allow_loopback=loopback),
        retry_for_ms=int(retry_s * 1000),
        backoff_base_ms=min(1_000, backoff_max_ms),
        backoff_max_ms=backoff_max_ms,
    )


def attach_webhooks(
    app: web.Application, home: Path, events: Log, settings: Settings | None
) -> None:
    """Deliver the webhooks of ``home`` from ``events`` while ``app`` serves."""
    from conveyor.streams.webhooks.api import attach

    attach(app, home, events, settings or webhook_settings())


# -- the commands ---------------------------------------------------------------------------


def create(
    url_: Annotated[str, typer.Argument(metavar="URL", help="Where to POST the events")],
    events: Annotated[
        list[str],
        typer.Option("--event", help="An event type to send, e.g. task.failed (repeatable)"),
    ],
    task_types: Annotated[
        list[str] | None,
        typer.Option("--task-type", help="Only events of this task type (repeatable)"),
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a webhook; prints its signing secret, shown this once."""
    body: dict[str, Any] = {"url": url_, "events": events}
    if task_types:
        body["task_types"] = task_types
    reply = Remote.of(url, api_key, home).call("POST", "/v1/webhooks", body)
    if as_json:
        print_json(reply)
        return
    console.print(f"webhook [bold]{reply['webhook_id']}[/] -> {reply['url']}")
    console.print(f"  secret  {reply['secret']}  (shown once: keep it to verify signatures)")


def list_webhooks(
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List the webhooks of the key's tenant (never their secrets)."""
    rows = Remote.of(url, api_key, home).call("GET", "/v1/webhooks")["webhooks"]
    if as_json:
        print_json(rows)
        return
    table = plain_table("webhook_id", "url", "events", "task_types", "created")
    for w in rows:
        types = ",".join(w["task_types"]) if w["task_types"] else "*"
        table.add_row(
            w["webhook_id"], w["url"], ",".join(w["events"]), types, fmt_ms(w["created_ms"])
        )
    console.print(table)
    console.print(f"[dim]{len(rows)} webhook(s)[/]")


def delete(
    webhook_id: Annotated[str, typer.Argument(help="Webhook id")],
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Delete a webhook; its pending deliveries are dropped."""
    Remote.of(url, api_key, home).call("DELETE", f"/v1/webhooks/{quote(webhook_id, safe='')}")
    console.print(f"deleted webhook [bold]{webhook_id}[/]")


def deliveries(
    webhook_id: Annotated[str, typer.Argument(help="Webhook id")],
    status: Annotated[
        str | None, typer.Option("--status", help="pending, succeeded or failed")
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, max=1000)] = 50,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """A webhook's recent deliveries: status, attempts, last error."""
    query = {"limit": str(limit), **({"status": status} if status else {})}
    path = f"/v1/webhooks/{quote(webhook_id, safe='')}/deliveries"
    rows = Remote.of(url, api_key, home).call("GET", path, query=query)["deliveries"]
    if as_json:
        print_json(rows)
        return
    table = plain_table("delivery_id", "event", "status", "attempts", "updated", "last error")
    for d in rows:
        table.add_row(
            d["delivery_id"],
            d["event_type"],
            d["status"],
            str(d["attempts"]),
            fmt_ms(d["updated_ms"]),
            d["last_error"] or "",
        )
    console.print(table)


def redeliver(
    webhook_id: Annotated[str, typer.Argument(help="Webhook id")],
    delivery_id: Annotated[str, typer.Argument(help="Delivery id (from `webhooks deliveries`)")],
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
) -> None:
    """Send a delivery again (a failed one, or any other), with the same webhook-id."""
    path = (
        f"/v1/webhooks/{quote(webhook_id, safe='')}/deliveries/"
        f"{quote(delivery_id, safe='')}:redeliver"
    )
    Remote.of(url, api_key, home).call("POST", path)
    console.print(f"delivery [bold]{delivery_id}[/] of {webhook_id} is pending again")


def register(app: typer.Typer) -> None:
    """The ``webhooks`` command group, on ``app``."""
    group = typer.Typer(help="Webhooks: signed deliveries of task events.", no_args_is_help=True)
    group.command("create")(create)
    group.command("list")(list_webhooks)
    group.command("delete")(delete)
    group.command("deliveries")(deliveries)
    group.command("redeliver")(redeliver)
    app.add_typer(group, name="webhooks")
