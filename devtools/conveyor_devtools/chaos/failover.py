"""F1 of tests/PLAN.md: failover of a cluster on Kafka under load (``conveyor chaos failover``).

Processes, all on 127.0.0.1 under one temp root: three Kafka brokers in one quorum
(replication factor 3, min.insync.replicas 2: ``log/kafka_broker.py`` rule 2), three
``conveyor node --kafka`` processes of one cluster (``n1``..``n3``, each with its own home and
port) and one agent per node. Clients enqueue through a router (``router.py``: each request
goes to the node that leads the request's partition at the highest epoch, as ``/healthz``
shows), recorded in the history like every fault run (``runner.py``), while the faults below
strike in turn, each once at least, then again while the load lasts:

    node-kill     kill -9 of a node; once the survivors lead its partitions, it is restarted
                  with the same --node-id, home and port (its agent, left running, reconnects)
    broker-kill   kill -9 of a broker, restarted a few seconds later on its data
    node-stop     SIGSTOP of a node past the group's session timeout, then SIGCONT: the zombie

Then everything heals, the keys without an answer are resent, every acknowledged task is read
until terminal, the nodes stop, and the run is judged on:

- the checker's counts (``checker.py``): nothing lost, nothing unexpected, one terminal state;
- the log itself, read back from Kafka: along each partition's offsets, no leader record at an
  epoch below one already announced lands (``stale_records``). A zombie's lease grants, lease
  expiries and timer firings carry its old epoch, so this is where any of its effects would
  show; and it can only land if its transactional producer was not fenced (``log/kafka.py``
  rule 3);
- the zombie after SIGCONT: within ``STALE_S_MAX`` it no longer lists any partition it led at
  the epoch it led it at before the pause (it learnt of the new owners: its log says how, by a
  rebalance, a fenced append, or the newer epoch it read);
- failover time (``failover_p50_s``, ``failover_p99_s``): from a node's kill to the first
  dispatch of each partition it led, the first lease granted on that partition by its new
  owner before the victim came back (``attempts[].started_ms`` of the tasks read in the
  drain; the nodes share this machine's clock). A moved partition on which nothing was
  dispatched in that window counts the moment a survivor was first seen leading it at a
  higher epoch (``/healthz``, polled every ``POLL_S``) instead (``failover_from_healthz``).
  SIGSTOPs are measured the same way (``stop_failover_s``) but kept out of the figure.
  The nodes run with a session timeout of ``session_s`` (4 s: see ``FailoverConfig``).
"""

from __future__ import annotations

import asyncio
import random
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.frozen import frozen
from conveyor.streams.log.kafka_broker import KafkaUnavailable
from conveyor_devtools.chaos import checker
from conveyor_devtools.chaos.history import NEMESIS, History, Op
from conveyor_devtools.chaos.kafka_evidence import LogEvidence, read_log, state_keys
from conveyor_devtools.chaos.kafka_nodes import BROKER_STARTS, NODES, Cluster
from conveyor_devtools.chaos.router import POLL_S, Router, healthz
from conveyor_devtools.chaos.runner import (
    TASK,
    _client,
    _drain,
    _executions,
    _resolve,
    _sampler,
    enqueue_recorded,
)

START_S = 90.0  # a node's first health answer, a settled cluster (three JVMs share the box)
SETTLE_S = 90.0  # after a fault: every partition led by one node, caught up (a loaded box)
MOVE_S_MAX = 30.0  # a dead node's partitions led by the survivors
STALE_S_MAX = 20.0  # after SIGCONT, the zombie stops leading at its old epochs
AFTER_MOVE_S = 1.5  # the survivors dispatch on what they took before the victim returns
BROKER_DOWN_S = (2.0, 4.0)
GAP_S = (1.0, 2.5)  # between faults
STOP_MARGIN_S = 3.0  # a SIGSTOP lasts the session timeout and this much more
STRIKES = ("node-kill", "broker-kill", "node-stop")
FAILOVER_P99_S_MAX = 10.0


