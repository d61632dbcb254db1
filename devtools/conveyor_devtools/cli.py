"""The ``conveyor bench`` and ``conveyor chaos`` commands: benchmarks and fault-injection runs.

They are development tools of a Conveyor checkout, not part of the ``conveyor`` package:
``conveyor.cli.main`` adds ``bench_app`` and ``chaos_app`` when this package is importable
(``pip install -e devtools``, which ``make`` does for the checkout's .venv) and otherwise says
how to get them. The work itself is imported inside each command, so ``conveyor --help`` stays
quick.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from conveyor.cli.common import JsonOpt, console, fail

bench_app = typer.Typer(help="Benchmarks.", no_args_is_help=True)
chaos_app = typer.Typer(help="Fault-injection runs.", no_args_is_help=True)


def bench_log(
    records: Annotated[int, typer.Option("--records", min=1)] = 200_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1)] = 8,
    writers: Annotated[int, typer.Option("--writers", min=1)] = 64,
    directory: Annotated[Path | None, typer.Option("--dir", help="Disk to test")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Group-commit throughput of the local log."""
    from conveyor_devtools.bench.log import bench_log as run

    with tempfile.TemporaryDirectory(prefix="conveyor-bench-log-", dir=directory) as tmp:
        result = asyncio.run(run(tmp, partitions=partitions, writers=writers, records=records))
    _print_result(result, as_json)


def bench_engine(
    tasks: Annotated[int, typer.Option("--tasks", min=1)] = 200_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1)] = 8,
    backlog: Annotated[int, typer.Option("--backlog", min=0, help="Enqueue-only run")] = 0,
    single: Annotated[
        int, typer.Option("--single", min=1, help="Tasks run one at a time, before and after")
    ] = 200,
    as_json: JsonOpt = False,
) -> None:
    """Enqueue -> lease -> complete through the engine, without HTTP.

    With ``--backlog N``: enqueue N tasks and dispatch none, to measure memory under backlog."""
    from conveyor_devtools.bench import bench_engine as run

    if backlog:
        result = asyncio.run(run(tasks=backlog, partitions=partitions, backlog=True))
    else:
        result = asyncio.run(run(tasks=tasks, partitions=partitions, single=single))
    _print_result(result, as_json)
    if not (result.get("all_succeeded") or result.get("all_enqueued")):
        raise fail(f"not every task ended as expected: {result['statuses']}")


def bench_fanout(
    children: Annotated[int, typer.Option("--children", min=1, max=10_000)] = 10_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1, max=64)] = 1,
    as_json: JsonOpt = False,
) -> None:
    """One workflow fans out to N no-op children and resumes, without HTTP: the fan-in must
    fire exactly once, with the results in child order. With several partitions, children
    past the first 1,000 spill over the other partitions."""
    from conveyor_devtools.bench.fanout import bench_fanout as run

    result = asyncio.run(run(children=children, partitions=partitions))
    _print_result(result, as_json)
    if not (result["fan_in_fired_once"] and result["results_in_order"]):
        raise fail("the fan-in did not fire exactly once with the results in order")


def bench_cancel(
    count: Annotated[int, typer.Option("--count", min=1, max=10_000)] = 50,
    as_json: JsonOpt = False,
) -> None:
    """Cancel N running cooperative tasks one by one on an idle ``conveyor dev`` (its agent
    heartbeats every 10 s): cancel request -> the handler saw ctx.cancelled, p50 / p99 (ms).
    Fails if p99 is 1,000 ms or more."""
    from conveyor_devtools.bench.cancel import P99_MS_MAX
    from conveyor_devtools.bench.cancel import bench_cancel as run

    result = asyncio.run(run(count=count))
    _print_result(result, as_json)
    if result["p99_ms"] is None or result["p99_ms"] >= P99_MS_MAX:
        raise fail(f"cancel p99 {result['p99_ms']} ms: not under {P99_MS_MAX} ms")


