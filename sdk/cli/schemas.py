"""``conveyor schemas register|list|check``: the node's schema registry (``/registry``, in
Confluent's REST conventions), for the key's tenant.

``register`` takes an Avro schema file for a subject, or ``--from module:app`` to derive the
payload and result schemas of every task type of an app (``conveyor.avro_schema``) and
register them under ``<app>.<task_type>-value`` and ``-result``. ``check`` says whether a
schema may be registered (the subject's compatibility level), without registering it.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import quote

import typer
from rich.table import Table

from conveyor.app import App
from conveyor.avro_schema import payload_schema, result_schema
from conveyor.cli.common import (
    DEFAULT_URL,
    CliError,
    HomeOpt,
    JsonOpt,
    KeyOpt,
    Remote,
    UrlOpt,
    console,
    print_json,
)

app = typer.Typer(help="The node's schema registry (Avro).", no_args_is_help=True)


def _subject_path(subject: str) -> str:
    return f"/registry/subjects/{quote(subject, safe='')}"


def _read(file: Path) -> str:
    try:
        text = file.read_text()
        json.loads(text)
    except (OSError, ValueError) as exc:
        raise CliError(f"{file}: not a JSON Avro schema ({exc})") from None
    return text


def _derived(spec: str) -> list[tuple[str, str]]:
    """(subject, schema) of every schema ``module:app`` derives."""
    module_name, _, attr = spec.partition(":")
    try:
        found = getattr(importlib.import_module(module_name), attr or "app")
    except (ImportError, AttributeError) as exc:
        raise CliError(f"--from {spec}: {exc}; give module:attribute of a conveyor App") from None
    if not isinstance(found, App):
        raise CliError(f"--from {spec}: {found!r} is not a conveyor App")
    out = []
    for name, task in sorted(found.tasks.items()):
        for part, schema in (("value", payload_schema(task)), ("result", result_schema(task))):
            if schema is not None:
                out.append((f"{found.name}.{name}-{part}", json.dumps(schema)))
    return out


@app.command("register")
def register(
    subject: Annotated[str | None, typer.Argument(help="Subject, e.g. shop.charge-value")] = None,
    file: Annotated[Path | None, typer.Option("--file", help="The Avro schema (JSON)")] = None,
    from_app: Annotated[
        str | None, typer.Option("--from", help="module:app: derive every type's schemas")
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Register a schema under a subject (or every schema an app's handlers derive)."""
    if from_app is not None:
        pairs = _derived(from_app)
    elif subject is not None and file is not None:
        pairs = [(subject, _read(file))]
    else:
        raise CliError("give SUBJECT --file schema.avsc, or --from module:app")
    remote = Remote.of(url, api_key, home)
    done = []
    for name, text in pairs:
        reply = remote.call("POST", f"{_subject_path(name)}/versions", {"schema": text})
        version = remote.call("POST", _subject_path(name), {"schema": text})["version"]
        done.append({"subject": name, "id": reply["id"], "version": version})
    if as_json:
        print_json(done)
        return
    for row in done:
        console.print(
            f"registered [bold]{row['subject']}[/] version {row['version']} (id {row['id']})"
        )
    if not done:
        console.print("no schema: no handler's payload or result is a dataclass or a TypedDict")


@app.command("list")
def list_subjects(
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The subjects of the key's tenant, with their latest version."""
    remote = Remote.of(url, api_key, home)
    rows: list[dict[str, Any]] = []
    for name in remote.call("GET", "/registry/subjects"):
        latest = remote.call("GET", f"{_subject_path(name)}/versions/latest")
        rows.append({k: latest[k] for k in ("subject", "version", "id")})
    if as_json:
        print_json(rows)
        return
    table = Table("subject", "latest version", "id")
    for row in rows:
        table.add_row(row["subject"], str(row["version"]), str(row["id"]))
    console.print(table)
    console.print(f"[dim]{len(rows)} subject(s)[/]")


@app.command("check")
def check(
    subject: Annotated[str, typer.Argument(help="Subject")],
    file: Annotated[Path, typer.Option("--file", help="The Avro schema (JSON)")],
    version: Annotated[str, typer.Option("--version", help="Against this version")] = "latest",
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Whether the schema may be registered under the subject; exits 1 if not."""
    path = f"/registry/compatibility/subjects/{quote(subject, safe='')}/versions/{version}"
    body = {"schema": _read(file)}
    reply = Remote.of(url, api_key, home).call("POST", path, body, query={"verbose": "true"})
    if as_json:
        print_json(reply)
    elif reply["is_compatible"]:
        console.print(f"compatible with [bold]{subject}[/] version {version}")
    else:
        console.print(f"[red]incompatible[/] with [bold]{subject}[/] version {version}:")
        for message in reply.get("messages", []):
            console.print(f"  {message}")
    if not reply["is_compatible"]:
        raise typer.Exit(1)
