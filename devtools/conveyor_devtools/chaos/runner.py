"""P1, P4, P5, P6 of tests/PLAN.md: total-queue under kill -9 (``conveyor chaos kill9``,
``--scenario``), and the long mixed soak (``conveyor chaos soak``).

Scenarios differ only in the nemesis and the agents' prefetch (``SCENARIOS``):
    p1     kill -9 of the node, agents and guests
    p4     crash loops: the node killed again while it recovers
    p5     the node crashes at a failpoint between a lease grant and its delivery
    p6     agents killed while they hold prefetched leases (deep prefetch, agent kills only)
    soak   all of the above, mixed, for as long as a person wants to wait

Phases: start a node and agents on a temp home; drive ``clients`` concurrent enqueuers (each
key unique, SDK transport retries OFF so every reply the history records is the one the server
sent) while the nemesis kill -9s the node, the agents and guests; heal; resolve the keys still
without an answer; drain (every acked task terminal, with a deadline); stop the node and read
its log and state offline; check.

Lost replies: an enqueue whose reply is lost is recorded ``info`` and then retried with the
SAME idempotency key as a new, separate operation. That is what the SDK does (it resends the
same body) and what P1 prescribes, and it turns each lost reply into a test of idempotency
across a crash: if the first request did commit, the retry must answer with the same task id.
Each attempt stays its own op, so no ``info`` is ever rewritten into ``ok``.
"""

from __future__ import annotations

import asyncio
import random
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from conveyor.aclient import AsyncClient, AsyncTaskHandle
from conveyor.errors import ContractError, NotFound
from conveyor.frozen import frozen
from conveyor.wire import TaskInfo
from conveyor_devtools.chaos import checker
from conveyor_devtools.chaos.history import History
from conveyor_devtools.chaos.nemesis import ChaosCluster, Nemesis, NemesisConfig

APP = "chaos"
TASK = "work"
REQUEST_TIMEOUT_S = 5.0  # a reply slower than this is indeterminate (info)
RETRY_PAUSE_S = (0.05, 0.3)  # before resending a key whose reply was lost
SAMPLE_EVERY_S = 0.25  # the I3 reader: a few acked tasks per round, through the API
SAMPLE_SIZE = 8
RESOLVE_ROUNDS = 5  # after the heal, retries of keys that never got an answer
READERS = 8  # concurrent GETs of the drain


@frozen
class Config:
    seconds: float = 90.0  # of load under faults
    seed: int = 0
    clients: int = 6
    rate: float = 80.0  # enqueues/s over all clients (bounded: the box has 2 cores)
    agents: int = 1
    partitions: int = 4
    concurrency: int = 4
    prefetch: int = 4
    drain_s: float = 60.0
    nemesis: NemesisConfig = field(default_factory=NemesisConfig)
    thresholds: checker.Thresholds = field(default_factory=checker.Thresholds)
    home: Path | None = None  # keep the run's files here (default: a temp dir, removed)
    test: str = "P1-total-queue-kill9"  # the name in the result line


# name -> (test name, nemesis, agents' prefetch, (node, agent) kills a run must show)
SCENARIOS: dict[str, tuple[str, NemesisConfig, int, tuple[int, int]]] = {
    "p1": ("P1-total-queue-kill9", NemesisConfig(), 4, (1, 1)),
    "p4": (
        "P4-crash-loop-during-recovery",
        NemesisConfig(interval_s=(2.0, 5.0), weights=(0.1, 0.2, 0.1, 0.6)),
        4,
        (3, 0),
    ),
    "p5": (
        "P5-kill-between-lease-granted-and-delivered",
        NemesisConfig(weights=(0.0, 0.5, 0.5, 0.0), failpoints="lease-granted=0.03"),
        4,
        (1, 1),
    ),
    "p6": (
        "P6-agent-killed-holding-prefetched-leases",
        NemesisConfig(interval_s=(1.0, 3.0), weights=(0.0, 1.0, 0.0, 0.0)),
        32,
        (0, 1),
    ),
    "soak": (
        "soak-mixed",
        NemesisConfig(weights=(0.3, 0.3, 0.2, 0.2), failpoints="lease-granted=0.002"),
        16,
        (1, 1),
    ),
}