def bench_fairness(
    backlog: Annotated[int, typer.Option("--backlog", min=0)] = 200_000,
    b_tasks: Annotated[int, typer.Option("--b-tasks", min=1)] = 300,
    slots: Annotated[int, typer.Option("--slots", min=1)] = 16,
    partitions: Annotated[int, typer.Option("--partitions", min=1)] = 8,
    task_jitter: Annotated[
        float,
        typer.Option(
            "--task-jitter",
            min=0.0,
            max=0.99,
            help="Spread of task durations: each runs 10 ms x uniform(1-J, 1+J) (seeded)",
        ),
    ] = 0.0,
    as_json: JsonOpt = False,
) -> None:
    """Tenant B's schedule-to-start under tenant A's backlog, against an idle engine."""
    from conveyor_devtools.bench import bench_fairness as run

    result = asyncio.run(
        run(
            backlog=backlog,
            b_tasks=b_tasks,
            slots=slots,
            partitions=partitions,
            task_jitter=task_jitter,
        )
    )
    _print_result(result, as_json)


def bench_e2e(
    tasks: Annotated[int, typer.Option("--tasks", min=1)] = 50_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1)] = 8,
    agents: Annotated[int, typer.Option("--agents", min=1)] = 1,
    concurrency: Annotated[
        int | None,
        typer.Option("--concurrency", min=1, help="Guests per agent [default: the agent's, 8]"),
    ] = None,
    prefetch: Annotated[
        int | None,
        typer.Option(
            "--prefetch",
            min=0,
            help="Leases an agent holds beyond its guests [default: the agent's, adapted]",
        ),
    ] = None,
    single: Annotated[int, typer.Option("--single", min=1, help="Single enqueues timed")] = 500,
    concurrent: Annotated[
        int, typer.Option("--concurrent", min=1, help="Single enqueues from 16 callers at once")
    ] = 4_000,
    idle: Annotated[int, typer.Option("--idle", min=1, help="Idle starts timed")] = 200,
    in_process: Annotated[
        bool, typer.Option("--in-process", help="Agents run handlers on threads, not guests")
    ] = False,
    kafka: Annotated[
        bool,
        typer.Option(
            "--kafka",
            help="On local Kafka brokers started for the run (1, or 3 for --nodes 2 or more)",
        ),
    ] = False,
    nodes: Annotated[
        int, typer.Option("--nodes", min=1, max=8, help="With --kafka: nodes of the cluster")
    ] = 1,
    compare_local: Annotated[
        bool,
        typer.Option("--compare-local", help="With --kafka: the local log too, in the same run"),
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """The product end to end: a real node and agent as subprocesses, driven over HTTP.

    Throughput (batch enqueue -> guests -> SUCCEEDED), single-enqueue latency (one caller,
    then 16 at once) and idle schedule-to-start; CPU per task of each process. With --kafka,
    on a cluster of --nodes nodes (--agents agents each) on local brokers."""
    from conveyor_devtools.bench.e2e import bench_e2e as run

    if not kafka and (nodes != 1 or compare_local):
        raise fail("--nodes and --compare-local are options of a run on Kafka: add --kafka")
    result = asyncio.run(
        run(
            tasks=tasks,
            partitions=partitions,
            agents=agents,
            concurrency=concurrency,
            prefetch=prefetch,
            single=single,
            concurrent=concurrent,
            idle=idle,
            in_process=in_process,
            kafka_nodes=nodes if kafka else None,
            compare_local=compare_local,
        )
    )
    _print_result(result, as_json)


def _print_result(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result))
        return
    table = Table("metric", "value")
    for name, value in result.items():
        table.add_row(name, str(value))
    console.print(table)


def _judge(result: dict[str, Any], as_json: bool) -> None:
    """Print a fault run's figure; exit 1 unless it is valid."""
    _print_result(result, as_json)
    if result["valid"] is not True:
        raise typer.Exit(1)


