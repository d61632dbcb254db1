"""``conveyor keys create|list``: the API keys in a node's ``keys.json`` (its home directory).

A new key is printed once, alone on stdout (``KEY=$(conveyor keys create ...)``), and never
again: ``list`` shows each key by its first characters only. The node re-reads the file within
a second, so a new key works without a restart. The entry format and what each role may call
are in ``streams/gateway/auth.py``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from conveyor.cli.common import (
    HomeOpt,
    JsonOpt,
    console,
    errors,
    fail,
    home_dir,
    plain_table,
    print_json,
)

RoleOpt = Annotated[
    str,
    typer.Option(
        "--role",
        help="client: enqueue and read (/v1); agent: the worker protocol of one app (/worker)",
    ),
]
TenantOpt = Annotated[str, typer.Option("--tenant", help="The tenant the key acts for")]
KeyAppOpt = Annotated[
    str | None,
    typer.Option("--app", help="Agent keys: the one app it may serve", show_default=False),
]
KeyVersionOpt = Annotated[
    str | None,
    typer.Option(
        "--version",
        help="Agent keys: the one version of the app it may serve [default: any]",
        show_default=False,
    ),
]


def create(
    tenant: TenantOpt,
    role: RoleOpt,
    app: KeyAppOpt = None,
    version: KeyVersionOpt = None,
    home: HomeOpt = None,
) -> None:
    """Mint a key with a role, add it to keys.json in the home dir, and print it (only now)."""
    from conveyor.streams.gateway.auth import KEYS_FILE, create_key, parse_entry

    entry: dict[str, Any] = {"tenant": tenant, "role": role, "app": app, "version": version}
    try:
        grant = parse_entry("the new key", {k: v for k, v in entry.items() if v is not None})
        key = create_key(home_dir(home), grant)
    except ValueError as exc:
        raise fail(f"{exc} ({home_dir(home) / KEYS_FILE} is unchanged)") from None
    print(key)
    bound = f" for app {app!r}" + (f" version {version!r}" if version else "") if app else ""
    errors.print(
        f"created a key of tenant {tenant!r}, role {role}{bound}, in "
        f"{home_dir(home) / KEYS_FILE}; it is shown only this once"
    )


def list_keys(home: HomeOpt = None, as_json: JsonOpt = False) -> None:
    """List the keys in keys.json: first characters, tenant, role, app and version."""
    from conveyor.streams.gateway.auth import KEYS_FILE, parse_keys, shown
    from conveyor.streams.gateway.files import read_json

    path = home_dir(home) / KEYS_FILE
    try:
        grants = parse_keys(read_json(path) or {})
    except ValueError as exc:
        raise fail(f"{path}: {exc}") from None
    rows = [
        {
            "key": shown(key),
            "tenant": grant.tenant,
            "role": "client+agent (legacy)" if grant.legacy else "+".join(sorted(grant.roles)),
            "app": grant.app,
            "version": grant.version,
        }
        for key, grant in grants.items()
    ]
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print(f"no keys in {path}")
        return
    table = plain_table("key", "tenant", "role", "app", "version")
    for row in rows:
        table.add_row(*(row[c] or "-" for c in ("key", "tenant", "role", "app", "version")))
    console.print(table)