def scenario(name: str, **overrides: Any) -> Config:
    """The ``Config`` of a scenario of ``SCENARIOS``; ``overrides`` set other fields."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(SCENARIOS)}")
    test, nemesis, prefetch, (node_kills, agent_kills) = SCENARIOS[name]
    least = checker.Thresholds(min_node_kills=node_kills, min_agent_kills=agent_kills)
    thresholds = overrides.pop("thresholds", None) or least
    return Config(test=test, nemesis=nemesis, prefetch=prefetch, thresholds=thresholds, **overrides)


class Client(Protocol):
    """What the phases ask of a client: ``AsyncClient``, or a router over a cluster's nodes
    (``failover.py``)."""

    async def enqueue(
        self, task: str, payload: Any, *, idempotency_key: str
    ) -> AsyncTaskHandle[Any]: ...

    async def get(self, task_id: str) -> TaskInfo: ...


class Recording(Protocol):
    """What the load, the reads and the drain share: ``Run``, or another fault run's own
    (``failover.py``)."""

    history: History
    journal: Path
    acked: dict[str, str]
    pending: set[str]


@dataclass
class Run:
    """The state one run shares between its coroutines."""

    cluster: ChaosCluster
    history: History
    journal: Path
    acked: dict[str, str] = field(default_factory=dict)  # key -> task id
    pending: set[str] = field(default_factory=set)  # keys without an ok yet


async def run_kill9(config: Config) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="conveyor-chaos-") as tmp:
        root = config.home or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cluster = ChaosCluster(
            root, config.partitions, config.agents, config.concurrency, config.prefetch
        )
        cluster.failpoints = config.nemesis.failpoints  # armed from the node's first start
        history = History(root / "history.jsonl")
        run = Run(cluster, history, root / "executions.log")
        try:
            await cluster.start()
            drained = await _phases(run, config)
        finally:
            cluster.stop()
            history.close()
        evidence = _evidence(root / "node", run.journal, drained)
        result = checker.check(history.ops, evidence, config.thresholds)
    head = {"test": config.test, "seed": config.seed, "duration_s": config.seconds}
    return {**head, **result, "wall_s": round(time.monotonic() - started, 1)}


async def _phases(run: Run, config: Config) -> bool:
    rng = random.Random(config.seed)
    nemesis = Nemesis(run.cluster, run.history, random.Random(rng.random()), config.nemesis)
    async with AsyncClient(
        run.cluster.url, run.cluster.key, app=APP, retries=0, timeout=REQUEST_TIMEOUT_S
    ) as client:
        await _warm_up(run, client)
        until = time.monotonic() + config.seconds
        pace = config.clients / config.rate
        loads = [
            _client(run, client, p, until, pace, random.Random(rng.random()))
            for p in range(config.clients)
        ]
        sampler = _sampler(run, client, until, random.Random(rng.random()))
        await asyncio.gather(nemesis.run(until), sampler, *loads)
        await nemesis.heal()
        await _resolve(run, client)
        return await _drain(run, client, config.drain_s)


async def _warm_up(run: Run, client: Client) -> None:
    """Until the agent has registered the task type, an enqueue is ``unknown_task_type``."""
    deadline = time.monotonic() + 60.0
    while not await enqueue_recorded(run, client, 0, "warm-up"):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no enqueue succeeded in 60 s\n{run.cluster.logs()}")
        await asyncio.sleep(0.2)


async def _client(
    run: Recording, client: Client, process: int, until: float, pace: float, rng: random.Random
) -> None:
    """Closed loop at about ``1 / pace`` ops/s: a new key, resent until it gets an answer."""
    n = 0
    while time.monotonic() < until:
        key = f"p{process}-{n}"
        n += 1
        while not await enqueue_recorded(run, client, process, key) and time.monotonic() < until:
            await asyncio.sleep(rng.uniform(*RETRY_PAUSE_S))
        await asyncio.sleep(pace * rng.uniform(0.5, 1.5))


async def enqueue_recorded(
    run: Recording,
    client: Client,
    process: int,
    key: str,
    payload: dict[str, Any] | None = None,
    task: str = TASK,
) -> bool:
    """One recorded attempt of every fault run; True once the key has a definite answer (ok
    or fail). The payload defaults to the run's journal, where the handler notes executions."""
    run.pending.add(key)
    op = run.history.invoke(process, "enqueue", {"key": key})
    payload = {"log": str(run.journal)} if payload is None else payload
    try:
        handle = await client.enqueue(task, payload, idempotency_key=key)
    except ContractError as exc:  # the server said no; a rejected request changes nothing
        run.history.complete(op, "fail", {"error": exc.code})
        return exc.code != "unknown_task_type"
    except Exception as exc:  # reset, timeout, 5xx: it may or may not have happened
        run.history.complete(op, "info", {"error": type(exc).__name__})
        return False
    run.history.complete(op, "ok", {"task_id": handle.id, "created": handle.created})
    run.acked.setdefault(key, handle.id)
    run.pending.discard(key)
    return True


