"""P2 of tests/PLAN.md: the zombie lease holder (``conveyor chaos zombie``).

Phases: start a node and two agents with a short lease; enqueue a bounded batch of tasks whose
handler sleeps a little and then appends ``task attempt guest_pid`` to the journal; once work
is under way, SIGSTOP agent-0 and its guests (the zombie) for ``pause_leases`` times the lease,
so its leases lapse and agent-1 re-leases and finishes those tasks; read, while the zombie is
still stopped, which attempts it held; SIGCONT it and give it time to report; drain; stop; check.

What the zombie does after SIGCONT, per held attempt: its guest may finish the handler (a
journal line written after the resume by a stopped guest: a late execution), then either a
heartbeat answers LOST (logged ``lease N lost; dropped``) or its completion is sent and refused
(logged ``completion of T dropped``). Each of those is a stale op; each must be rejected, and
the final state must carry the second lease's outcome: the winning attempt is later than the
zombie's, ran on another agent, and the result (the handler returns its attempt number) is
that attempt's. ``stale_ops.accepted`` counts held attempts whose outcome the state shows.

A pause SHORTER than the lease (``pause_leases`` below ``SHORT_PAUSE_MAX``) is N1 of
tests/PLAN.md instead: a live agent that stalls, or loses the network, for less than its
lease. No lease may lapse and no task may be handed to the other agent: the held attempts
must be the ones that finish (``spurious_releases`` = 0).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import re
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.aclient import AsyncClient
from conveyor.frozen import frozen
from conveyor_devtools.chaos import checker
from conveyor_devtools.chaos.history import History
from conveyor_devtools.chaos.nemesis import AGENT_TIMES, APP_REF, TRUSTED, ChaosCluster, _popen
from conveyor_devtools.chaos.runner import (
    APP,
    READERS,
    Run,
    _drain,
    _evidence,
    enqueue_recorded,
)

LEASE_S = 2.0  # AGENT_TIMES: the agents' --lease-s
HEARTBEAT_S = 0.5  # AGENT_TIMES: the agents' --heartbeat-s
# Below this a pause is "shorter than the lease" (N1): a heartbeat sent just before the pause
# must still land, with a margin, before the lease it renewed runs out.
SHORT_PAUSE_MAX = (LEASE_S - HEARTBEAT_S - 0.3) / LEASE_S
ZOMBIE = "agent-0"
PAUSE_TRIES = 5  # a pause that finds the zombie holding nothing is tried again
DROPPED = re.compile(r"completion of (\S+) dropped")
LOST = re.compile(r"task (\S+): lease \d+ lost; dropped")


@frozen
class ZombieConfig:
    tasks: int = 80
    sleep_ms: int = 300
    pause_leases: float = 3.0  # the pause, in leases
    seed: int = 0
    concurrency: int = 4
    prefetch: int = 4
    partitions: int = 4
    resume_s: float = 4.0  # after SIGCONT, for the zombie to heartbeat and report
    drain_s: float = 45.0
    home: Path | None = None


class ZombieCluster(ChaosCluster):
    """Agents log at info, so the zombie's dropped completions and lost leases are visible."""

    def spawn_agent(self, k: int) -> None:
        name = f"agent-{k}"
        self.root.mkdir(parents=True, exist_ok=True)
        args = ["agent", "--app", APP_REF, "--url", self.url, "--api-key", self.agent_key, *TRUSTED]
        slots = ["--concurrency", str(self.concurrency), "--prefetch", str(self.prefetch)]
        command = [
            sys.executable,
            "-m",
            "conveyor.cli",
            *args,
            *slots,
            *AGENT_TIMES,
            "--log-level",
            "info",
        ]
        with open(self.root / f"{name}.out", "ab") as out:
            self.procs[name] = _popen(command, out)

    def signal_tree(self, name: str, sig: signal.Signals) -> list[int]:
        """``sig`` to the agent ``name`` and its guests; the pids signalled."""
        pids = [self.procs[name].pid, *(g.pid for g in self.guests(name))]
        hit = []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
                hit.append(pid)
        return hit


@dataclass
class Held:
    """An attempt the zombie held when it was paused."""

    task_id: str
    attempt: int


@dataclass
class Observed:
    held: list[Held] = field(default_factory=list)
    paused_pids: list[int] = field(default_factory=list)
    resume_offset: int = 0
    zombie_pid: int = 0


