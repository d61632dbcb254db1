"""``conveyor node``, ``conveyor dev`` and ``conveyor agent``: the long-running commands.

Shutdown on SIGINT/SIGTERM: stop accepting requests, cut in-flight ones after a short grace,
stop the agent (dev), then stop the node. Every acknowledged enqueue is already durable in the
log, so a shutdown (or a kill -9) loses nothing a client was told about.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import importlib
import os
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.markup import escape

from conveyor import extras, logs
from conveyor.cli import dev_loop, redact
from conveyor.cli.common import (
    DEFAULT_URL,
    HomeOpt,
    KeyOpt,
    UrlOpt,
    console,
    dev_key,
    fail,
    home_dir,
)
from conveyor.cli.dev_loop import DevOptions
from conveyor.cli.ingest import TaskEventsOpt, attach_task_events, with_task_events
from conveyor.cli.webhooks import (
    BACKOFF_MAX_S_DEFAULT,
    RETRY_S_DEFAULT,
    WebhooksAllowPrivateOpt,
    WebhooksBackoffOpt,
    WebhooksRetryOpt,
    attach_webhooks,
    webhook_settings,
)
from conveyor.frozen import frozen

if TYPE_CHECKING:
    from conveyor.store.blobs import Blobs
    from conveyor.streams.cluster import ClusterMember
    from conveyor.streams.cluster.signing import ClusterSecret
    from conveyor.streams.node import Node

AGENT_MODULE = "conveyor.agents.host"

HostOpt = Annotated[str, typer.Option("--host", help="Interface to bind")]
PortOpt = Annotated[int, typer.Option("--port", min=0, max=65535, help="0 picks a free port")]
PartitionsOpt = Annotated[
    int | None,
    typer.Option(
        "--partitions", min=1, max=4096, help="Fixed when the home is created [default: 8]"
    ),
]
LogLevelOpt = Annotated[str, typer.Option("--log-level", help="debug, info, warning, error")]
LogJsonOpt = Annotated[
    bool,
    typer.Option(
        "--log-json",
        help="Log one JSON object a line, the agent's guests too; a handler's records carry its "
        "task_id, attempt and task_type [also: CONVEYOR_LOG_JSON=1]",
    ),
]
AppRefOpt = Annotated[str, typer.Option("--app", help="The App to run, as module:attribute")]
ConcurrencyOpt = Annotated[int, typer.Option("--concurrency", min=1, help="Tasks at once")]
DsnOpt = Annotated[
    str | None,
    typer.Option(
        "--postgres-dsn",
        envvar="CONVEYOR_POSTGRES_DSN",
        help="External PostgreSQL for the query snapshot [default: a private one in the home]",
        show_default=False,
    ),
]
BlobsOpt = Annotated[
    str | None,
    typer.Option(
        "--blobs-url",
        envvar="CONVEYOR_BLOBS_URL",
        help="s3://bucket/prefix for large payloads (endpoint: AWS_ENDPOINT_URL) "
        "[default: a directory in the home]",
        show_default=False,
    ),
]
ProjectionOpt = Annotated[
    bool,
    typer.Option(
        "--projection/--no-projection",
        help="Run the Postgres query snapshot (listing, queues); off: list by RocksDB scans",
    ),
]
PrefetchOpt = Annotated[
    int | None,
    typer.Option(
        "--prefetch",
        min=0,
        help="Leases held beyond --concurrency, ready to run [default: adapted to the pace, "
        "about 0.5 s of work, at least --concurrency]",
        show_default=False,
    ),
]

AgentRunner = Callable[..., Awaitable[None]]

KafkaOpt = Annotated[
    str | None,
    typer.Option(
        "--kafka",
        envvar="CONVEYOR_KAFKA",
        help="Bootstrap servers (host:port,...) of the Kafka that holds the log; the node "
        "then leads the partitions the cluster assigns it [default: the local log in the home]",
        show_default=False,
    ),
]
NodeIdOpt = Annotated[
    str | None,
    typer.Option("--node-id", help="This node's name in the cluster (with --kafka), unique"),
]
ClusterOpt = Annotated[
    str,
    typer.Option("--cluster", help="The cluster's name: its topics are <name>-log, <name>-..."),
]
ClusterSecretOpt = Annotated[
    str | None,
    typer.Option(
        "--cluster-secret",
        envvar="CONVEYOR_CLUSTER_SECRET",
        help="With --kafka, required: a secret of 16+ characters, the same on every node; it "
        "signs the node's card in <name>-nodes, so no request is forwarded to a URL someone "
        "else wrote there. Prefer the environment variable (a command line is visible to "
        "other users of the machine)",
        show_default=False,
    ),
]
EventsKeepOpt = Annotated[
    str,
    typer.Option(
        "--events-keep",
        help="With --kafka: the events topic keeps at least this long (e.g. 7d, 12h), for "
        "GET /v1/events clients' cursors; older events go once every node's projector and "
        "webhook deliverer, and the task events relay, have read them",
    ),
]
SessionOpt = Annotated[
    float,
    typer.Option(
        "--session-timeout-s",
        min=3.0,
        help="With --kafka: a node silent this long is dead, its partitions move",
    ),
]
SnapshotsOpt = Annotated[
    str | None,
    typer.Option(
        "--snapshots",
        envvar="CONVEYOR_SNAPSHOTS",
        help="With --kafka: keep partition snapshots in this directory or s3://bucket/prefix "
        "(credentials from the AWS environment variables), so a node taking a partition "
        "restores it and replays only the tail, and trim the log below the oldest kept "
        "[default: off, the log is never trimmed]",
        show_default=False,
    ),
]
SnapshotIntervalOpt = Annotated[
    str, typer.Option("--snapshot-interval", help="With --snapshots: how often, e.g. 30s, 5m")
]
SnapshotKeepOpt = Annotated[
    int, typer.Option("--snapshot-keep", min=1, help="With --snapshots: how many to keep")
]
S3EndpointOpt = Annotated[
    str | None,
    typer.Option(
        "--s3-endpoint",
        help="With --snapshots s3://...: an S3-compatible endpoint URL [default: "
        "AWS_ENDPOINT_URL, else AWS]",
        show_default=False,
    ),
]

MetricsKeyOpt = Annotated[
    str | None,
    typer.Option(
        "--metrics-key",
        envvar="CONVEYOR_METRICS_KEY",
        help="The bearer token /metrics takes (Prometheus: authorization.credentials); prefer "
        "the environment variable, which ps does not show [default: none, /metrics answers "
        "401]",
        show_default=False,
    ),
]


class TenantLabels(enum.StrEnum):
    """``conveyor.streams.sinks.metrics.TenantLabels``, as a choice of the command line."""

    on = "on"
    hashed = "hashed"
    off = "off"


TenantLabelsOpt = Annotated[
    TenantLabels,
    typer.Option(
        "--metrics-tenant-labels",
        help="How /metrics labels tenants: their names, a hash of them, or not at all",
    ),
]

SANDBOX_HELP = (
    "bwrap: guests run in bubblewrap as another user, without network, with the code read-only "
    "and rlimits; none: as the agent's user (trusted code only)"
)


class Sandbox(enum.StrEnum):
    bwrap = "bwrap"
    none = "none"


SandboxOpt = Annotated[Sandbox, typer.Option("--sandbox", help=SANDBOX_HELP)]
DevSandboxOpt = Annotated[
    Sandbox | None,
    typer.Option(
        "--sandbox",
        help=f"{SANDBOX_HELP} [default: bwrap if it works here, else none]",
        show_default=False,
    ),
]
AllowNetOpt = Annotated[
    bool,
    typer.Option(
        "--allow-net",
        help="Egress for this app's guests: they share the host's network (every host and port, "
        "127.0.0.1 too: bwrap cannot filter by host)",
    ),
]


def _setup_logging(level: str, log_json: bool = False) -> None:
    """Log to stderr, with API keys and Authorization values redacted (``redact.py``), as
    text or JSON (``conveyor.logs``); an agent started here passes JSON on to its guests."""
    as_json = logs.json_wanted(log_json)
    if as_json:
        os.environ[logs.LOG_JSON_ENV] = "1"
    logs.configure(level, as_json=as_json, stream=sys.stderr)
    redact.guard()


def _load_agent() -> AgentRunner:
    """``conveyor.agents.host.run_agent``, or a clear failure if this install has no agent."""
    try:
        module = __import__(AGENT_MODULE, fromlist=["run_agent"])
    except ModuleNotFoundError as exc:
        if exc.name not in (AGENT_MODULE, "conveyor.agents"):
            raise
        raise fail(
            f"the host agent ({AGENT_MODULE}) is not available in this installation; "
            "run `conveyor node` and start workers separately"
        ) from None
    runner: AgentRunner = module.run_agent
    return runner


def _check_app(app_ref: str) -> Any:
    """Import ``module:attribute`` now, so a typo fails in one line before anything starts;
    the object found (the App: its ``name`` picks the dev agent's key).

    The current directory goes first on ``sys.path`` (as with uvicorn and celery): the
    ``conveyor`` script's own directory is the venv's ``bin``, where no user module lives.
    """
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module_name, _, attr = app_ref.partition(":")
    if not module_name or not attr:
        raise fail(f"--app {app_ref!r}: expected module:attribute, e.g. shop.tasks:app")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except Exception as exc:
        from conveyor.agents.startup import import_failure

        raise fail(escape(f"--app {app_ref}: cannot load it: {import_failure(exc)}")) from None
    return found


def _check_import_path() -> None:
    """Fail now, naming it, if a folder named conveyor would shadow the package for the app
    (here, or in the guests: they import it with this process's path, the current directory
    first), before the app's import fails far from the cause."""
    from conveyor.agents.pool import import_path
    from conveyor.agents.startup import shadowing

    problem = shadowing(import_path())
    if problem is not None:
        raise fail(escape(problem))


def _stop_on_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)