async def _sampler(run: Recording, client: Client, until: float, rng: random.Random) -> None:
    """Reads a few acked tasks per round while faults happen, so I3 (a terminal state never
    changes) has observations made across crashes, not only the final ones."""
    while time.monotonic() < until:
        await asyncio.sleep(SAMPLE_EVERY_S)
        ids = list(run.acked.values())
        for task_id in rng.sample(ids, min(SAMPLE_SIZE, len(ids))):
            await _read(run, client, "read", task_id)


async def _read(run: Recording, client: Client, f: str, task_id: str) -> dict[str, Any] | None:
    """GET one task and record what it showed (status None: not found); None if the reply
    was lost."""
    op = run.history.invoke(-1, f, {"task_id": task_id})
    try:
        info = await client.get(task_id)
    except NotFound:
        return run.history.complete(op, "ok", {"status": None}).value
    except Exception as exc:
        run.history.complete(op, "info", {"error": type(exc).__name__})
        return None
    seen: dict[str, Any] = {"status": info.status, "finished_ms": info.finished_ms}
    seen["attempt"] = info.attempt
    seen["started_ms"] = [a.started_ms for a in info.attempts if a.started_ms is not None]
    return run.history.complete(op, "ok", seen).value


async def _resolve(run: Recording, client: Client) -> None:
    """After the heal, resend each key that never got an answer (same key, new ops)."""
    for _ in range(RESOLVE_ROUNDS):
        for key in sorted(run.pending):
            await enqueue_recorded(run, client, 0, key)
        if not run.pending:
            return
        await asyncio.sleep(0.5)


async def _drain(run: Recording, client: Client, deadline_s: float) -> bool:
    """Read every acked task until it is terminal; the last read of each is its final read.
    False if some task was still live (or unreadable) at the deadline."""
    deadline = time.monotonic() + deadline_s
    todo = sorted(set(run.acked.values()))
    while todo:
        last = time.monotonic() >= deadline
        todo = await _read_round(run, client, todo, final_all=last)
        if last:
            return True  # every task got a final read; the checker judges the stuck ones
        if todo:
            await asyncio.sleep(0.5)
    return True


async def _read_round(
    run: Recording, client: Client, ids: list[str], *, final_all: bool
) -> list[str]:
    """One pass of reads; a terminal read (or any read, on the last pass) is also recorded as
    the task's final read. Returns the ids to read again."""
    again: list[str] = []
    lock = asyncio.Semaphore(READERS)

    async def one(task_id: str) -> None:
        async with lock:
            seen = await _read(run, client, "poll", task_id)
        if seen is not None and (seen["status"] in checker.TERMINAL or final_all):
            run.history.add(-1, "ok", "final-read", seen)
        else:
            again.append(task_id)

    await asyncio.gather(*(one(t) for t in ids))
    return sorted(again)


# -- evidence read offline, after the node stopped ------------------------------------------


def _evidence(node_home: Path, journal: Path, drained: bool) -> checker.Evidence:
    return checker.Evidence(
        log_keys=_log_keys(node_home / "log"),
        state_keys=_state_keys(node_home / "state"),
        executions=_executions(journal),
        drained=drained,
    )


def _log_keys(log_root: Path) -> list[str | None]:
    """The idempotency key of every task spec in the log's ``EnqueueTasks`` records."""
    from conveyor.streams.log.tools import inspect

    keys: list[str | None] = []
    for _, _, payload in inspect(log_root):
        keys.extend(enqueued_keys(payload))
    return keys


def enqueued_keys(payload: bytes) -> list[str | None]:
    """The idempotency keys of the task specs of one record, if it is an ``EnqueueTasks``."""
    from conveyor.schemas import codec, types

    envelope = codec.decode_envelope(payload)
    if codec.kind_of(envelope)[0] != "EnqueueTasks":
        return []  # only enqueues can create tasks: the others need not even be decoded
    record = codec.decode_body(envelope)
    assert isinstance(record, types.EnqueueTasks)
    return [codec.TASK_SPEC.decode(raw).idempotency_key for raw in record.tasks]


def _state_keys(state_root: Path) -> dict[str, str | None]:
    """Task id -> idempotency key of every task in the node's RocksDB state."""
    from conveyor.store.rocksdb import RocksKV
    from conveyor.store.tables import Tables

    out: dict[str, str | None] = {}
    for path in sorted(p for p in state_root.iterdir() if p.is_dir()):
        kv = RocksKV(path)
        try:
            tables = Tables(kv)
            for task in tables.tasks():
                spec = tables.spec(task.task_id)
                out[task.task_id] = spec.idempotency_key if spec is not None else None
        finally:
            kv.close()
    return out


def _executions(journal: Path) -> Counter[str]:
    if not journal.exists():
        return Counter()
    return Counter(line.split()[0] for line in journal.read_text().splitlines() if line.strip())