@frozen
class FailoverConfig:
    seconds: float = 60.0  # of load under faults (each fault strikes once even if shorter)
    seed: int = 0
    partitions: int = 6
    clients: int = 4
    rate: float = 30.0  # enqueues/s over all clients: 3 JVMs, 3 nodes and 3 agents share 2 cores
    concurrency: int = 2
    prefetch: int = 2
    # The group's session timeout: how long a dead node's partitions wait. 4 s is four
    # heartbeats (membership.py: one a second); a node stalled that long dispatched nothing
    # meanwhile anyway, and a wrong verdict only moves partitions, which fencing makes safe
    # (what this run checks). The default of 10 s, or the brokers' usual floor of 6 s, leave
    # too little of a 10 s failover for the rebalance and the take-over on a loaded machine.
    session_s: float = 4.0
    drain_s: float = 60.0
    home: Path | None = None


@dataclass
class FailoverRun:
    """What the load, the reads and the drain share (``runner.Recording``)."""

    cluster: Cluster
    history: History
    journal: Path
    acked: dict[str, str] = field(default_factory=dict)  # key -> task id
    pending: set[str] = field(default_factory=set)  # keys without an ok yet


# -- the faults -------------------------------------------------------------------------------


@dataclass
class Faults:
    """Strikes in turn (``STRIKES``), each once at least; every one goes into the history."""

    cluster: Cluster
    router: Router
    history: History
    rng: random.Random
    stale: list[dict[str, Any]] = field(default_factory=list)  # what each zombie did

    async def run(self, until: float) -> None:
        n = 0
        while n < len(STRIKES) or time.monotonic() < until:
            await asyncio.sleep(self.rng.uniform(*GAP_S))
            strike = STRIKES[n % len(STRIKES)]
            n += 1
            if strike == "node-kill":
                await self.node_kill()
            elif strike == "broker-kill":
                await self.broker_kill()
            else:
                await self.node_stop()
            await self.settle()

    async def node_kill(self) -> None:
        victim = self.rng.choice(NODES)
        led = self._leading(victim)
        self.cluster.signal(victim, signal.SIGKILL)
        self.history.nemesis("kill", {"role": "node", "name": victim, "leading": led})
        await self._moved(victim, led, "kill")
        await asyncio.sleep(AFTER_MOVE_S)
        self.cluster.spawn_node(victim)
        self.history.nemesis("start", {"role": "node", "name": victim})

    async def broker_kill(self) -> None:
        brokers = self.cluster.brokers
        assert brokers is not None
        i = self.rng.randrange(len(brokers.nodes))
        brokers.kill(i)
        self.history.nemesis("kill", {"role": "broker", "name": f"broker-{i}"})
        await asyncio.sleep(self.rng.uniform(*BROKER_DOWN_S))
        for attempt in range(1, BROKER_STARTS + 1):
            try:
                await asyncio.to_thread(brokers.restart, i)
            except KafkaUnavailable as exc:  # a loaded machine: two brokers still serve
                last = attempt == BROKER_STARTS
                f = "unrestarted" if last else "restart-failed"
                self.history.nemesis(f, {"name": f"broker-{i}", "error": str(exc)})
                continue
            self.history.nemesis("start", {"role": "broker", "name": f"broker-{i}"})
            return

    async def node_stop(self) -> None:
        """The zombie: its partitions must move while it is stopped, and after SIGCONT it
        must stop leading them at its old epochs."""
        victim = self.rng.choice(NODES)
        led = self._leading(victim)
        self.cluster.signal(victim, signal.SIGSTOP)
        stopped = time.monotonic()
        self.history.nemesis("stop", {"role": "node", "name": victim, "leading": led})
        await self._moved(victim, led, "stop")
        await asyncio.sleep(
            max(0.0, stopped + self.cluster.session_s + STOP_MARGIN_S - time.monotonic())
        )
        mark = self.cluster.output(victim).stat().st_size
        self.cluster.signal(victim, signal.SIGCONT)
        resumed = time.monotonic()
        self.history.nemesis("cont", {"role": "node", "name": victim})
        gone = await self._stale_gone(victim, led)
        text = self.cluster.output(victim).read_bytes()[mark:].decode(errors="replace")
        self.stale.append(
            {
                "node": victim,
                "leading": led,
                "stopped_s": round(resumed - stopped, 1),
                "stepped_down_s": None if gone is None else round(gone - resumed, 2),
                "fenced_appends": text.count("a newer owner took the partition over"),
                "newer_epoch_seen": text.count("was announced"),
                "rebalances": text.count("paused for a rebalance"),
            }
        )

    def _leading(self, node: str) -> dict[int, int]:
        """Partition -> epoch of what ``node`` leads, as the router last saw (the cluster
        settled before each fault, so that is what it leads now)."""
        return {p: epoch for p, (owner, epoch) in self.router.owners.items() if owner == node}

    async def _moved(self, victim: str, led: dict[int, int], why: str) -> None:
        """Until another node leads each partition ``victim`` led, at a higher epoch; each
        first sighting goes into the history."""
        left = dict(led)
        deadline = time.monotonic() + MOVE_S_MAX
        while left and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
            for p, (node, epoch) in self.router.owners.items():
                if p in left and node != victim and epoch > left[p]:
                    self.history.nemesis("moved", {"partition": p, "to": node, "after": why})
                    del left[p]
        if left:
            self.history.nemesis("unmoved", {"partitions": sorted(left), "after": why})

    async def _stale_gone(self, zombie: str, led: dict[int, int]) -> float | None:
        """When the zombie no longer leads any of ``led`` at its old epoch (monotonic), or
        None if it still did after ``STALE_S_MAX``."""
        deadline = time.monotonic() + STALE_S_MAX
        while time.monotonic() < deadline:
            body = await healthz(self.router.http, self.cluster.url(zombie))
            if body is not None:  # it answers: what does it lead?
                now = {int(p): int(info["epoch"]) for p, info in body["leading"].items()}
                if not any(now.get(p) == epoch for p, epoch in led.items()):
                    return time.monotonic()
            await asyncio.sleep(POLL_S)
        return None

    async def settle(self) -> None:
        """Until every node answers and every partition is led by one node, caught up."""
        deadline = time.monotonic() + SETTLE_S
        while time.monotonic() < deadline:
            if await self.router.settled(NODES):
                self.history.nemesis("settled", {})
                return
            await asyncio.sleep(POLL_S)
        self.history.nemesis("unsettled", {"owners": dict(self.router.owners)})


