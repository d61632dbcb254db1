"""Operator tools: ``log inspect|verify``, ``projection rebuild``, ``docs lifecycle``. The
benchmarks and fault runs (``bench``, ``chaos``) are the checkout's devtools
(``conveyor_devtools.cli``)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, assert_never

import typer
from rich.table import Table

from conveyor.cli.common import HomeOpt, JsonOpt, console, fail, fmt_ms, home_dir, id_column

SUMMARY_CHARS_MAX = 100

DirArg = Annotated[Path, typer.Argument(help="A node home, or a log directory inside one")]


def _log_root(path: Path) -> Path:
    """Accept the node's home as well as its ``log/`` directory; one that holds no log (no
    partition directory) fails, exit status 3, rather than verifying as an empty log."""
    from conveyor.cli import exits
    from conveyor.streams.log.local import list_partitions

    if (path / "node.json").exists() and (path / "log").is_dir():
        path = path / "log"
    if not path.is_dir():
        raise fail(f"{path} is not a directory", exits.NOT_FOUND)
    if not list_partitions(path):
        raise fail(
            f"no log in {path}: it has no partition directories (p0000, ...); give a node's "
            "home (with node.json and log/) or its log/ directory",
            exits.NOT_FOUND,
        )
    return path


def _summary(body: bytes, kind: str) -> str:
    """One line about a record body: what it asks for, not every field."""
    from conveyor.schemas import codec, types

    record = codec.decode_body(types.Envelope(kind=kind, epoch=0, ts_ms=0, key="", body=body))
    match record:
        case types.EnqueueTasks():
            specs = [codec.TASK_SPEC.decode(raw) for raw in record.tasks]
            kinds = sorted({f"{s.app}/{s.task_type}" for s in specs})
            text = f"{len(specs)} task(s): {', '.join(kinds)}"
        case types.CancelTasks() | types.RetryFailed():
            text = f"tenant {record.tenant}: {', '.join(record.task_ids)}"
        case types.GrantLeases():
            text = ", ".join(f"{r.agent_id}x{r.capacity}" for r in record.requests)
        case types.CompleteAttempts():
            text = ", ".join(f"{i.task_id}#{i.lease_id}={i.outcome.value}" for i in record.items)
        case types.SaveCheckpoints():
            text = ", ".join(f"{i.task_id}#{i.lease_id}" for i in record.items)
        case types.RecordSteps():
            text = ", ".join(
                f"{i.task_id}#{i.lease_id}:{i.op.value} {i.identity}" for i in record.items
            )
        case types.ExpireLeases():
            text = ", ".join(f"{i.task_id}#{i.lease_id}" for i in record.items)
        case types.FireTimers():
            # A SCHEDULE timer names "tenant NUL schedule id": show the NUL as a slash.
            text = ", ".join(
                f"{t.kind.value}:{t.task_id.replace(chr(0), '/')}" for t in record.timers
            )
        case types.AnnounceEpoch():
            text = f"leader {record.leader_id}"
        case types.UpsertSchedule():
            text = f"tenant {record.tenant}: {record.schedule_id} {record.cron!r} {record.timezone}"
        case types.DeleteSchedule():
            text = f"tenant {record.tenant}: {record.schedule_id}"
        case types.PauseSchedule():
            verb = "pause" if record.paused else "resume"
            text = f"tenant {record.tenant}: {verb} {record.schedule_id}"
        case types.PauseQueue():
            verb = "pause" if record.paused else "resume"
            text = f"tenant {record.tenant}: {verb} queue {record.queue}"
        case types.SendEvents():
            text = f"tenant {record.tenant}: " + ", ".join(
                f"{i.task_id} {i.name!r}" for i in record.items
            )
        case types.EnqueueChildren():
            text = f"{len(record.tasks)} child(ren) of {record.parent_id} {record.identity}"
        case types.LandChildren():
            text = ", ".join(f"{i.child_id}={i.status}" for i in record.items)
        case types.RegisterTypes():
            names = ", ".join(d.task_type for d in record.types)
            text = f"tenant {record.tenant}: app {record.app} {record.version}: {names}"
        case types.RegisterSchema():
            text = f"tenant {record.tenant}: subject {record.subject}"
        case types.DeleteSchemas():
            what = "every version" if record.version is None else f"version {record.version}"
            text = f"tenant {record.tenant}: subject {record.subject} {what}"
        case types.SetCompatibility():
            text = f"tenant {record.tenant}: {record.subject or '(default)'} {record.level}"
        case _:
            assert_never(record)
    return text if len(text) <= SUMMARY_CHARS_MAX else text[: SUMMARY_CHARS_MAX - 3] + "..."


def _row(partition: int, offset: int, payload: bytes) -> dict[str, Any]:
    from conveyor.schemas import codec

    row: dict[str, Any] = {"partition": partition, "offset": offset, "bytes": len(payload)}
    try:
        env = codec.decode_envelope(payload)
        row.update(kind=env.kind, epoch=env.epoch, ts_ms=env.ts_ms, key=env.key)
        row["summary"] = _summary(env.body, env.kind)
    except (codec.RecordDecodeError, codec.NewerRecord) as exc:
        row.update(kind="?", summary=f"undecodable: {exc}")
    return row


def log_inspect(
    directory: DirArg,
    partition: Annotated[int | None, typer.Option("--partition", min=0)] = None,
    from_offset: Annotated[int, typer.Option("--from", min=0, help="First offset")] = 0,
    limit: Annotated[int, typer.Option("--limit", min=1, help="Records to show")] = 100,
    as_json: JsonOpt = False,
) -> None:
    """Print the records of a log, decoded."""
    from conveyor.streams.log.api import LogCorruption
    from conveyor.streams.log.tools import inspect

    rows: list[dict[str, Any]] = []
    try:
        for p, offset, payload in inspect(_log_root(directory), partition, from_offset, limit):
            rows.append(_row(p, offset, payload))
    except LogCorruption as exc:
        _print_rows(rows, as_json)
        raise fail(str(exc)) from None
    _print_rows(rows, as_json)


def _print_rows(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        for row in rows:
            print(json.dumps(row, ensure_ascii=False))
        return
    table = Table("p", "offset", "kind", "epoch", "ts", id_column("key"), "summary")
    for r in rows:
        table.add_row(
            str(r["partition"]),
            str(r["offset"]),
            r["kind"],
            str(r.get("epoch", "")),
            fmt_ms(r.get("ts_ms")),
            r.get("key", ""),
            r["summary"],
        )
    console.print(table)


def log_verify(directory: DirArg, as_json: JsonOpt = False) -> None:
    """Check every frame of a log; exit 1 at the first corrupt one."""
    from conveyor.streams.log.tools import verify

    report = verify(_log_root(directory))
    if as_json:
        print(
            json.dumps(
                {
                    "ok": report.ok,
                    "records": report.records,
                    "bad": None if report.bad is None else vars(report.bad),
                }
            )
        )
    else:
        table = Table("partition", "start", "end", "records", "segments", "fence", "torn tail")
        for p in report.partitions:
            torn = p.torn_tail.reason if p.torn_tail else ""
            table.add_row(
                *map(
                    str, (p.partition, p.start_offset, p.end_offset, p.records, p.segments, p.fence)
                ),
                torn,
            )
        console.print(table)
    if report.bad is not None:
        bad = report.bad
        raise fail(f"partition {bad.partition} offset {bad.offset}: {bad.reason} ({bad.path})")
    if not as_json:
        console.print(f"[green]ok[/]: {report.records} records")


def docs_lifecycle() -> None:
    """Print the task lifecycle as a Mermaid state diagram."""
    from conveyor.streams.machine.transitions import mermaid

    print(mermaid())


def projection_rebuild(
    home: HomeOpt = None,
    dsn: Annotated[
        str | None,
        typer.Option("--postgres-dsn", envvar="CONVEYOR_POSTGRES_DSN", show_default=False),
    ] = None,
) -> None:
    """Truncate the Postgres snapshot and rebuild it from the events log (node stopped)."""
    from conveyor.streams.log.local import LocalLog
    from conveyor.streams.sinks.snapshot import Snapshot

    root = home_dir(home)
    meta = root / "node.json"
    if not meta.exists():
        raise fail(f"{root} is not a node home (no node.json)")
    partitions = int(json.loads(meta.read_text())["partitions"])

    async def main() -> int:
        events = await LocalLog.open(root / "events", partitions)
        try:
            snapshot = await Snapshot.open(root, events, dsn=dsn)
            try:
                return await snapshot.rebuild()
            finally:
                await snapshot.close()
        finally:
            await events.close()

    count = asyncio.run(main())
    console.print(f"[green]rebuilt[/]: {count} events projected")