def _banner(url: str, key: str, home: Path, *, dev: bool) -> None:
    """What the node serves and how to reach it. ``conveyor node`` shows only the first
    characters of the client key (its output goes to a supervisor's logs, read by others);
    ``conveyor dev`` runs on the developer's own machine and prints the dashboard's link with
    the key in its fragment (``#key=``): a browser never sends a fragment to the server, and
    the page takes it out of the address bar."""
    from conveyor.streams.gateway.auth import shown

    resolved = home.resolve()
    console.print("[bold green]Conveyor node ready[/]")
    console.print(f"  url      {url}")
    if dev:
        # Never folded: a link cut in two by a narrow terminal would not open.
        console.print(f"  ui       {url}/ui/#key={key}  (opens signed in)", soft_wrap=True)
    else:
        console.print(f"  api key  {shown(key)}  (tenant default; in full: home/keys.json)")
        console.print(f"  ui       {url}/ui/  (paste a client key)")
    console.print(f"  home     {resolved}")
    console.print(f"  try      conveyor list --url {url} --home {resolved}")
    sys.stdout.flush()  # a supervisor (or a test) may be waiting for these lines on a pipe


@frozen
class MetricsConfig:
    """Who may read /metrics and what it says of tenants (``streams/sinks/metrics.py``)."""

    key: str | None = None  # None: nobody
    tenant_labels: str = "hashed"