async def run_zombie(config: ZombieConfig) -> dict[str, Any]:
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="conveyor-zombie-") as tmp:
        root = config.home or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        cluster = ZombieCluster(root, config.partitions, 2, config.concurrency, config.prefetch)
        history = History(root / "history.jsonl")
        run = Run(cluster, history, root / "executions.log")
        seen = Observed()
        finals: dict[str, Any] = {}
        try:
            await cluster.start()
            drained = await _phases(run, config, seen, finals)
        finally:
            with contextlib.suppress(Exception):  # never leave a stopped process behind
                cluster.signal_tree(ZOMBIE, signal.SIGCONT)
            cluster.stop()
            history.close()
        evidence = _evidence(root / "node", run.journal, drained)
        thresholds = checker.Thresholds(min_acks=1, min_node_kills=0, min_agent_kills=0)
        result = checker.check(history.ops, evidence, thresholds)
        stale = _stale(seen, finals, run.journal, (root / f"{ZOMBIE}.out").read_text())
    result["faults"] = {"kill9": {}, "pause": 1}
    if config.pause_leases < SHORT_PAUSE_MAX:
        spurious = _spurious(seen, finals)
        result["held"] = len(seen.held)
        result["spurious_releases"] = spurious
        safe = spurious == 0
        nontrivial = result["nontrivial"] and len(seen.held) > 0
        test = "N1-stall-shorter-than-the-lease"
    else:
        result["stale_ops"] = stale
        safe = stale["accepted"] == 0 and stale["attempted"] == stale["rejected"]
        nontrivial = result["nontrivial"] and stale["held"] > 0 and stale["attempted"] > 0
        test = "P2-zombie-lease-holder"
    result["nontrivial"] = nontrivial
    if not safe:
        result["valid"] = False
    elif result["valid"] is True and not nontrivial:
        result["valid"] = "unknown"
    head = {"test": test, "seed": config.seed, "lease_s": LEASE_S}
    head["pause_s"] = round(config.pause_leases * LEASE_S, 2)
    return {**head, **result, "wall_s": round(time.monotonic() - started, 1)}


def _spurious(seen: Observed, finals: dict[str, Any]) -> int:
    """Held attempts of a short pause that did not end the task: each is a lease that lapsed
    (or was handed on) although its holder was alive."""
    spurious = 0
    for h in seen.held:
        info = finals.get(h.task_id)
        if info is None or info.attempt != h.attempt:
            spurious += 1
    return spurious


async def _phases(run: Run, config: ZombieConfig, seen: Observed, finals: dict[str, Any]) -> bool:
    rng = random.Random(config.seed)
    cluster = run.cluster
    assert isinstance(cluster, ZombieCluster)
    async with AsyncClient(run.cluster.url, run.cluster.key, app=APP, timeout=5.0) as client:
        await _warm_up(run, client)
        payload = {"log": str(run.journal), "sleep_ms": config.sleep_ms}
        for n in range(config.tasks):
            # A reply lost to a slow box is resent with the same key until it is answered:
            # every task of the batch is acknowledged, once.
            while not await enqueue_recorded(run, client, 0, f"z-{config.seed}-{n}", payload):
                await asyncio.sleep(0.1)
        await _until_busy(run, config)
        await asyncio.sleep(rng.uniform(0.0, config.sleep_ms / 1000))
        seen.zombie_pid = run.cluster.procs[ZOMBIE].pid
        for _ in range(PAUSE_TRIES):
            await _pause(run, client, config, seen)
            if seen.held:
                break
            await asyncio.sleep(config.sleep_ms / 1000)  # it held nothing: let it take work
        await asyncio.sleep(config.resume_s)
        run.history.nemesis("heal", {})
        drained = await _drain(run, client, config.drain_s)
        for task_id in sorted(set(run.acked.values())):
            with contextlib.suppress(Exception):
                finals[task_id] = await client.get(task_id)
        return drained