def bench_projection(
    tasks: Annotated[int, typer.Option("--tasks", min=1)] = 50_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1)] = 8,
    dsn: Annotated[str | None, typer.Option("--postgres-dsn", help="External server")] = None,
    lag_tasks: Annotated[int, typer.Option("--lag-tasks", min=8)] = 10_000,
    rate: Annotated[float, typer.Option("--rate", min=1.0, help="Lag run events/s")] = 25_000,
    as_json: JsonOpt = False,
) -> None:
    """Events/s from the events log into the Postgres snapshot (five events a task), then the
    projection's lag behind a log written at ``--rate`` events/s when that run ends."""
    from conveyor_devtools.bench.projection import bench_projection as run

    result = run(tasks=tasks, partitions=partitions, dsn=dsn, lag_tasks=lag_tasks, rate=rate)
    _print_result(asyncio.run(result), as_json)


def bench_query(
    rows: Annotated[int, typer.Option("--rows", min=1_000)] = 1_000_000,
    repeats: Annotated[int, typer.Option("--repeats", min=1, help="Timed runs per filter")] = 40,
    dsn: Annotated[
        str | None, typer.Option("--postgres-dsn", help="A scratch database (emptied)")
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """List-query p50/p99 per filter over ``--rows`` task rows COPYed into the snapshot."""
    from conveyor_devtools.bench.query import bench_query as run

    _print_result(asyncio.run(run(rows=rows, repeats=repeats, dsn=dsn)), as_json)


def bench_bulk(
    tasks: Annotated[int, typer.Option("--tasks", min=1_000)] = 1_000_000,
    partitions: Annotated[int, typer.Option("--partitions", min=1)] = 8,
    as_json: JsonOpt = False,
) -> None:
    """A bulk cancel by filter over ``--tasks`` tasks on a real node, and API latency meanwhile."""
    from conveyor_devtools.bench.bulk import bench_bulk as run

    _print_result(asyncio.run(run(tasks=tasks, partitions=partitions)), as_json)


def chaos_kill9(
    seconds: Annotated[float, typer.Option("--seconds", min=1, help="Load under faults")] = 90.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Default: random, printed")] = None,
    clients: Annotated[int, typer.Option("--clients", min=1)] = 6,
    rate: Annotated[float, typer.Option("--rate", min=1, help="Enqueues/s, all clients")] = 80.0,
    agents: Annotated[int, typer.Option("--agents", min=1)] = 1,
    home: Annotated[Path | None, typer.Option("--keep", help="Keep the run's files here")] = None,
    scenario: Annotated[
        str, typer.Option("--scenario", help="p1 | p4 (crash loops) | p5 (failpoint) | p6")
    ] = "p1",
    as_json: JsonOpt = False,
) -> None:
    """P1 (and P4, P5, P6 with --scenario): kill -9 under load; check no lost acks, no
    phantoms, one terminal state. Prints the run's figure; exits 1 unless
    valid."""
    _chaos_run(scenario, seconds, seed, clients, rate, agents, home, as_json)


def chaos_soak(
    minutes: Annotated[float, typer.Option("--minutes", min=0.1, help="Load under faults")] = 30,
    seed: Annotated[int | None, typer.Option("--seed", help="Default: random, printed")] = None,
    agents: Annotated[int, typer.Option("--agents", min=1)] = 2,
    home: Annotated[Path | None, typer.Option("--keep", help="Keep the run's files here")] = None,
    as_json: JsonOpt = False,
) -> None:
    """The long opt-in soak: every kill -9 fault mixed (node, agents, guests, crash loops,
    the lease-delivery failpoint) for --minutes, then the same checks as kill9."""
    _chaos_run("soak", minutes * 60, seed, 6, 80.0, agents, home, as_json)


def _chaos_run(
    name: str,
    seconds: float,
    seed: int | None,
    clients: int,
    rate: float,
    agents: int,
    home: Path | None,
    as_json: bool,
) -> None:
    import random

    from conveyor_devtools.chaos.runner import SCENARIOS, run_kill9, scenario

    if name not in SCENARIOS:
        raise fail(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}")
    config = scenario(
        name,
        seconds=seconds,
        seed=random.randrange(2**31) if seed is None else seed,
        clients=clients,
        rate=rate,
        agents=agents,
        home=home,
        drain_s=max(60.0, seconds / 10),
    )
    result = asyncio.run(run_kill9(config))
    _judge(result, as_json)


def chaos_zombie(
    tasks: Annotated[int, typer.Option("--tasks", min=1, help="Tasks in the batch")] = 80,
    sleep_ms: Annotated[int, typer.Option("--sleep-ms", min=0, help="Handler time")] = 300,
    pause_leases: Annotated[
        float, typer.Option("--pause-leases", min=0.1, help="Below 0.6: N1, no lease may lapse")
    ] = 3.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Default: random, printed")] = None,
    home: Annotated[Path | None, typer.Option("--keep", help="Keep the run's files here")] = None,
    as_json: JsonOpt = False,
) -> None:
    """P2: SIGSTOP an agent and its guests past its lease, let another agent finish its
    tasks, SIGCONT it; check every late op of the zombie is rejected and each task has one
    terminal state. With a pause shorter than the lease (N1): no lease may lapse. Prints the
    run's figure; exits 1 unless valid."""
    import random

    from conveyor_devtools.chaos.zombie import ZombieConfig, run_zombie

    config = ZombieConfig(
        tasks=tasks,
        sleep_ms=sleep_ms,
        pause_leases=pause_leases,
        seed=random.randrange(2**31) if seed is None else seed,
        home=home,
    )
    result = asyncio.run(run_zombie(config))
    _judge(result, as_json)


def chaos_power_cut(
    runs: Annotated[int, typer.Option("--runs", min=1, help="Power cuts, one node each")] = 12,
    clients: Annotated[int, typer.Option("--clients", min=1, help="Concurrent enqueuers")] = 4,
    seed: Annotated[int | None, typer.Option("--seed", help="Default: random, printed")] = None,
    home: Annotated[Path | None, typer.Option("--keep", help="Keep the runs' files here")] = None,
    as_json: JsonOpt = False,
) -> None:
    """S1: cut the power of a node's log files under concurrent enqueues (unsynced writes
    lost, the last one torn), restart on what the disk kept, with the partition state kept or
    rebuilt; check no acknowledged enqueue is lost, no task appears from nowhere, and retried
    keys meet their twins. Prints the run's figure; exits 1 unless
    valid."""
    import random

    from conveyor_devtools.chaos.powercut import PowerCutConfig, run_power_cut

    config = PowerCutConfig(
        runs=runs,
        clients=clients,
        seed=random.randrange(2**31) if seed is None else seed,
        home=home,
    )
    result = asyncio.run(run_power_cut(config))
    _judge(result, as_json)


def chaos_lost_replies(
    tasks: Annotated[int, typer.Option("--tasks", min=1, help="Keys to enqueue")] = 300,
    p: Annotated[float, typer.Option("--p", min=0.0, max=0.9, help="Reply loss rate")] = 0.2,
    seed: Annotated[int | None, typer.Option("--seed", help="Default: random, printed")] = None,
    home: Annotated[Path | None, typer.Option("--keep", help="Keep the run's files here")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Test 7: proxies lose the replies of enqueues and of agents' completions after the node
    answered; clients and agents retry; check one task per key, one terminal state, idempotent
    completions. Prints the run's figure; exits 1 unless valid."""
    import random

    from conveyor_devtools.chaos.lost import LostConfig, run_lost_replies

    config = LostConfig(
        tasks=tasks,
        p=p,
        seed=random.randrange(2**31) if seed is None else seed,
        home=home,
    )
    result = asyncio.run(run_lost_replies(config))
    _judge(result, as_json)


def chaos_fan_in(
    workflows: Annotated[int, typer.Option("--workflows", min=1, help="Fan-in workflows")] = 6,
    most: Annotated[
        int, typer.Option("--children", min=2, help="Most children of one workflow")
    ] = 1_500,
    seconds: Annotated[float, typer.Option("--seconds", min=1.0, help="Of faults")] = 30.0,
    seed: Annotated[int | None, typer.Option("--seed", help="Default: random, printed")] = None,
    home: Annotated[Path | None, typer.Option("--keep", help="Keep the run's files here")] = None,
    as_json: JsonOpt = False,
) -> None:
    """W1: workflows fan out to children (some fail, some fan-outs spill across partitions)
    while the node, agents and guests are killed with -9; check each workflow's barrier fired
    once with every child's result in its slot, and each child ended as it should. Prints the
    run's figure; exits 1 unless valid."""
    import random

    from conveyor_devtools.chaos.fanin import FanInConfig, run_fan_in

    config = FanInConfig(
        workflows=workflows,
        children=(min(50, most), most),
        seconds=seconds,
        seed=random.randrange(2**31) if seed is None else seed,
        home=home,
    )
    result = asyncio.run(run_fan_in(config))
    _judge(result, as_json)


def chaos_failover(
    duration: Annotated[
        str, typer.Option("--duration", help="Load under faults: 60s, 2m (each fault once)")
    ] = "60s",
    seed: Annotated[int | None, typer.Option("--seed", help="Default: random, printed")] = None,
    session_s: Annotated[
        float,
        typer.Option("--session-timeout-s", min=3.0, help="The nodes' group session timeout"),
    ] = 4.0,
    home: Annotated[Path | None, typer.Option("--keep", help="Keep the run's files here")] = None,
    as_json: JsonOpt = False,
) -> None:
    """F1: three Kafka brokers, three nodes of one cluster and an agent each, under load:
    kill -9 of a node (restarted with its id and home), of a broker (restarted), and a
    SIGSTOP of a node past its session timeout (the zombie). Checks no lost acks, one terminal
    state, no record of a stale epoch in the log, the zombie stepping down, and reports the
    failover time. Prints the run's figure; exits 1 unless valid."""
    import random

    from conveyor.durations import to_ms
    from conveyor.errors import ContractError
    from conveyor_devtools.chaos.failover import FailoverConfig, run_failover

    try:
        seconds = to_ms(duration, field="--duration") / 1000
    except ContractError as exc:
        raise fail(str(exc)) from None
    if seconds <= 0:
        raise fail(f"--duration {duration!r}: give a duration above 0, such as 40s or 2m")
    config = FailoverConfig(
        seconds=seconds,
        seed=random.randrange(2**31) if seed is None else seed,
        session_s=session_s,
        home=home,
    )
    result = asyncio.run(run_failover(config))
    _judge(result, as_json)


def bench_ingest(
    records: Annotated[int, typer.Option("--records", min=1, help="Records produced")] = 20_000,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
    home: Annotated[
        Path | None, typer.Option("--home", help="Where the run keeps its node and broker")
    ] = None,
) -> None:
    """Ingest records/s through the router: a local broker, a node, Avro records produced
    first, then routed and enqueued."""
    from conveyor_devtools.bench.ingest import main as bench_main

    argv = ["--records", str(records)]
    argv += ["--json"] if as_json else []
    argv += ["--home", str(home)] if home is not None else []
    raise typer.Exit(bench_main(argv))


bench_app.command("log")(bench_log)
bench_app.command("engine")(bench_engine)
bench_app.command("fanout")(bench_fanout)
bench_app.command("fairness")(bench_fairness)
bench_app.command("cancel")(bench_cancel)
bench_app.command("e2e")(bench_e2e)
bench_app.command("projection")(bench_projection)
bench_app.command("query")(bench_query)
bench_app.command("bulk")(bench_bulk)
bench_app.command("ingest")(bench_ingest)
chaos_app.command("kill9")(chaos_kill9)
chaos_app.command("soak")(chaos_soak)
chaos_app.command("zombie")(chaos_zombie)
chaos_app.command("lost-replies")(chaos_lost_replies)
chaos_app.command("power-cut")(chaos_power_cut)
chaos_app.command("fan-in")(chaos_fan_in)
chaos_app.command("failover")(chaos_failover)