@frozen
class KafkaConfig:
    """A node of a cluster on Kafka (``streams/cluster/``)."""

    bootstrap: str
    node_id: str
    secret: ClusterSecret  # signs this node's card, checks the others' (``cluster/signing.py``)
    cluster: str = "conveyor"
    session_timeout_ms: int = 10_000  # a dead node's partitions move after this long
    snapshots: str | None = None  # a directory or s3://bucket/prefix; None: none taken
    snapshot_interval_ms: int = 30_000
    snapshot_keep: int = 2
    s3_endpoint: str | None = None
    task_events: bool = False  # relay the events to each tenant's Avro topic
    events_keep_ms: int = 7 * 24 * 3_600_000  # the events topic keeps at least this long


@frozen
class SnapshotConfig:
    """Whether and where the node keeps its Postgres query snapshot."""

    enabled: bool = True
    dsn: str | None = None  # None: the embedded server in home/postgres


async def _open_snapshot(home: Path, node: Any, config: SnapshotConfig, metrics: Any) -> Any:
    if not config.enabled:
        return None
    from conveyor.errors import TransientError
    from conveyor.streams.sinks.snapshot import Snapshot

    try:
        snapshot = await Snapshot.open(home, node.events, dsn=config.dsn, metrics=metrics)
    except TransientError as exc:
        raise fail(f"{exc} (or run with --no-projection)") from None
    snapshot.start()
    return snapshot


