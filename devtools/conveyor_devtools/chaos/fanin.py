"""W1 of tests/PLAN.md: fan-in barriers under kill -9 (``conveyor chaos fan-in``).

Phases: start a node and agents; start ``workflows`` runs of the chaos app's ``fan_in`` (each
fans out to a seeded number of ``child`` tasks, a seeded few of which fail FATAL) through
recorded enqueues with idempotency keys; half a second later kill -9 the node (every barrier is open
then), and let the nemesis kill -9 the node, the agents and guests until ``seconds`` after the
first enqueue; heal; drain (every acked workflow terminal, with a deadline); let the outboxes
ship; stop the node and read its logs and state offline; check.

The checks, per acked workflow:
- it SUCCEEDED, and its result equals ``app.expected`` computed here: every child's result in
  order and every failure in its slot, so a barrier that fired before its last child landed,
  or lost or doubled a landing, shows as a wrong result;
- its barrier fired exactly once: firing commits the parallel step, so the workflow has one
  COMMITTED step event of it (events are delivered at least once: they are counted by their
  log offset, from the events log and the outbox rows not yet shipped; a ``TaskRequeued``
  would not do, a retry after a lost lease emits one too);
- each of its children ended as planned (SUCCEEDED, or FAILED when it fails by design), and no
  child is missing or extra.
Anti-vacuity: the run is ``unknown`` unless every workflow was acked, at least one fanned out
past 1,000 children (so children spilled to other partitions and landed by message), and the
node was killed while some barrier was still open.
"""

from __future__ import annotations

import asyncio
import json
import random
import tempfile
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.aclient import AsyncClient
from conveyor.frozen import frozen
from conveyor.schemas.types import Task
from conveyor.streams.machine.handlers.workflows import SPILL_AFTER
from conveyor_devtools.chaos import app as chaos_app
from conveyor_devtools.chaos import history as history_
from conveyor_devtools.chaos.checker import _kills
from conveyor_devtools.chaos.history import History
from conveyor_devtools.chaos.nemesis import ChaosCluster, Nemesis, NemesisConfig
from conveyor_devtools.chaos.runner import APP, Run, _executions, enqueue_recorded

WORKFLOW = "fan_in"
CHILD = "child"
PARALLEL = "children"  # the step name of fan_in's ctx.parallel
SHIP_WAIT_S = 2.0  # after the drain: the outboxes ship their last events
RESOLVE_ROUNDS = 5
FIRST_KILL_AFTER_S = 0.5  # after the last workflow was acked: its children still run


# Node kills above all: they are what can lose a landing or fire a barrier twice.
NODE_HEAVY = NemesisConfig(interval_s=(1.0, 3.0), weights=(0.6, 0.2, 0.2, 0.0))


@frozen
class FanInConfig:
    workflows: int = 6
    children: tuple[int, int] = (50, 1_500)  # per workflow: over 1,000 spills across partitions
    fail_p: float = 0.1  # of a child failing by design
    seconds: float = 30.0  # of faults, from the first enqueue
    seed: int = 0
    agents: int = 1
    partitions: int = 4
    concurrency: int = 4
    prefetch: int = 16
    drain_s: float = 180.0
    nemesis: NemesisConfig = field(default_factory=lambda: NODE_HEAVY)
    home: Path | None = None


@frozen
class Plan:
    key: str
    n: int
    fail: list[int]


def plan(config: FanInConfig) -> list[Plan]:
    rng = random.Random(config.seed)
    plans = []
    for w in range(config.workflows):
        n = rng.randint(*config.children)
        fail = sorted(i for i in range(n) if rng.random() < config.fail_p)
        plans.append(Plan(key=f"w1-{config.seed}-{w}", n=n, fail=fail))
    return plans


async def run_fan_in(config: FanInConfig) -> dict[str, Any]:
    started = time.monotonic()
    plans = plan(config)
    with tempfile.TemporaryDirectory(prefix="conveyor-fanin-") as tmp:
        root = config.home or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cluster = ChaosCluster(
            root, config.partitions, config.agents, config.concurrency, config.prefetch
        )
        history = History(root / "history.jsonl")
        run = Run(cluster, history, root / "executions.log")
        finals: dict[str, Any] = {}
        try:
            await cluster.start()
            await _phases(run, config, plans, finals)
        finally:
            cluster.stop()
            history.close()
        seen = _read_node(root / "node")
        executions = _executions(run.journal)
    result = _check(plans, run, finals, seen, executions, history)
    head = {"test": "W1-fan-in-barrier-kill9", "seed": config.seed, "duration_s": config.seconds}
    return {**head, **result, "wall_s": round(time.monotonic() - started, 1)}


async def _phases(run: Run, config: FanInConfig, plans: list[Plan], finals: dict[str, Any]) -> None:
    rng = random.Random(config.seed + 1)
    nemesis = Nemesis(run.cluster, run.history, rng, config.nemesis)
    async with AsyncClient(
        run.cluster.url, run.cluster.key, app=APP, retries=0, timeout=5.0
    ) as client:
        until = time.monotonic() + config.seconds
        for p in plans:
            await _start(run, client, p)
        # The first strike at a known moment: the node dies while the children surely still
        # run, every barrier open. Then the nemesis, for the rest of the fault window.
        await asyncio.sleep(FIRST_KILL_AFTER_S)
        await nemesis.strike_now("node")
        await nemesis.run(until)
        await nemesis.heal()
        for _ in range(RESOLVE_ROUNDS):  # keys still unanswered, now that nothing is killed
            for p in plans:
                if p.key in run.pending:
                    await _start(run, client, p)
        await _drain(client, run, finals, config.drain_s)
    await asyncio.sleep(SHIP_WAIT_S)