async def _pause(run: Run, client: AsyncClient, config: ZombieConfig, seen: Observed) -> None:
    """SIGSTOP the zombie for the pause, read what it held, SIGCONT it.

    A long pause (P2) reads at its end, so that attempts the platform already expired count.
    A short one (N1) reads at its start, concurrently, so that the read does not lengthen the
    stall; a read slower than the pause counts as holding nothing, and the caller pauses again.
    """
    cluster = run.cluster
    assert isinstance(cluster, ZombieCluster)
    pause_s = config.pause_leases * LEASE_S
    seen.paused_pids = cluster.signal_tree(ZOMBIE, signal.SIGSTOP)
    run.history.nemesis("pause", {"name": ZOMBIE, "pids": seen.paused_pids})
    stopped = time.monotonic()
    if config.pause_leases < SHORT_PAUSE_MAX:
        with contextlib.suppress(TimeoutError):
            seen.held = await asyncio.wait_for(_held(run, client, seen.zombie_pid), pause_s)
        await asyncio.sleep(max(0.0, stopped + pause_s - time.monotonic()))
    else:
        await asyncio.sleep(pause_s)
        seen.held = await _held(run, client, seen.zombie_pid)
    seen.resume_offset = run.journal.stat().st_size if run.journal.exists() else 0
    cluster.signal_tree(ZOMBIE, signal.SIGCONT)
    run.history.nemesis("resume", {"name": ZOMBIE, "held": len(seen.held)})


async def _warm_up(run: Run, client: AsyncClient) -> None:
    deadline = time.monotonic() + 60.0
    while not await enqueue_recorded(run, client, 0, "warm-up", {"log": str(run.journal)}):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no enqueue succeeded in 60 s\n{run.cluster.logs()}")
        await asyncio.sleep(0.2)


async def _until_busy(run: Run, config: ZombieConfig) -> None:
    """Until handlers have finished on the agents (the first journal lines): from then on
    both agents hold leases, running and prefetched."""
    deadline = time.monotonic() + 20.0
    while time.monotonic() < deadline:
        if run.journal.exists() and run.journal.read_text().count("\n") >= 2:
            return
        await asyncio.sleep(0.05)


async def _held(run: Run, client: AsyncClient, zombie_pid: int) -> list[Held]:
    """The attempts the zombie's agent started and the platform had not seen end when it
    was paused: each is an attempt of the zombie's with no finish yet, or one the platform
    ended as ``LeaseExpired`` (no report from the agent). Read while it is still stopped."""
    mark = f"-{zombie_pid}-"
    readers = asyncio.Semaphore(READERS)

    async def one(task_id: str) -> list[Held]:
        async with readers:
            with contextlib.suppress(Exception):
                info = await client.get(task_id)
                return [
                    Held(task_id, a.attempt)
                    for a in info.attempts
                    if a.worker
                    and mark in a.worker
                    and (a.outcome is None or (a.error and a.error.error_class == "LeaseExpired"))
                ]
        return []

    found = await asyncio.gather(*(one(t) for t in sorted(set(run.acked.values()))))
    return [h for hs in found for h in hs]


def _stale(
    seen: Observed, finals: dict[str, Any], journal: Path, zombie_log: str
) -> dict[str, Any]:
    held = {(h.task_id, h.attempt) for h in seen.held}
    held_tasks = {h.task_id for h in seen.held}
    paused = set(seen.paused_pids)
    late: list[tuple[str, int]] = []
    if journal.exists():
        with journal.open("rb") as f:
            f.seek(seen.resume_offset)
            for line in f.read().decode().splitlines():
                parts = line.split()
                if len(parts) == 3 and int(parts[2]) in paused:
                    late.append((parts[0], int(parts[1])))
    dropped = [t for t in DROPPED.findall(zombie_log) if t in held_tasks]
    lost = [t for t in LOST.findall(zombie_log) if t in held_tasks]
    accepted = 0
    mark = f"-{seen.zombie_pid}-"
    for task_id, attempt in held:
        info = finals.get(task_id)
        if info is None:
            continue
        if info.attempt <= attempt or info.result == attempt:
            accepted += 1
            continue
        winner = next((a for a in info.attempts if a.attempt == info.attempt), None)
        if winner is not None and winner.worker and mark in winner.worker:
            accepted += 1
    # Every held attempt ends in one stale op of the zombie's: a completion (refused, or
    # accepted: then the state shows it) or a heartbeat answered LOST (the attempt dropped).
    rejected = len(set(dropped) | set(lost))
    return {
        "held": len(held),
        "late_executions": sum(1 for x in late if x in held),
        "attempted": rejected + accepted,
        "rejected": rejected,
        "completions_refused": len(dropped),
        "leases_lost": len(lost),
        "unreported": len(held_tasks - set(dropped) - set(lost)),
        "accepted": accepted,
    }