async def _run_node(
    home: Path,
    host: str,
    port: int,
    partitions: int | None,
    app_ref: str | None = None,
    concurrency: int = 8,
    snapshot_config: SnapshotConfig | None = None,
    blobs: Blobs | None = None,
    sandbox: str = "auto",
    metrics_config: MetricsConfig | None = None,
    kafka: KafkaConfig | None = None,
    webhooks: Any = None,
    dev: DevOptions | None = None,
) -> None:
    from conveyor.store.attempt_logs import AttemptLogs
    from conveyor.streams.gateway import KeyStore, Registry, build_app, ensure_dev_key, start
    from conveyor.streams.gateway.auth import ensure_agent_key
    from conveyor.streams.gateway.forward import join_cluster
    from conveyor.streams.sinks.metrics import Metrics, TenantLabels, time_appends

    run_agent = _load_agent() if app_ref is not None else None
    interrupts = dev_loop.Interrupts()  # the first stops (a drain), the second stops now
    interrupts.install()
    node = await _open_node(home, partitions, kafka)
    metrics_config = metrics_config or MetricsConfig()
    metrics = Metrics(tenant_labels=TenantLabels(metrics_config.tenant_labels))
    metrics.watch(node)
    record_log = node.log  # before time_appends wraps it: the cluster re-reads its fences
    time_appends(node, metrics)
    if kafka is None:
        await node.start()
    node.tune_gc()
    snapshot = None
    member = None
    try:
        snapshot = await _open_snapshot(home, node, snapshot_config or SnapshotConfig(), metrics)
        key = ensure_dev_key(home)  # a client key; the agent's is bound to its app
        agent_key = ensure_agent_key(home, _check_app(app_ref).name) if app_ref else key
        app = build_app(
            node,
            KeyStore.load(home),
            Registry.load(home),
            blobs=blobs or _open_blobs(home, None),
            snapshot=snapshot.pool if snapshot is not None else None,
            progress=snapshot.projector if snapshot is not None else None,
            metrics=metrics,
            logs=AttemptLogs(home / "logs"),
            metrics_key=metrics_config.key,
        )
        attach_webhooks(app, home, node.events, webhooks)
        if kafka is not None and kafka.task_events:
            attach_task_events(app, kafka.bootstrap, kafka.cluster, node.events.partitions)
        try:
            runner, url = await start(app, host, port)
        except OSError as exc:
            raise fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
        if kafka is not None:
            readers = _events_readers(app, snapshot)
            member = await _join(node, record_log, kafka, url, home, metrics, readers)
            call_key = kafka.secret.call_key(kafka.cluster)  # any request, to its owner
            join_cluster(app, member.directory, url, call_key)
        _banner(url, key, home, dev=run_agent is not None)
        try:
            if run_agent is None or app_ref is None:
                await interrupts.stop.wait()
            else:
                start_agent = functools.partial(
                    run_agent,
                    url,
                    agent_key,
                    app_ref,
                    concurrency=concurrency,
                    sandbox=sandbox,
                    home=home,
                    drain_s=(dev or DevOptions()).drain_s,
                )
                await _serve_app(start_agent, app_ref, node, interrupts, dev or DevOptions())
        finally:
            await runner.cleanup()
    finally:
        if member is not None:
            await member.leave()  # first: the partitions move to the other nodes at once
        if snapshot is not None:
            await snapshot.close()  # before the node: its reads follow the events log
        await node.stop()