async def _start(run: Run, client: AsyncClient, p: Plan) -> bool:
    payload = {"log": str(run.journal), "wf": p.key, "n": p.n, "fail": p.fail}
    return await enqueue_recorded(run, client, 0, p.key, payload, WORKFLOW)


async def _drain(client: AsyncClient, run: Run, finals: dict[str, Any], deadline_s: float) -> None:
    """Wait for every acked workflow to end (or the deadline); its last reading is final."""
    deadline = time.monotonic() + deadline_s
    for key, task_id in sorted(run.acked.items()):
        while True:
            left = deadline - time.monotonic()
            try:
                info = await client.wait(task_id, timeout=max(0.1, min(left, 5.0)))
            except Exception:  # a lost reply: read again
                info = None
            if info is not None:
                finals[key] = info
                if info.finished_ms is not None:
                    break
            if time.monotonic() >= deadline:
                break


@dataclass
class NodeView:
    """What the node's files say, read after it stopped."""

    tasks: dict[str, Task] = field(default_factory=dict)
    payloads: dict[str, Any] = field(default_factory=dict)  # task id -> decoded payload
    fires: dict[str, set[int]] = field(default_factory=lambda: defaultdict(set))  # offsets


def _read_node(home: Path) -> NodeView:
    from conveyor.schemas import codec
    from conveyor.store import keys
    from conveyor.store.rocksdb import RocksKV
    from conveyor.store.tables import Tables
    from conveyor.streams.log.tools import inspect

    view = NodeView()
    batches = [payload for _, _, payload in inspect(home / "events")]
    for path in sorted(p for p in (home / "state").iterdir() if p.is_dir()):
        kv = RocksKV(path)
        try:
            tables = Tables(kv)
            for task in tables.tasks():
                view.tasks[task.task_id] = task
                raw = tables.payload(task.task_id)
                view.payloads[task.task_id] = json.loads(raw) if raw else None
            batches.extend(value for _, value in kv.scan(keys.OUTBOX))
        finally:
            kv.close()
    for raw in batches:
        for step in codec.EVENT_BATCH.decode(raw).steps:
            if step.identity.startswith(f"{PARALLEL}#") and step.state == "COMMITTED":
                view.fires[step.task_id].add(step.version)
    return view


def _check(
    plans: list[Plan],
    run: Run,
    finals: dict[str, Any],
    view: NodeView,
    executions: Counter[str],
    history: History,
) -> dict[str, Any]:
    children: dict[str, list[Task]] = defaultdict(list)
    for task_id, task in view.tasks.items():
        body = view.payloads.get(task_id)
        if task.task_type == CHILD and isinstance(body, dict):
            children[body["wf"]].append(task)
    wrong_result: list[dict[str, Any]] = []
    not_succeeded: list[str] = []
    fires: Counter[int] = Counter()
    wrong_children = missing_children = 0
    child_total = 0
    for p in plans:
        wf_id = run.acked.get(p.key)
        if wf_id is None:
            continue
        wf = view.tasks.get(wf_id)
        if wf is None or wf.status.value != "SUCCEEDED":
            not_succeeded.append(p.key)
            continue
        result = json.loads(wf.result) if wf.result else None
        if result != chaos_app.expected(p.n, p.fail):
            wrong_result.append({"key": p.key, "got": result})
        fires[len(view.fires.get(wf_id, ()))] += 1
        mine = children.get(p.key, [])
        child_total += len(mine)
        missing_children += abs(p.n - len({view.payloads[c.task_id]["i"] for c in mine}))
        failing = set(p.fail)
        for c in mine:
            want = "FAILED" if view.payloads[c.task_id]["i"] in failing else "SUCCEEDED"
            wrong_children += c.status.value != want
    kills = _kills(history.ops)
    # Node kills while some barrier was still open: before the last workflow finished.
    last_ms = max(
        (t.finished_ms or 0 for t in view.tasks.values() if t.task_type == WORKFLOW), default=0
    )
    open_kills = sum(
        op.time_ns // 1_000_000 < last_ms
        for op in history.ops
        if op.process == history_.NEMESIS and op.f == "kill" and op.value["role"] == "node"
    )
    runs = [executions[t.task_id] for ts in children.values() for t in ts]
    safe = (
        not wrong_result
        and not not_succeeded
        and set(fires) <= {1}
        and wrong_children == 0
        and missing_children == 0
    )
    spilled = sum(p.n > SPILL_AFTER for p in plans)
    nontrivial = open_kills > 0 and spilled > 0 and len(run.acked) == len(plans)
    return {
        "valid": (True if nontrivial else "unknown") if safe else False,
        "workflows": {"planned": len(plans), "acked": len(run.acked), "spilled": spilled},
        "children": {
            "total": child_total,
            "wrong_state": wrong_children,
            "missing_or_extra": missing_children,
            "executions_mean": round(sum(runs) / len(runs), 3) if runs else 0,
            "executions_max": max(runs, default=0),
        },
        "barriers": {
            "fired_once": fires[1],
            "fired_more": sum(n for k, n in fires.items() if k > 1),
            "fire_unseen": fires[0],
        },
        "not_succeeded": not_succeeded,
        "wrong_results": wrong_result,
        "faults": {"kill9": kills, "node_kills_with_barriers_open": open_kills},
    }
