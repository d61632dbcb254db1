"""``conveyor bench e2e``: the whole product over real sockets and real processes.

On a fresh data dir the bench starts ``conveyor node`` and ``conveyor agent`` (whose guests
run the no-op app of ``noop_app``) as subprocesses, and talks to the node as a user would,
through the SDK's ``AsyncClient``. Phases, in this order, so the latency ones see an idle
system:

1. single enqueue: ``single`` sequential ``POST /v1/tasks``, client-measured (send -> ack).
   Then ``concurrent`` more from ``SINGLE_CALLERS`` callers at once, one task per request,
   as a web app's request handlers enqueue: their rate and latency (``concurrent_*``).
2. idle schedule-to-start: ``idle`` ``stamp`` tasks, one at a time with a pause; the handler
   returns the wall clock when it starts (client and guests share the machine's clock), and
   start = that - the client's ack time. The lease stamp (``attempts[].started_ms``) gives
   the node's share of it.
3. throughput: ``tasks`` no-op tasks through ``POST /v1/tasks:batch`` (1,000 per call, a few
   concurrent callers) -> agent -> guests -> SUCCEEDED. Completion is awaited with long-polls
   on each batch's last task, then by counting SUCCEEDED tasks in the listing; the figure
   counts from the first enqueue to the last ``finished_ms``, read from the node's state
   after it stopped, where the run also checks that every task SUCCEEDED.

The agent runs ``concurrency`` guests, by default as many as ``conveyor agent`` runs unless
told (8), and holds ``prefetch`` more leases ready for them (its ``--prefetch``), by default
as the agent adapts it (``agents/prefetch.py``): for no-op tasks, one full poll (1,000 leases
with the guests'). Without them, a guest that finishes waits a whole poll round trip for its
next task, and polls and grants come in batches of a few tasks: while batches of enqueues
keep the node busy, a poll's round trip grows to 0.2-0.3 s, and with 256 leases per round
trip the guests idled through the enqueue phase (2,775-3,008 tasks/s, against 2,957-3,490
with 1,000, runs alternating); with 8 (the agent's fixed default before it adapted) it ran
1,076-1,262 tasks/s against 3,174-3,388 with 992. More guests than that cost CPU
for nothing on this machine: no-op tasks keep 8 busy, and each of 32 guests wakes up for
fewer tasks at a time (runs alternating: 3,119-4,074 tasks/s with 32 guests, 4,070-4,414 with
8, 3,877-4,579 with 4; guests' CPU 4.7-6.0 s against 3.3-3.7 s with 8).

Every process is stopped by pid at the end, whatever happened (TERM, then KILL). CPU is
counted per role and per process over the throughput phase, also per task. With
``kafka_nodes`` the same phases run on a cluster on local Kafka brokers (``e2e_kafka.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import httpx
import psutil

from conveyor.aclient import AsyncClient
from conveyor.agents.host import CONCURRENCY
from conveyor.errors import ContractError
from conveyor.frozen import frozen
from conveyor.schemas.types import Task
from conveyor.store.rocksdb import RocksKV
from conveyor.store.tables import Tables
from conveyor.streams.gateway.auth import agent_grant, create_key
from conveyor.wire import Enqueue

APP_REF = "conveyor_devtools.bench.noop_app:app"
APP = "bench"
ENQUEUE_BATCH = 1_000
CALLERS = 4  # concurrent batch enqueuers: enough to overlap the node's group commits
SINGLE_CALLERS = 16  # concurrent single enqueuers
START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 15.0
IDLE_PAUSE_S = 0.02  # between idle tasks: the previous one has finished, nothing overlaps
WARM_PAUSE_MS = 200  # long enough that every guest slot is busy at once during warm-up


async def bench_e2e(
    *,
    tasks: int = 50_000,
    partitions: int = 8,
    agents: int = 1,
    concurrency: int | None = None,  # None: the agent's default
    prefetch: int | None = None,  # None: the agent's, adapted to its pace
    single: int = 500,
    concurrent: int = 4_000,
    idle: int = 200,
    home: str | None = None,
    drain_timeout_s: float = 240.0,
    in_process: bool = False,
    kafka_nodes: int | None = None,
    compare_local: bool = False,
) -> dict[str, Any]:
    """``in_process``: the agents run handlers on their own threads (``--in-process``), not
    in guests: the platform without the guest hop, as Celery-style workers run.
    ``kafka_nodes``: on a cluster of that many nodes on local Kafka brokers (``e2e_kafka``),
    ``agents`` per node; ``compare_local`` then runs the local log too, after it, and puts its
    figures under ``local``."""
    if concurrency is None:
        concurrency = CONCURRENCY
    sizes = Sizes(tasks, single, concurrent, idle, drain_timeout_s)
    with tempfile.TemporaryDirectory(prefix="conveyor-e2e-") as tmp:
        root = Path(home or tmp)
        if kafka_nodes is None:
            return await run_bench(
                Cluster(root, partitions, agents, concurrency, prefetch, in_process), sizes
            )
        from conveyor_devtools.bench.e2e_kafka import KafkaNodes

        args = (partitions, agents, concurrency, prefetch, in_process)
        kafka = KafkaNodes(root / "kafka-run", *args, nodes=kafka_nodes)
        result = {"log": f"kafka, {kafka_nodes} node(s)", **await run_bench(kafka, sizes)}
        if compare_local:
            local = await run_bench(Cluster(root / "local-run", *args), sizes)
            result["local"] = {"log": "local", **local}
        return result


@frozen
class Sizes:
    """How much each phase does."""

    tasks: int
    single: int
    concurrent: int
    idle: int
    drain_timeout_s: float


async def run_bench(cluster: Cluster, sizes: Sizes) -> dict[str, Any]:
    """The phases on ``cluster`` (started here, stopped at the end whatever happened)."""
    try:
        await cluster.start()
        result = await _run(cluster, sizes)
        stores = cluster.led_stores()  # before the stop: which node's copy is current
    finally:
        cluster.stop()
    result.update(_final_state(stores, result.pop("since_ms"), sizes.tasks))
    result["tasks_per_s"] = _throughput_figure(result)
    result["executor"] = "in-process" if cluster.in_process else "guests"
    return _ordered(
        result,
        sizes.tasks,
        cluster.partitions,
        cluster.agents,
        cluster.concurrency,
        cluster.prefetch,
    )


async def _run(cluster: Cluster, sizes: Sizes) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {cluster.key}"}
    urls = cluster.urls()
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(AsyncClient(url, cluster.key, app=APP)) for url in urls
        ]
        http = await stack.enter_async_context(
            httpx.AsyncClient(base_url=cluster.url, headers=auth, timeout=60.0)
        )
        client = clients[0]
        s = Session(client, http, cluster.metrics_key, tuple(clients))
        for each in clients:  # every node's agent has registered
            await _warm_up(each, cluster.agents * cluster.concurrency // len(clients) or 1)
        out: dict[str, Any] = {}
        out.update(await _single_enqueues(client, sizes.single))
        out.update(await _concurrent_enqueues(client, sizes.concurrent))
        out.update(await _idle_starts(client, sizes.idle))
        before = cluster.usage()
        out.update(await _throughput(s, sizes.tasks, sizes.drain_timeout_s))
        out.update(cluster.usage_since(before, sizes.tasks))
        return out


@frozen
class Session:
    """The SDK client the figures are measured with, and a raw HTTP client for the listings
    that wait for a phase to finish (they need task ids only, not the SDK's summaries)."""

    client: AsyncClient
    http: httpx.AsyncClient
    metrics_key: str  # the node's /metrics bearer token
    enqueuers: tuple[AsyncClient, ...] = ()  # one per node: the throughput's batches go round


# -- the processes ----------------------------------------------------------------------------


@dataclass
class Cluster:
    """A node and its agents as subprocesses of this one, with their output in files."""

    root: Path
    partitions: int
    agents: int
    concurrency: int
    prefetch: int | None
    in_process: bool = False  # agents run handlers on their threads, not in guests
    port: int = 0
    key: str = ""  # a client key of tenant default
    agent_key: str = ""  # an agent key of the app, for the agents
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    metrics_key: str = field(default_factory=lambda: secrets.token_urlsafe(24))

    @property
    def node_home(self) -> Path:
        return self.root / "node"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    APP_NAME: ClassVar[str] = APP

    def urls(self) -> list[str]:
        """Every node's URL, the first one's first (the latency phases use it alone)."""
        return [self.url]

    def node_homes(self) -> list[Path]:
        return [self.node_home]

    def led_stores(self) -> list[Path]:
        """The RocksDB state of each partition, in the home of the node that leads it."""
        return sorted(p for p in (self.node_home / "state").iterdir() if p.is_dir())

    def mint_agent_key(self) -> None:
        """Before the node starts (it reads new keys within a second; an agent registers at
        once): the agents' key, bound to the app they serve."""
        self.agent_key = create_key(self.node_home, agent_grant("default", self.APP_NAME))

    async def start(self) -> None:
        self.port = _free_port()
        self.mint_agent_key()
        home, port, partitions = str(self.node_home), str(self.port), str(self.partitions)
        self._spawn(
            "node",
            ["node", "--home", home, "--port", port, "--partitions", partitions],
            env={"CONVEYOR_METRICS_KEY": self.metrics_key},
        )
        await self._healthy()
        self.key = _dev_key(self.node_home)
        for k in range(self.agents):
            self.spawn_agent_at(f"agent-{k}", self.url)

    def spawn_agent_at(self, name: str, url: str) -> None:
        args = ["--app", APP_REF, "--url", url, "--api-key", self.agent_key]
        slots = ["--concurrency", str(self.concurrency)]
        if self.prefetch is not None:
            slots += ["--prefetch", str(self.prefetch)]
        if self.in_process:
            slots.append("--in-process")
        self._spawn(
            name,
            ["agent", *args, *slots],
            # The agent writes guest logs under $CONVEYOR_HOME: keep them in the temp dir.
            env={"CONVEYOR_HOME": str(self.root / name)},
        )

    def _spawn(self, name: str, args: list[str], env: dict[str, str] | None = None) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with open(self.root / f"{name}.out", "ab") as out:
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", "conveyor.cli", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
            )

    async def _healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        async with httpx.AsyncClient(base_url=self.url, timeout=2.0) as http:
            while time.monotonic() < deadline:
                self.check_alive()
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/healthz")).status_code == 200:
                        return
                await asyncio.sleep(0.05)
        raise RuntimeError(f"the node was not healthy after {START_TIMEOUT_S}s\n{self.logs()}")

    def check_alive(self) -> None:
        for name, proc in self.procs.items():
            if proc.poll() is not None:
                raise RuntimeError(f"{name} exited with {proc.returncode}\n{self.logs()}")

    def logs(self) -> str:
        tails = []
        for name in self.procs:
            path = self.root / f"{name}.out"
            text = path.read_text(errors="replace") if path.exists() else ""
            tails.append(f"--- {name}.out\n{text[-4000:]}")
        return "\n".join(tails)

    def stop(self) -> None:
        """Agents first (they drain and kill their guests), then the node; KILL stragglers."""
        for name, proc in sorted(self.procs.items(), key=lambda kv: kv[0].startswith("node")):
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(proc.pid, signal.SIGKILL)
                proc.wait()
                print(f"{name} (pid {proc.pid}) ignored SIGTERM; killed", file=sys.stderr)

    def other_pids(self) -> dict[str, int]:
        """Processes of the run that are not ``procs`` (role name -> pid): none here."""
        return {}

    def usage(self) -> dict[str, float]:
        """CPU seconds (``/proc/<pid>/stat``, through psutil) and RSS (MiB) of the nodes,
        their projector processes and their snapshots' PostgreSQL (a daemon rather than a
        child), the agents, their guests, ``other_pids`` (brokers) and this process: the
        client. Summed per role; ``cpu_s_by_process`` keeps each process's own."""
        out: dict[str, float] = {}
        for name, popen in self.procs.items():
            node = name.startswith("node")
            with contextlib.suppress(psutil.Error):
                proc = psutil.Process(popen.pid)
                _add(out, "node" if node else "agent", proc, name)
                for child in proc.children(recursive=True):
                    _add(out, "node_projector" if node else "guests", child)
        for home in self.node_homes():
            postmaster = _postmaster(home)
            if postmaster is not None:
                for backend in (postmaster, *postmaster.children(recursive=True)):
                    _add(out, "node_postgres", backend)
        for name, pid in self.other_pids().items():
            with contextlib.suppress(psutil.Error):
                _add(out, name.rstrip("-0123456789"), psutil.Process(pid), name)
        cpu = psutil.Process().cpu_times()
        out["client_cpu_s"] = cpu.user + cpu.system
        return out

    def usage_since(self, before: dict[str, float], tasks: int | None = None) -> dict[str, Any]:
        """Each CPU figure since ``before``; with ``tasks``, also CPU ms per task per role
        (``<role>_cpu_ms_per_task``) and per process (``cpu_ms_per_task_by_process``)."""
        now = self.usage()
        out: dict[str, Any] = {k: round(v, 1) for k, v in now.items() if k.endswith("_rss_mb")}
        by_process: dict[str, float] = {}
        for k, v in now.items():
            if k.endswith("_cpu_s"):
                out[k] = round(v - before.get(k, 0.0), 2)
            elif k.startswith("cpu_s:"):
                by_process[k.removeprefix("cpu_s:")] = v - before.get(k, 0.0)
        if tasks:
            for k in [k for k in out if k.endswith("_cpu_s")]:
                out[k.removesuffix("_cpu_s") + "_cpu_ms_per_task"] = round(1000 * out[k] / tasks, 3)
            out["cpu_ms_per_task_by_process"] = {
                name: round(1000 * cpu / tasks, 3) for name, cpu in sorted(by_process.items())
            }
        return out