async def _serve_app(
    start_agent: Callable[..., Awaitable[None]],
    app_ref: str,
    node: Node,
    interrupts: dev_loop.Interrupts,
    options: DevOptions,
) -> None:
    """``conveyor dev``: the agent, reloaded and drained as ``dev_loop.py`` says, and a line
    per task event unless quiet."""
    lines = None
    if not options.quiet:
        lines = asyncio.create_task(dev_loop.print_events(node.events, console))
    try:
        await dev_loop.serve(
            lambda control: start_agent(control=control),
            app_ref,
            options,
            interrupts,
            node.clock,
            console,
        )
    finally:
        if lines is not None:
            lines.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await lines


async def _join(
    node: Node,
    record_log: Any,
    kafka: KafkaConfig,
    url: str,
    home: Path,
    metrics: Any,
    readers: Callable[[], list[Any]],
) -> ClusterMember:
    from conveyor.streams.cluster import Snapshots, join, leading
    from conveyor.streams.cluster.snapshot_store import open_store

    events: Any = node.events  # a KafkaLog, as ``_open_node`` opened it on --kafka

    snapshots = None
    if kafka.snapshots is not None:
        snapshots = Snapshots(
            open_store(kafka.snapshots, endpoint_url=kafka.s3_endpoint),
            node.stores,
            lambda p: leading(node, p),
            record_log,
            cluster=kafka.cluster,
            node_id=kafka.node_id,
            work_dir=home / "snapshots",
            clock=node.clock,
            interval_ms=kafka.snapshot_interval_ms,
            keep=kafka.snapshot_keep,
        )
        metrics.watch_snapshots(snapshots)
    return await join(
        node,
        record_log,
        bootstrap=kafka.bootstrap,
        topic=record_log.topic,
        cluster=kafka.cluster,
        session_timeout_ms=kafka.session_timeout_ms,
        url=url,
        secret=kafka.secret,
        events=events,
        readers=readers,
        events_keep_ms=kafka.events_keep_ms,
        events_interval_ms=kafka.snapshot_interval_ms,  # housekeeping on one schedule
        relays=kafka.task_events,  # said in its card: the trim keeps the relay's position
        snapshots=snapshots,
    )


def _events_readers(app: Any, snapshot: Any) -> Callable[[], list[Any]]:
    """Where this node's readers of the events topic are (the webhook deliverer, the
    projector): a cluster trims the topic below them (``cluster/events_trim.py``)."""
    from conveyor.streams.webhooks.api import WEBHOOKS

    hooks = app.get(WEBHOOKS)

    def readers() -> list[Any]:
        found = [] if hooks is None else [hooks.needed]
        return found if snapshot is None else [*found, snapshot.projector.next_offsets]

    return readers


async def _open_node(home: Path, partitions: int | None, kafka: KafkaConfig | None) -> Node:
    from conveyor.errors import TransientError
    from conveyor.streams.node import Node

    if kafka is None:
        return await Node.open(home, partitions=partitions)
    try:
        return await Node.open_kafka(
            home,
            kafka.bootstrap,
            node_id=kafka.node_id,
            cluster=kafka.cluster,
            partitions=partitions,
        )
    except TransientError as exc:
        raise fail(f"{exc} (is Kafka running at {kafka.bootstrap}?)") from None


def _kafka_config(
    bootstrap: str | None,
    node_id: str | None,
    cluster: str,
    session_timeout_s: float,
    secret: str | None = None,
    events_keep: str = "7d",
) -> KafkaConfig | None:
    if bootstrap is None:
        if node_id is not None:
            raise fail("--node-id names a node of a Kafka cluster: give --kafka BOOTSTRAP too")
        return None
    if not node_id:
        raise fail("--kafka needs --node-id: a name for this node, unique in the cluster")
    extras.require("kafka", what="--kafka")
    from conveyor.streams.cluster.signing import ClusterSecret

    if not secret:
        raise fail(
            "--kafka needs the cluster's secret: set CONVEYOR_CLUSTER_SECRET (or "
            "--cluster-secret) to the same value, 16 characters or more, on every node"
        )
    try:
        checked = ClusterSecret(secret)
    except ValueError as exc:  # its message gives the length, never the value
        raise fail(f"CONVEYOR_CLUSTER_SECRET / --cluster-secret: {exc}") from None
    from conveyor.durations import to_ms
    from conveyor.errors import ContractError

    try:
        keep_ms = to_ms(events_keep, field="--events-keep")
    except (ContractError, ValueError) as exc:
        raise fail(str(exc)) from None
    session_ms = int(session_timeout_s * 1000)
    return KafkaConfig(
        bootstrap=bootstrap,
        node_id=node_id,
        secret=checked,
        cluster=cluster,
        session_timeout_ms=session_ms,
        events_keep_ms=keep_ms,
    )