# -- the run ----------------------------------------------------------------------------------


async def run_failover(config: FailoverConfig) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="conveyor-failover-") as tmp:
        root = config.home or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cluster = Cluster(
            root, config.partitions, config.session_s, config.concurrency, config.prefetch
        )
        history = History(root / "history.jsonl")
        run = FailoverRun(cluster, history, root / "executions.log")
        faults: Faults | None = None
        try:
            await asyncio.to_thread(cluster.start_brokers)
            cluster.mint_keys()
            for node in NODES:
                cluster.spawn_node(node)
            async with Router(cluster.url, NODES, config.partitions, cluster.key) as router:
                faults = Faults(cluster, router, history, random.Random(config.seed))
                drained = await _phases(run, router, faults, config)
            cluster.stop_processes()
            log = await read_log(cluster.bootstrap, config.partitions, f"{cluster.name}-log")
            states = [cluster.home(n) / "state" for n in NODES]
            evidence = checker.Evidence(
                log_keys=log.keys,
                state_keys=state_keys(states),
                executions=_executions(run.journal),
                drained=drained,
            )
        finally:
            cluster.stop()
            history.close()
        least = checker.Thresholds(min_node_kills=1, min_agent_kills=0)
        result = checker.check(history.ops, evidence, least)
    stale = faults.stale if faults is not None else []
    head = {"test": "F1-failover", "seed": config.seed, "duration_s": config.seconds}
    figures = _figures(history.ops, result, log, stale)
    return {
        **head,
        **figures,
        **result,
        "valid": _verdict(result, figures, stale),
        "wall_s": round(time.monotonic() - started, 1),
    }


async def _phases(run: FailoverRun, router: Router, faults: Faults, config: FailoverConfig) -> bool:
    rng = random.Random(config.seed + 1)
    await router.wait_settled(NODES, START_S, run.cluster.logs)
    for node in NODES:
        faults.cluster.spawn_agent(node)
    await _warm_up(run, router)
    until = time.monotonic() + config.seconds
    pace = config.clients / config.rate
    loads = [
        _client(run, router, p, until, pace, random.Random(rng.random()))
        for p in range(config.clients)
    ]
    sampler = _sampler(run, router, until, random.Random(rng.random()))
    await asyncio.gather(faults.run(until), sampler, *loads)
    await faults.settle()
    run.history.nemesis("heal", {})
    await _resolve(run, router)
    return await _drain(run, router, config.drain_s)