def _add(out: dict[str, float], role: str, proc: psutil.Process, name: str | None = None) -> None:
    try:
        cpu, rss = proc.cpu_times(), proc.memory_info().rss
    except psutil.Error:  # it just exited
        return
    out[f"{role}_cpu_s"] = out.get(f"{role}_cpu_s", 0.0) + cpu.user + cpu.system
    out[f"{role}_rss_mb"] = out.get(f"{role}_rss_mb", 0.0) + rss / 2**20
    if name is not None:
        out[f"cpu_s:{name}"] = cpu.user + cpu.system


def _postmaster(home: Path) -> psutil.Process | None:
    """The embedded PostgreSQL of the node's query snapshot, if it runs one."""
    try:
        pid = int((home / "postgres" / "postmaster.pid").read_text().split()[0])
        return psutil.Process(pid)
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _dev_key(home: Path) -> str:
    """The client key ``conveyor node`` wrote for tenant ``default`` on first start."""
    doc = json.loads((home / "keys.json").read_text(encoding="utf-8"))
    for key, entry in doc["keys"].items():
        if entry.get("tenant") == "default" and entry.get("role") != "agent":
            return str(key)
    raise RuntimeError(f"no key for tenant default in {home / 'keys.json'}")


# -- the phases -------------------------------------------------------------------------------