def _with_snapshots(
    config: KafkaConfig | None, where: str | None, interval: str, keep: int, endpoint: str | None
) -> KafkaConfig | None:
    """``config`` with the --snapshots options, checked before anything starts."""
    if where is None:
        return config
    if config is None:
        raise fail("--snapshots are of a node on Kafka: give --kafka BOOTSTRAP too")
    from dataclasses import replace

    from conveyor.durations import to_ms
    from conveyor.errors import ContractError
    from conveyor.streams.cluster.snapshot_store import open_store

    try:
        interval_ms = to_ms(interval, field="--snapshot-interval")
        open_store(where, endpoint_url=endpoint)  # a bad URL or directory fails here
    except (ContractError, ValueError, OSError) as exc:
        raise fail(str(exc)) from None
    if interval_ms < 1:
        raise fail("--snapshot-interval must be above 0, e.g. 30s")
    return replace(
        config,
        snapshots=where,
        snapshot_interval_ms=interval_ms,
        snapshot_keep=keep,
        s3_endpoint=endpoint,
    )


@contextlib.contextmanager
def _dev_broker(home: Path) -> Iterator[str]:
    """``conveyor dev --kafka``: one local broker in ``home/kafka``, stopped (by PID) when the
    command ends; yields its bootstrap. It is made anew each run (the partitions' stores see
    a log they never applied and rebuild from it)."""
    import shutil

    from conveyor.streams.log.kafka_broker import KafkaCluster, KafkaUnavailable

    shutil.rmtree(home / "kafka", ignore_errors=True)
    try:
        cluster = KafkaCluster.start(1, home / "kafka")
    except KafkaUnavailable as exc:
        raise fail(f"cannot start a local Kafka: {exc}") from None
    console.print(f"  kafka    {cluster.bootstrap}  (a local broker, stopped on exit)")
    try:
        yield cluster.bootstrap
    finally:
        cluster.stop()


