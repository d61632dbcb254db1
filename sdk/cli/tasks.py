"""Client commands: enqueue, get, list, cancel, retry (HTTP to a running node)."""

from __future__ import annotations

import json
import time
import uuid
from typing import Annotated, Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from conveyor.cli import exits
from conveyor.cli.common import (
    DEFAULT_URL,
    CliError,
    HomeOpt,
    JsonOpt,
    KeyOpt,
    Remote,
    UrlOpt,
    console,
    fail,
    failed,
    fmt_clock,
    fmt_ms,
    fmt_took,
    id_column,
    plain_table,
    print_json,
)
from conveyor.durations import to_ms
from conveyor.errors import ContractError

PAGE_MAX = 1_000
OPERATION_POLL_S = 0.25  # how often a followed bulk operation is asked how far it got


def enqueue(
    task_type: Annotated[str, typer.Argument(help="Registered task type")],
    app: Annotated[
        str, typer.Option("--app", envvar="CONVEYOR_APP", help="App the task type belongs to")
    ],
    payload: Annotated[str, typer.Option("--payload", help="JSON payload")] = "null",
    delay: Annotated[str | None, typer.Option("--delay", help="e.g. 10s, 5m, 1h30m")] = None,
    queue: Annotated[str | None, typer.Option("--queue")] = None,
    priority: Annotated[int | None, typer.Option("--priority", help="0..9")] = None,
    idempotency_key: Annotated[str | None, typer.Option("--idempotency-key")] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Enqueue one task."""
    try:
        body: dict[str, Any] = {"task_type": task_type, "app": app}
        body["payload"] = _json_option(payload, "--payload")
        if delay is not None:
            body["delay_ms"] = to_ms(delay, field="--delay")
        if queue is not None:
            body["queue"] = queue
        if priority is not None:
            body["priority"] = priority
        # Like the SDK: always send a key, so re-running a failed request cannot duplicate.
        body["idempotency_key"] = idempotency_key or f"cli-{uuid.uuid4().hex}"
        reply = Remote.of(url, api_key, home).call("POST", "/v1/tasks", body)
    except (CliError, ContractError) as exc:
        raise failed(exc) from None
    if as_json:
        print_json(reply)
    elif reply["created"]:
        console.print(f"enqueued [bold]{reply['task_id']}[/] ({reply['status']})")
    else:
        console.print(f"already enqueued: [bold]{reply['task_id']}[/] ({reply['status']})")


def _json_option(text: str, name: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        raise CliError(f"{name} is not JSON: {exc}", exits.USAGE) from None


def get(
    task_id: Annotated[str, typer.Argument(help="Task id")],
    wait: Annotated[
        str | None, typer.Option("--wait", help="Wait up to this long for a terminal state")
    ] = None,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Show a task and its attempts."""
    try:
        wait_ms = to_ms(wait, field="--wait") if wait else 0
        query = {"wait_ms": str(wait_ms)} if wait_ms else None
        task = Remote.of(url, api_key, home).call(
            "GET", f"/v1/tasks/{task_id}", query=query, timeout_s=30 + wait_ms / 1000
        )
    except (CliError, ContractError) as exc:
        raise failed(exc) from None
    if as_json:
        print_json(task)
        return
    fields = Table.grid(padding=(0, 2))
    for name in ("task_id", "app", "task_type", "queue", "priority", "status", "attempt"):
        fields.add_row(f"[dim]{name}[/]", str(task[name]))
    for name in ("created_ms", "run_at_ms", "finished_ms"):
        fields.add_row(f"[dim]{name[:-3]}[/]", fmt_ms(task[name]))
    for name in ("payload", "result", "checkpoint"):
        fields.add_row(f"[dim]{name}[/]", _short_json(task[name]))
    if task["error"]:
        fields.add_row("[dim]error[/]", f"{task['error']['class']}: {task['error']['message']}")
    console.print(fields)
    if task["attempts"]:
        console.print(_attempts_table(task["attempts"]))


def _attempts_table(attempts: list[dict[str, Any]]) -> Table:
    """One row per attempt that fits an 80-column terminal: when it started, how long it took,
    how it ended and why; error and worker fold rather than being cut."""
    table = plain_table()
    table.add_column("#", justify="right", no_wrap=True)
    table.add_column("started", no_wrap=True)
    table.add_column("took", justify="right", no_wrap=True)
    table.add_column("outcome", no_wrap=True)
    table.add_column("error", overflow="fold", ratio=2)
    table.add_column("worker", overflow="fold", ratio=1)
    for a in attempts:
        started, finished = a["started_ms"], a["finished_ms"]
        took = fmt_took(finished - started) if started is not None and finished else ""
        table.add_row(
            str(a["attempt"]),
            fmt_clock(started, millis=True),
            took,
            a["outcome"] or "running",
            _why(a["error"]),
            a["worker"] or "",
        )
    return table


def _why(error: dict[str, Any] | None) -> str:
    """An attempt's error class and the first line of its message."""
    if error is None:
        return ""
    first_line = (error["message"] or "").partition("\n")[0]
    return f"{error['class']}: {first_line[:200]}"


def _short_json(value: Any, limit: int = 120) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def list_tasks(
    status: Annotated[
        list[str] | None, typer.Option("--status", help="Repeat or comma-separate")
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue")] = None,
    task_type: Annotated[str | None, typer.Option("--task-type")] = None,
    payload: Annotated[
        list[str] | None,
        typer.Option(
            "--payload",
            metavar="FIELD=VALUE",
            help="Tasks whose payload has this top-level field and value; repeat to require "
            "several. VALUE is compared as JSON: 3, true, null are those, other text a string "
            "(quote it, '\"3\"', for the string 3). Hidden, encoded and blob payloads are not "
            "searchable",
        ),
    ] = None,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Rows to show")] = 50,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List tasks (of the key's tenant)."""
    query = {"status": ",".join(status or []), "queue": queue or "", "task_type": task_type or ""}
    query = {k: v for k, v in query.items() if v}
    query.update(_payload_query(payload or []))
    tasks: list[dict[str, Any]] = []
    remote = Remote.of(url, api_key, home)
    cursor: str | None = None
    may_trail = False
    # Pages may be short (the gateway bounds each scan): follow the cursor.
    while len(tasks) < limit:
        page_query = {**query, "limit": str(min(PAGE_MAX, limit - len(tasks)))}
        if cursor:
            page_query["cursor"] = cursor
        page = remote.call("GET", "/v1/tasks", query=page_query)
        tasks.extend(page["tasks"])
        may_trail = may_trail or bool(page.get("may_trail"))
        cursor = page["next_cursor"]
        if cursor is None:
            break
    if as_json:
        print_json(tasks)
        return
    console.print(_task_table(tasks))
    console.print(f"[dim]{len(tasks)} task(s)[/]")
    if may_trail:
        console.print(
            "[yellow]the query snapshot is behind the node: a task enqueued in the last "
            "seconds may be missing (`conveyor get ID` asks the node itself)[/]"
        )


def _payload_query(pairs: list[str]) -> dict[str, str]:
    """``--payload FIELD=VALUE`` options as the listing's ``payload.FIELD`` parameters (the
    node checks the names and reads the values)."""
    query: dict[str, str] = {}
    for pair in pairs:
        name, eq, value = pair.partition("=")
        if not eq or not name:
            raise typer.BadParameter(
                f"expected FIELD=VALUE, as --payload customer=acme; got {pair!r}",
                param_hint="--payload",
            )
        query[f"payload.{name}"] = value
    return query


def _task_table(tasks: list[dict[str, Any]]) -> Table:
    """A task list that fits an 80-column terminal: ids, states and times are never cut, long
    names fold. The task is ``app:type`` only when several apps show, and the queue column
    shows only when some task is not on the default queue."""
    apps = len({t["app"] for t in tasks}) > 1
    queues = any(t["queue"] != "default" for t in tasks)
    table = plain_table(id_column("task_id"))
    table.add_column("task", overflow="fold")
    if queues:
        table.add_column("queue", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("att", justify="right", no_wrap=True)
    table.add_column("created", no_wrap=True)
    for t in tasks:
        task = f"{t['app']}:{t['task_type']}" if apps else t["task_type"]
        queue = [t["queue"]] if queues else []
        created = fmt_clock(t["created_ms"])
        table.add_row(t["task_id"], task, *queue, t["status"], str(t["attempt"]), created)
    return table


def cancel(
    task_id: Annotated[str | None, typer.Argument(help="Task id")] = None,
    status: Annotated[
        list[str] | None,
        typer.Option("--status", help="filter: unfinished statuses; repeat or comma-separate"),
    ] = None,
    queue: Annotated[str | None, typer.Option("--queue")] = None,
    task_type: Annotated[str | None, typer.Option("--task-type")] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every unfinished task of the tenant: no filter")
    ] = False,
    reason: Annotated[str | None, typer.Option("--reason", help="filter: why, kept")] = None,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="filter: at most")] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="filter: follow the operation to its end")
    ] = True,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Cancel a task (a running one's handler sees ctx.cancelled within about a second), or
    every unfinished task the filter matches as a bulk operation that the node runs in the
    background."""
    remote = Remote.of(url, api_key, home)
    body = _bulk({"task_type": task_type, "queue": queue, "status": ",".join(status or [])}, limit)
    if task_id is not None:
        if body != {"filter": {}} or every:
            raise fail(
                "give a task id or a filter (--status, --queue, --task-type, --all)", exits.USAGE
            )
        reply = remote.call("POST", f"/v1/tasks/{task_id}/cancel")
        if as_json:
            print_json(reply)
        else:
            console.print(f"{reply['task_id']}: {reply['status']}")
        return
    if not body["filter"] and not every:
        raise fail(
            "give a task id, or a filter (--status, --queue, --task-type); --all cancels "
            "every unfinished task of the tenant",
            exits.REFUSED,
        )
    if reason is not None:
        body["reason"] = reason
    reply = remote.call("POST", "/v1/tasks:cancel", body)
    if as_json:
        print_json(reply)
    else:
        _follow(remote, reply["operation_id"], "bulk cancel", "canceled or asked to stop", wait)


def retry(
    task_ids: Annotated[list[str] | None, typer.Argument(help="FAILED task ids")] = None,
    task_type: Annotated[str | None, typer.Option("--task-type")] = None,
    queue: Annotated[str | None, typer.Option("--queue")] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every FAILED task of the tenant: no filter")
    ] = False,
    limit: Annotated[int | None, typer.Option("--limit", min=1, help="filter: at most")] = None,
    wait: Annotated[
        bool, typer.Option("--wait/--no-wait", help="filter: follow the operation to its end")
    ] = True,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-enqueue FAILED tasks as new tasks: the ids given now, or every match of the filter
    (every FAILED task with --all) as a bulk operation that the node runs in the background
    (followed with a progress bar, unless --no-wait or --json)."""
    body = _bulk({"task_type": task_type, "queue": queue}, limit)
    if task_ids:
        if body != {"filter": {}} or every:
            raise fail(
                "give FAILED task ids or a filter (--task-type, --queue, --all), not both",
                exits.USAGE,
            )
        body = {"task_ids": task_ids}
    elif not body["filter"] and not every:
        raise fail(
            "give FAILED task ids, or a filter (--task-type, --queue); --all retries every "
            "FAILED task of the tenant",
            exits.REFUSED,
        )
    remote = Remote.of(url, api_key, home)
    reply = remote.call("POST", "/v1/tasks:retry", body)
    if as_json:
        print_json(reply)
        return
    if "operation_id" in reply:
        _follow(remote, reply["operation_id"], "bulk retry", "re-enqueued", wait)
        return
    table = Table(id_column("failed task"), id_column("new task"))
    for row in reply["retried"]:
        table.add_row(row["task_id"], row["new_task_id"])
    console.print(table)
    console.print(f"[dim]{len(reply['retried'])} task(s) re-enqueued[/]")


def _bulk(flt: dict[str, str | None], limit: int | None) -> dict[str, Any]:
    """The body of a bulk operation by filter: the filter's given fields, and its limit."""
    body: dict[str, Any] = {"filter": {k: v for k, v in flt.items() if v}}
    if limit is not None:
        body["limit"] = limit
    return body


def _follow(remote: Remote, operation_id: str, what: str, changed: str, wait: bool) -> None:
    """Follow a bulk operation until it ends, with a progress bar, and say how many tasks it
    ``changed``; Ctrl-C stops following, not the operation."""
    path = f"/v1/operations/{operation_id}"
    if not wait:
        console.print(f"{what} {operation_id} started")
        console.print(f"[dim]progress: GET {path}[/]")
        return
    columns = (TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=console, transient=True) as bar:
            shown = bar.add_task(what, total=None)
            while True:
                op = remote.call("GET", path)
                bar.update(shown, total=op["matched"], completed=op["done"])
                if op["state"] != "running":
                    break
                time.sleep(OPERATION_POLL_S)
    except KeyboardInterrupt:
        console.print(f"{what} {operation_id} goes on in the background: GET {path}")
        raise typer.Exit(130) from None
    if op["state"] != "done":
        raise fail(f"{what} {operation_id} {op['state']}: {op['error']}")
    console.print(f"{what} {operation_id} done: {op['changed']} of {op['matched']} {changed}")