async def _warm_up(client: AsyncClient, slots: int) -> None:
    """Wait until the agent registered the app, and make it spawn every guest it may use, so
    neither registration nor guest start-up lands in a measurement."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            handles = await client.enqueue_many([Enqueue("pause", WARM_PAUSE_MS)] * slots)
            break
        except ContractError as exc:
            if exc.code != "unknown_task_type" or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)
    for handle in handles:
        await handle.result(timeout=START_TIMEOUT_S)


async def _single_enqueues(client: AsyncClient, n: int) -> dict[str, Any]:
    latencies, handles = [], []
    for _ in range(n):
        sent = time.perf_counter()
        handles.append(await client.enqueue("noop", {}))
        latencies.append((time.perf_counter() - sent) * 1000)
    for handle in handles:  # the next phase starts on an idle system
        await handle.result(timeout=START_TIMEOUT_S)
    return {"single": n, **_percentiles("enqueue", latencies)}


async def _concurrent_enqueues(client: AsyncClient, n: int) -> dict[str, Any]:
    latencies: list[float] = []
    handles = []

    async def caller(k: int) -> None:
        for _ in range(k, n, SINGLE_CALLERS):
            sent = time.perf_counter()
            handles.append(await client.enqueue("noop", {}))
            latencies.append((time.perf_counter() - sent) * 1000)

    start = time.perf_counter()
    await asyncio.gather(*(caller(k) for k in range(SINGLE_CALLERS)))
    seconds = time.perf_counter() - start
    for handle in handles:  # the next phase starts on an idle system
        await handle.result(timeout=START_TIMEOUT_S)
    return {
        "concurrent": n,
        "concurrent_per_s": round(n / seconds),
        **_percentiles("concurrent", latencies),
    }


async def _idle_starts(client: AsyncClient, n: int) -> dict[str, Any]:
    starts, leases, submits = [], [], []
    for _ in range(n):
        sent = time.time()
        handle = await client.enqueue("stamp", {})
        acked = time.time()
        await asyncio.sleep(IDLE_PAUSE_S)  # no GET in flight while the task starts
        info = await client.wait(handle.id, START_TIMEOUT_S)
        started = float(info.result) * 1000
        # A handler may start before the ack reaches the client: that is a zero wait.
        starts.append(max(0.0, started - acked * 1000))
        submits.append(started - sent * 1000)
        leased = info.attempts[-1].started_ms if info.attempts else None
        if leased is not None:
            leases.append(leased - acked * 1000)
    return {
        "idle": n,
        **_percentiles("start", starts),
        **_percentiles("submit_to_start", submits),
        **_percentiles("lease", leases),
    }


async def _throughput(s: Session, tasks: int, drain_timeout_s: float) -> dict[str, Any]:
    since_ms = time.time_ns() // 1_000_000
    start = time.perf_counter()
    enqueuers = s.enqueuers or (s.client,)
    lasts = await asyncio.gather(
        *(_enqueuer(enqueuers[k % len(enqueuers)], k, tasks) for k in range(CALLERS))
    )
    enqueue_s = time.perf_counter() - start
    lag: dict[str, float] = {}
    ids = [i for batch in lasts for i in batch]
    drained = await _drain(s, ids, since_ms, tasks, drain_timeout_s, lag)
    return {
        "since_ms": since_ms,
        "enqueue_s": round(enqueue_s, 3),
        "enqueue_per_s": round(tasks / enqueue_s),
        "drained": drained,
        "client_seconds": round(time.perf_counter() - start, 3),
        **lag,
    }


async def _enqueuer(client: AsyncClient, k: int, tasks: int) -> list[tuple[AsyncClient, str]]:
    """Batches k, k + CALLERS, ...; returns each batch's last task with the client of the
    node that took the batch (on a cluster, the node that leads the task's partition)."""
    lasts = []
    for lo in range(k * ENQUEUE_BATCH, tasks, CALLERS * ENQUEUE_BATCH):
        n = min(ENQUEUE_BATCH, tasks - lo)
        handles = await client.enqueue_many([Enqueue("noop", {})] * n)
        lasts.append((client, handles[-1].id))
    return lasts


async def _drain(
    s: Session,
    lasts: list[tuple[AsyncClient, str]],
    since_ms: int,
    tasks: int,
    timeout_s: float,
    lag: dict[str, float],
) -> bool:
    """Wait until all ``tasks`` created since ``since_ms`` SUCCEEDED: long-polls on each
    batch's last task (a few dozen requests, not one per task), then counts in the listing,
    which may trail the processors (the node's query snapshot), until the count is whole.
    When the long-polls are done (the run's end), ``lag`` gets the node's lag gauges."""
    deadline = time.monotonic() + timeout_s
    for client, task_id in lasts:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        await client.wait(task_id, left)
    lag.update(await _lag_at_end(s))
    while await _succeeded_since(s, since_ms) < tasks:
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.2)
    return True