async def _until_stopped(stop: asyncio.Event, work: Awaitable[Any]) -> None:
    """Run ``work`` until it ends or ``stop`` is set; a crash of ``work`` propagates."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.create_task(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for t in (task, stopper):
            t.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopper
        with contextlib.suppress(asyncio.CancelledError):
            await task  # re-raises a crash of the agent


def _open_blobs(home: Path, url: str | None) -> Blobs:
    """The blob store: S3 when ``url`` names a bucket, else a directory in the home."""
    from conveyor.store.blobs import LocalBlobs

    if url is None:
        return LocalBlobs(home / "blobs")
    extras.require("s3", what="--blobs-url s3://...")
    from conveyor.store.s3_blobs import S3Blobs

    try:
        return S3Blobs(url)
    except ValueError as exc:
        raise fail(str(exc)) from None


def node(
    home: HomeOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 7400,
    partitions: PartitionsOpt = None,
    log_level: LogLevelOpt = "warning",
    projection: ProjectionOpt = True,
    postgres_dsn: DsnOpt = None,
    blobs_url: BlobsOpt = None,
    metrics_key: MetricsKeyOpt = None,
    metrics_tenant_labels: TenantLabelsOpt = TenantLabels.hashed,
    kafka: KafkaOpt = None,
    node_id: NodeIdOpt = None,
    cluster: ClusterOpt = "conveyor",
    cluster_secret: ClusterSecretOpt = None,
    events_keep: EventsKeepOpt = "7d",
    session_timeout_s: SessionOpt = 10.0,
    webhooks_allow_private: WebhooksAllowPrivateOpt = False,
    webhooks_retry_s: WebhooksRetryOpt = RETRY_S_DEFAULT,
    webhooks_backoff_max_s: WebhooksBackoffOpt = BACKOFF_MAX_S_DEFAULT,
    snapshots: SnapshotsOpt = None,
    snapshot_interval: SnapshotIntervalOpt = "30s",
    snapshot_keep: SnapshotKeepOpt = 2,
    s3_endpoint: S3EndpointOpt = None,
    task_events: TaskEventsOpt = False,
) -> None:
    """Run a node: the log, the partition processors, the query snapshot and the HTTP gateway.

    /metrics labels tenants by a hash of their names by default: the fairness alert keeps its
    per-tenant series, and whoever reads the metrics is not shown customers' names.
    """
    extras.require("server", what="conveyor node")
    _setup_logging(log_level)
    kafka_config = _kafka_config(
        kafka, node_id, cluster, session_timeout_s, cluster_secret, events_keep
    )
    kafka_config = _with_snapshots(
        kafka_config, snapshots, snapshot_interval, snapshot_keep, s3_endpoint
    )
    kafka_config = with_task_events(kafka_config, task_events)
    config = SnapshotConfig(enabled=projection, dsn=postgres_dsn)
    home_path = home_dir(home)
    blobs = _open_blobs(home_path, blobs_url)  # a bad URL fails before anything starts
    metrics = MetricsConfig(key=metrics_key, tenant_labels=metrics_tenant_labels.value)
    asyncio.run(
        _run_node(
            home_path,
            host,
            port,
            partitions,
            snapshot_config=config,
            blobs=blobs,
            metrics_config=metrics,
            kafka=kafka_config,
            webhooks=webhook_settings(
                webhooks_allow_private, webhooks_retry_s, webhooks_backoff_max_s
            ),
        )
    )


def dev(
    app_ref: AppRefOpt,
    home: HomeOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 7400,
    partitions: PartitionsOpt = None,
    concurrency: ConcurrencyOpt = 8,
    log_level: LogLevelOpt = "warning",
    log_json: LogJsonOpt = False,
    projection: ProjectionOpt = True,
    postgres_dsn: DsnOpt = None,
    blobs_url: BlobsOpt = None,
    sandbox: DevSandboxOpt = None,
    metrics_key: MetricsKeyOpt = None,
    metrics_tenant_labels: TenantLabelsOpt = TenantLabels.on,
    kafka: Annotated[
        bool, typer.Option("--kafka", help="Keep the log in a local Kafka broker it starts")
    ] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No line per task event")] = False,
    reload: Annotated[
        bool,
        typer.Option(
            "--reload",
            help="Start the agent anew (new guests, the new code) when the app's files change; "
            "running tasks finish on the code they started with",
        ),
    ] = False,
    drain_s: Annotated[
        float,
        typer.Option(
            "--drain-s",
            min=0.0,
            help="On Ctrl-C, how long running tasks get to finish (a second Ctrl-C: stop now)",
        ),
    ] = 30.0,
    task_events: TaskEventsOpt = False,
) -> None:
    """Node + gateway + an agent for your app, in one process: for development.

    Prints a line per task event (state, attempt, duration or error). /metrics names tenants
    by default: they are the developer's own.
    """
    extras.require("server", what="conveyor dev")
    if kafka:
        extras.require("kafka", what="conveyor dev --kafka")
    _setup_logging(log_level, log_json)
    _load_agent()  # fail before touching the home dir
    _check_import_path()
    _check_app(app_ref)
    config = SnapshotConfig(enabled=projection, dsn=postgres_dsn)
    home_path = home_dir(home)
    blobs = _open_blobs(home_path, blobs_url)  # a bad URL fails before anything starts
    metrics = MetricsConfig(key=metrics_key, tenant_labels=metrics_tenant_labels.value)
    with contextlib.ExitStack() as broker:
        kafka_config = None
        if kafka:
            bootstrap = broker.enter_context(_dev_broker(home_path))
            from conveyor.streams.cluster.signing import ClusterSecret

            secret = ClusterSecret(secrets.token_urlsafe(32))  # one node: nobody to share it
            kafka_config = KafkaConfig(bootstrap=bootstrap, node_id="dev", secret=secret)
        kafka_config = with_task_events(kafka_config, task_events)
        node = _run_node(
            home_path,
            host,
            port,
            partitions,
            app_ref,
            concurrency,
            config,
            blobs,
            _mode(sandbox),
            metrics_config=metrics,
            kafka=kafka_config,
            webhooks=webhook_settings(loopback=True),
            dev=DevOptions(quiet=quiet, reload=reload, drain_s=drain_s),
        )
        _run_agent_command(node)


def agent(
    app_ref: AppRefOpt,
    url: UrlOpt = DEFAULT_URL,
    api_key: KeyOpt = None,
    home: HomeOpt = None,
    concurrency: ConcurrencyOpt = 8,
    prefetch: PrefetchOpt = None,
    lease_s: Annotated[float, typer.Option("--lease-s", min=0.5)] = 30.0,
    heartbeat_s: Annotated[float, typer.Option("--heartbeat-s", min=0.1)] = 10.0,
    poll_wait_s: Annotated[float, typer.Option("--poll-wait-s", min=0.1)] = 20.0,
    drain_s: Annotated[float, typer.Option("--drain-s", min=0.0)] = 30.0,
    in_process: Annotated[
        bool,
        typer.Option(
            "--in-process",
            help="Run handlers on threads of the agent, not in guest processes: no isolation "
            "(trusted code only, as in a Celery worker), no guest hop",
        ),
    ] = False,
    deploy: Annotated[
        int | None,
        typer.Option(
            "--deploy",
            envvar="CONVEYOR_DEPLOY",
            min=0,
            help="This rollout's deploy number, higher for each newer one (a CI build "
            "number): only an agent of a higher deploy than any before removes the task types "
            "it does not serve; without it the agent only adds types",
        ),
    ] = None,
    sandbox: SandboxOpt = Sandbox.bwrap,
    allow_net: AllowNetOpt = False,
    log_level: LogLevelOpt = "warning",
    log_json: LogJsonOpt = False,
) -> None:
    """Run a host agent that polls a node and runs the app's handlers."""
    _setup_logging(log_level, log_json)
    run_agent = _load_agent()
    _check_import_path()
    app_name = _check_app(app_ref).name
    key = api_key or dev_key(home_dir(home), app=app_name)
    if not key:
        raise fail(
            f"no agent key for app {app_name!r}: pass --api-key, set CONVEYOR_API_KEY, or mint "
            f"one with `conveyor keys create --tenant default --role agent --app {app_name}`"
        )

    async def main() -> None:
        stop = asyncio.Event()
        _stop_on_signals(stop)
        work = run_agent(
            url,
            key,
            app_ref,
            concurrency=concurrency,
            prefetch=prefetch,
            lease_s=lease_s,
            heartbeat_s=heartbeat_s,
            poll_wait_s=poll_wait_s,
            drain_s=drain_s,
            in_process=in_process,
            sandbox=sandbox.value,
            allow_net=allow_net,
            deploy=deploy,
            home=home_dir(home),
        )
        await _until_stopped(stop, work)

    _run_agent_command(main())


def _mode(sandbox: Sandbox | None) -> str:
    """``conveyor dev``'s sandbox: the one asked for, else "auto" (bwrap if it works here)."""
    return "auto" if sandbox is None else sandbox.value


def _run_agent_command(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main``; a sandbox or a guest that cannot start ends the command with its
    reason, in a few lines (``agents/startup.py``), not under a traceback."""
    from conveyor.agents.bwrap import SandboxUnavailable
    from conveyor.agents.pool import GuestStartError

    try:
        asyncio.run(main)
    except (SandboxUnavailable, GuestStartError) as exc:
        raise fail(escape(str(exc))) from None  # the app's error text is no markup
