"""The ``conveyor`` command: one typer app, commands grouped by what they touch.

node, dev, agent                  long-running processes (serve.py)
enqueue, get, list, cancel, retry HTTP to a node (tasks.py)
schedule add|list|pause|resume|run|rm
                                  cron schedules over HTTP (schedules.py)
event send                        an event for a workflow's wait (workflows.py)
queue list|pause|resume           queues and their pause over HTTP (queues.py)
keys create|list                  API keys and their roles in the home's keys.json (keys.py)
codec-server                      the user's codec endpoint, for the dashboard (codec.py)
cluster status                    nodes, partitions, owners, epochs of a cluster on Kafka
ingest                            an ingest topic's router: Avro records to enqueues (ingest.py)
types list|show, schemas register|list|check
                                  task types and the schema registry (types.py, schemas.py)
log inspect|verify, docs          operator tools (tools.py)
projection rebuild                the Postgres snapshot (tools.py)
bench log|engine|fanout|fairness|cancel|e2e|projection|query|bulk|ingest
chaos kill9|soak|zombie|lost-replies|power-cut|fan-in|failover
                                  benchmarks and fault-injection runs: development tools of a
                                  checkout (devtools/, ``conveyor_devtools.cli``), added when
                                  that package is importable; else one line on how to get them
"""

from __future__ import annotations

from importlib.metadata import version as package_version
from typing import Annotated

import typer

from conveyor.cli import (
    cluster,
    codec,
    ingest,
    keys,
    queues,
    schedules,
    schemas,
    serve,
    tasks,
    tools,
    types,
    webhooks,
    workflows,
)
from conveyor.cli.common import CliError, fail
from conveyor.cli.exits import EPILOG, NOT_FOUND, REFUSED, USAGE
from conveyor.errors import ContractError, NotFound
from conveyor.process import tune_malloc

app = typer.Typer(
    name="conveyor",
    help="Durable background jobs for Python.",
    epilog=EPILOG,
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish
    pretty_exceptions_show_locals=False,
)
log_app = typer.Typer(help="Inspect and verify a node's log.", no_args_is_help=True)
docs_app = typer.Typer(help="Generated documentation.", no_args_is_help=True)
projection_app = typer.Typer(help="The Postgres query snapshot.", no_args_is_help=True)
schedule_app = typer.Typer(help="Cron schedules.", no_args_is_help=True)
keys_app = typer.Typer(help="API keys and their roles (keys.json).", no_args_is_help=True)
cluster_app = typer.Typer(help="A cluster of nodes on Kafka.", no_args_is_help=True)


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"conveyor {package_version('conveyor')}")
        raise typer.Exit()


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_print_version, is_eager=True, help="Print the version."
        ),
    ] = False,
) -> None:
    """Durable background jobs for Python."""


app.command()(serve.node)
app.command()(serve.dev)
app.command()(serve.agent)
app.command()(tasks.enqueue)
app.command()(tasks.get)
app.command("list")(tasks.list_tasks)
app.command()(tasks.cancel)
app.command()(tasks.retry)
schedule_app.command("add")(schedules.add)
schedule_app.command("list")(schedules.list_schedules)
schedule_app.command("pause")(schedules.pause)
schedule_app.command("resume")(schedules.resume)
schedule_app.command("run")(schedules.run)
schedule_app.command("rm")(schedules.rm)
keys_app.command("create")(keys.create)
keys_app.command("list")(keys.list_keys)
log_app.command("inspect")(tools.log_inspect)
log_app.command("verify")(tools.log_verify)
projection_app.command("rebuild")(tools.projection_rebuild)
docs_app.command("lifecycle")(tools.docs_lifecycle)
app.add_typer(log_app, name="log")
app.add_typer(docs_app, name="docs")
app.add_typer(projection_app, name="projection")
app.add_typer(schedule_app, name="schedule")
app.add_typer(keys_app, name="keys")
cluster_app.command("status")(cluster.status)
app.add_typer(cluster_app, name="cluster")
app.add_typer(types.app, name="types")
app.add_typer(schemas.app, name="schemas")
webhooks.register(app)
ingest.register(app)
workflows.register(app)  # event send
queues.register(app)  # queue list|pause|resume
app.command("codec-server")(codec.codec_server)


# -- bench and chaos: the checkout's devtools (devtools/), not part of the conveyor package ----


def _not_installed(group: str, what: str) -> None:
    """Stand in for a dev-tools group when ``conveyor_devtools`` is not installed: whatever
    follows ``conveyor <group>`` (``--help`` included) is one line on stderr, exit status 2."""

    def missing(ctx: typer.Context) -> None:
        raise fail(
            f"conveyor {group} is a development tool of a Conveyor checkout, not part of the "
            "conveyor package: in a checkout, `make dev` or `make test` sets up .venv with it, "
            "or run `pip install -e devtools` there",
            USAGE,
        )

    app.command(
        group,
        help=f"{what} (a development tool of a checkout: not installed)",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
        add_help_option=False,
    )(missing)


try:
    from conveyor_devtools.cli import bench_app, chaos_app
except ModuleNotFoundError as exc:
    if exc.name != "conveyor_devtools":
        raise  # installed but broken: say so, with the traceback
    _not_installed("bench", "Benchmarks")
    _not_installed("chaos", "Fault-injection runs")
else:
    app.add_typer(bench_app, name="bench")
    app.add_typer(chaos_app, name="chaos")


def main() -> None:
    """The console script. A ``CliError`` from any command (a refused request, no API key) or a
    ``ContractError`` (what it was asked cannot be done: a data directory another node holds)
    is one line on stderr and its exit status (``exits``: a CliError's own; 3 for a NotFound,
    else 4), never a traceback. So is a part used without the extra that installs it (2, the
    usage status: ``conveyor node needs the server extra: pip install 'conveyor[server]'``)."""
    tune_malloc()
    try:
        app()
    except CliError as exc:
        fail(str(exc))  # prints the line
        raise SystemExit(exc.code) from None
    except ContractError as exc:
        fail(str(exc))
        raise SystemExit(NOT_FOUND if isinstance(exc, NotFound) else REFUSED) from None
    except ModuleNotFoundError as exc:  # a part used without its extra (conveyor.extras)
        import sys

        from rich.markup import escape

        from conveyor import extras

        said = (
            exc
            if isinstance(exc, extras.MissingExtra)
            else extras.missing(exc, _command(sys.argv[1:]))
        )
        if said is None:
            raise  # no extra installs it: a broken install or a bug, shown with its traceback
        fail(escape(str(said)))  # escaped: 'conveyor[server]' is no markup
        raise SystemExit(USAGE) from None


def _command(args: list[str]) -> str:
    """The command that ``args`` run, as typed: ``conveyor keys create``."""
    words, command = ["conveyor"], typer.main.get_command(app)
    for arg in args:
        subcommands = getattr(command, "commands", {})  # a group's, by name
        if arg not in subcommands:
            break
        words.append(arg)
        command = subcommands[arg]
    return " ".join(words)