async def _lag_at_end(s: Session) -> dict[str, float]:
    """``projection_lag_s`` (``conveyor_projection_lag_seconds``: how far the Postgres
    snapshot trails the events it has been sent) and the largest
    ``conveyor_processor_lag_seconds``, scraped from the node's /metrics."""
    reply = await s.http.get("/metrics", headers={"Authorization": f"Bearer {s.metrics_key}"})
    reply.raise_for_status()
    found: dict[str, float] = {}
    for line in reply.text.splitlines():
        name, _, value = line.partition(" ")
        base = name.partition("{")[0]
        if base in _LAG_GAUGES and value:
            key = _LAG_GAUGES[base]
            found[key] = round(max(found.get(key, 0.0), float(value)), 3)
    return found


_LAG_GAUGES = {
    "conveyor_projection_lag_seconds": "projection_lag_s",
    "conveyor_processor_lag_seconds": "processor_lag_s",
}


async def _succeeded_since(s: Session, since_ms: int) -> int:
    count = 0
    params: dict[str, str | int] = {"status": "SUCCEEDED", "since_ms": since_ms, "limit": 1000}
    while True:
        reply = await s.http.get("/v1/tasks", params=params)
        reply.raise_for_status()
        page = reply.json()
        count += len(page["tasks"])
        if page.get("next_cursor") is None:
            return count
        params["cursor"] = page["next_cursor"]


