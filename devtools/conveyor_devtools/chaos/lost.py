"""Lost replies (tests/PLAN.md) (``conveyor chaos lost-replies``).

Two ``LossyProxy`` in front of one node: the clients enqueue through the first, which loses
the reply of a ``POST /v1/tasks`` with probability ``p`` after the node answered; the agents
talk to the node through the second, which loses replies of ``POST /worker/complete``. The SDK
resends an enqueue with the same idempotency key, and the agent resends a completion with the
same lease id. Then a drain (straight to the node) and the checks:

- one task per key, in the replies and in the state (the checker's ``duplicated``), each key
  acked, each task in one terminal state (no forks, nothing stuck, nothing lost);
- completions idempotent: each task shows one successful attempt, and its result is that
  attempt's number (the handler returns it), and few re-executions;
- anti-vacuity: replies were dropped on both proxies, and some enqueue retries were answered
  ``created: false`` (the first request had committed).
"""

from __future__ import annotations

import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from conveyor.aclient import AsyncClient
from conveyor.frozen import frozen
from conveyor_devtools.chaos import checker
from conveyor_devtools.chaos.history import History
from conveyor_devtools.chaos.nemesis import AGENT_TIMES, APP_REF, TRUSTED, ChaosCluster, _popen
from conveyor_devtools.chaos.proxy import LossyProxy
from conveyor_devtools.chaos.runner import APP, Run, _drain, _evidence, enqueue_recorded

ENQUEUE = (("POST", "/v1/tasks"),)
COMPLETE = (("POST", "/worker/complete"),)


@frozen
class LostConfig:
    tasks: int = 200
    clients: int = 4
    p: float = 0.2  # probability of losing a droppable reply
    seed: int = 0
    agents: int = 1
    partitions: int = 4
    drain_s: float = 60.0
    home: Path | None = None


class ProxiedCluster(ChaosCluster):
    """Agents reach the node at ``agent_url`` (the completion proxy)."""

    agent_url: str = ""

    def spawn_agent(self, k: int) -> None:
        name = f"agent-{k}"
        self.root.mkdir(parents=True, exist_ok=True)
        args = [
            "agent",
            "--app",
            APP_REF,
            "--url",
            self.agent_url,
            "--api-key",
            self.agent_key,
            *TRUSTED,
        ]
        slots = ["--concurrency", str(self.concurrency), "--prefetch", str(self.prefetch)]
        command = [sys.executable, "-m", "conveyor.cli", *args, *slots, *AGENT_TIMES]
        with open(self.root / f"{name}.out", "ab") as out:
            self.procs[name] = _popen(command, out)


async def run_lost_replies(config: LostConfig) -> dict[str, Any]:
    started = time.monotonic()
    rng = random.Random(config.seed)
    with tempfile.TemporaryDirectory(prefix="conveyor-lost-") as tmp:
        root = config.home or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cluster = ProxiedCluster(root, config.partitions, 0, 4, 4)
        history = History(root / "history.jsonl")
        run = Run(cluster, history, root / "executions.log")
        front = back = None
        finals: dict[str, Any] = {}
        try:
            await cluster.start()  # the node only (agents=0): agents need the proxy first
            front = LossyProxy(cluster.port, config.p, random.Random(rng.random()), ENQUEUE)
            back = LossyProxy(cluster.port, config.p, random.Random(rng.random()), COMPLETE)
            await front.start()
            await back.start()
            cluster.agent_url = back.url
            for k in range(config.agents):
                cluster.spawn_agent(k)
            drained = await _phases(run, config, front.url, rng, finals)
        finally:
            cluster.stop()
            history.close()
            for proxy in (front, back):
                if proxy is not None:
                    await proxy.close()
        evidence = _evidence(root / "node", run.journal, drained)
        thresholds = checker.Thresholds(min_acks=config.tasks, min_node_kills=0, min_agent_kills=0)
        result = checker.check(history.ops, evidence, thresholds)
    assert front is not None and back is not None
    created_false = sum(
        1 for op in history.ops if op.f == "enqueue" and op.type == "ok" and not op.value["created"]
    )
    double_success = sum(
        1
        for info in finals.values()
        if sum(1 for a in info.attempts if a.outcome == "SUCCEEDED") > 1
    )
    wrong_result = sum(
        1 for info in finals.values() if info.status == "SUCCEEDED" and info.result != info.attempt
    )
    lost_replies = {
        "enqueue_dropped": sum(front.dropped.values()),
        "enqueue_forwarded": front.forwarded["POST /v1/tasks"],
        "complete_dropped": sum(back.dropped.values()),
        "complete_forwarded": back.forwarded["POST /worker/complete"],
        "created_false": created_false,
        "double_success": double_success,
        "wrong_result": wrong_result,
    }
    dropped = lost_replies["enqueue_dropped"] + lost_replies["complete_dropped"]
    result["faults"] = {"kill9": {}, "lost_reply": dropped}
    result["lost_replies"] = lost_replies
    nontrivial = (
        result["nontrivial"]
        and lost_replies["enqueue_dropped"] > 0
        and lost_replies["complete_dropped"] > 0
        and created_false > 0
    )
    result["nontrivial"] = nontrivial
    if double_success or wrong_result:
        result["valid"] = False
    elif result["valid"] is True and not nontrivial:
        result["valid"] = "unknown"
    head = {"test": "T7-lost-replies", "seed": config.seed, "p": config.p}
    return {**head, **result, "wall_s": round(time.monotonic() - started, 1)}


async def _phases(
    run: Run, config: LostConfig, front_url: str, rng: random.Random, finals: dict[str, Any]
) -> bool:
    key = run.cluster.key
    payload = {"log": str(run.journal)}
    async with AsyncClient(front_url, key, app=APP, timeout=5.0) as client:
        await _warm_up(run, client, payload)
        keys = [f"k-{config.seed}-{n}" for n in range(config.tasks)]
        shares = [keys[i :: config.clients] for i in range(config.clients)]
        await asyncio.gather(
            *(_client(run, client, p, share, payload) for p, share in enumerate(shares))
        )
    async with AsyncClient(run.cluster.url, key, app=APP, timeout=5.0) as direct:
        drained = await _drain(run, direct, config.drain_s)
        for task_id in sorted(set(run.acked.values())):
            try:
                finals[task_id] = await direct.get(task_id)
            except Exception:  # the final read in the history already says what was seen
                continue
    return drained


async def _warm_up(run: Run, client: AsyncClient, payload: dict[str, Any]) -> None:
    deadline = time.monotonic() + 60.0
    while not await enqueue_recorded(run, client, 0, "warm-up", payload):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no enqueue succeeded in 60 s\n{run.cluster.logs()}")
        await asyncio.sleep(0.2)


async def _client(
    run: Run, client: AsyncClient, process: int, keys: list[str], payload: dict[str, Any]
) -> None:
    for key in keys:
        for _ in range(5):  # the SDK already retried; an info here is resent as a new op
            if await enqueue_recorded(run, client, process, key, payload):
                break