async def _warm_up(run: FailoverRun, router: Router) -> None:
    """An enqueue answered on every partition: each node's agent registered the task type."""
    deadline = time.monotonic() + START_S
    todo = set(range(router.partitions))
    n = 0
    while todo:
        if time.monotonic() > deadline:
            raise RuntimeError(f"partitions {sorted(todo)} took no enqueue\n{run.cluster.logs()}")
        key = f"warm-up-{n}"
        n += 1
        p = router.partition_for_key(key)
        if p in todo and await enqueue_recorded(run, router, 0, key, task=TASK):
            if key in run.acked:
                todo.discard(p)
            continue
        await asyncio.sleep(0.05 if p not in todo else 0.2)


# -- figures ----------------------------------------------------------------------------------


def _figures(
    ops: list[Op], result: dict[str, Any], log: LogEvidence, stale: list[dict[str, Any]]
) -> dict[str, Any]:
    kills = result["faults"]["kill9"]
    failover, from_healthz = _failover(ops, "kill")
    stops, _ = _failover(ops, "stop")
    return {
        "node_kills": kills.get("node", 0),
        "broker_kills": kills.get("broker", 0),
        "stops": sum(1 for op in ops if op.process == NEMESIS and op.f == "stop"),
        "failover_p50_s": checker._percentile(failover, 0.5),
        "failover_p99_s": checker._percentile(failover, 0.99),
        "failover_s": [round(s, 2) for s in failover],
        "failover_from_healthz": from_healthz,
        "stop_failover_s": [round(s, 2) for s in stops],
        "unmoved": sum(1 for op in ops if op.process == NEMESIS and op.f == "unmoved"),
        "unsettled": sum(1 for op in ops if op.process == NEMESIS and op.f == "unsettled"),
        "unrestarted": sum(1 for op in ops if op.process == NEMESIS and op.f == "unrestarted"),
        "stale_records": log.stale_records,
        "stale_examples": log.stale_examples[:5],
        "epochs_announced": log.announced,
        "zombies": stale,
    }


def _failover(ops: list[Op], fault: str) -> tuple[list[float], int]:
    """Seconds from each ``fault`` of a node to the first dispatch of each partition it led,
    in the window before that node came back (see the module docstring); and how many of
    them the first sighting on ``/healthz`` stood in for."""
    starts = _lease_starts(ops)
    nemesis = [op for op in ops if op.process == NEMESIS]
    out: list[float] = []
    from_healthz = 0
    for i, op in enumerate(nemesis):
        if op.f != fault or op.value.get("role") != "node":
            continue
        at_ms = op.time_ns // 1_000_000
        end_ms = _window_end(nemesis[i + 1 :], str(op.value["name"]))
        seen = {
            int(m.value["partition"]): m.time_ns // 1_000_000
            for m in nemesis[i + 1 :]
            if m.f == "moved" and m.value["after"] == fault and m.time_ns // 1_000_000 < end_ms
        }
        for p in (int(k) for k in op.value["leading"]):
            first = min((ms for ms in starts.get(p, []) if at_ms < ms < end_ms), default=None)
            if first is None and p in seen:
                first = seen[p]
                from_healthz += 1
            if first is not None:
                out.append((first - at_ms) / 1000)
    return out, from_healthz


def _lease_starts(ops: list[Op]) -> dict[int, list[int]]:
    """Partition -> the start (ms) of every attempt the reads saw."""
    starts: dict[int, set[int]] = {}
    for op in ops:
        if op.f in ("read", "poll", "final-read") and op.type == "ok":
            p = int(str(op.value["task_id"])[:4], 16)
            starts.setdefault(p, set()).update(op.value.get("started_ms", []))
    return {p: sorted(ms) for p, ms in starts.items()}


def _window_end(later: list[Op], node: str) -> int:
    for op in later:
        if op.f in ("start", "cont") and op.value.get("name") == node:
            return op.time_ns // 1_000_000
    return 2**62


def _verdict(
    result: dict[str, Any], figures: dict[str, Any], stale: list[dict[str, Any]]
) -> bool | str:
    if result["valid"] is False or figures["stale_records"]:
        return False
    if any(z["stepped_down_s"] is None for z in stale):
        return False  # a zombie that went on leading at its old epoch
    if figures["unmoved"]:
        return False  # a dead node's partitions still unled after MOVE_S_MAX
    faults = figures["node_kills"] and figures["broker_kills"] and figures["stops"]
    if result["valid"] is not True or not faults or figures["unrestarted"]:
        return "unknown"
    return True