# -- figures ----------------------------------------------------------------------------------


def _final_state(stores: list[Path], since_ms: int, tasks: int) -> dict[str, Any]:
    """Statuses and the last finish time of the throughput tasks (created since ``since_ms``),
    read from the stopped nodes' RocksDB state: ``stores``, one current copy per partition."""
    counts: dict[str, int] = {}
    last_ms = since_ms
    for path in stores:
        kv = RocksKV(path)
        try:
            for task in _tasks_since(Tables(kv), since_ms):
                counts[task.status.value] = counts.get(task.status.value, 0) + 1
                last_ms = max(last_ms, task.finished_ms or 0)
        finally:
            kv.close()
    return {
        "seconds": round((last_ms - since_ms) / 1000, 3),
        "all_succeeded": counts.get("SUCCEEDED", 0) == tasks == sum(counts.values()),
        "statuses": counts,
    }


def _tasks_since(tables: Tables, since_ms: int) -> Iterator[Task]:
    for task in tables.tasks():
        if task.created_ms >= since_ms:
            yield task


def _throughput_figure(result: dict[str, Any]) -> int:
    done = int(result["statuses"].get("SUCCEEDED", 0))
    seconds = float(result["seconds"])
    return round(done / seconds) if seconds > 0 else 0


def _percentiles(name: str, values: list[float]) -> dict[str, float | None]:
    ordered = sorted(values)

    def pct(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {f"{name}_p50_ms": pct(0.50), f"{name}_p99_ms": pct(0.99)}


def _ordered(
    result: dict[str, Any],
    tasks: int,
    partitions: int,
    agents: int,
    concurrency: int,
    prefetch: int | None,
) -> dict[str, Any]:
    """The headline figures first, then the detail."""
    head = ["tasks_per_s", "enqueue_p50_ms", "enqueue_p99_ms", "start_p50_ms", "start_p99_ms"]
    out: dict[str, Any] = {"tasks": tasks}
    out.update({k: result.pop(k) for k in head})
    out.update(
        partitions=partitions,
        agents=agents,
        concurrency=concurrency,
        prefetch="auto" if prefetch is None else prefetch,
    )
    out.update(result)
    return out
