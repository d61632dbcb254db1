"""S1 of tests/PLAN.md at the node: power cuts under load (``conveyor chaos power-cut``).

Each run: a ``Node`` whose record log and events log go through one ``FaultyFileIO``; clients
enqueue keyed tasks concurrently; at a seeded file operation the power is cut (unsynced writes
lost, the last one torn, sometimes with garbage after it). The node is rebuilt on the surviving
files with its partition state either kept (the state store survived the cut) or lost (rebuilt
from the log), and checked:

- ``lost``: acknowledged enqueues missing, or present under another task id (I1, I7: nothing
  may be acknowledged before it is durable);
- ``unexpected``: tasks nobody enqueued (I2);
- ``twin_mismatch``: a retry of a key after the restart answering with another task id than
  the one the key already had (idempotency across the cut);
- ``recovered``: enqueues that failed or never answered but survived (allowed, counted).

The state store is in memory here: the cut is of the log files (the store is either kept whole
or lost whole; a store behind the log by any number of batches is the simulation's job).
Anti-vacuity: a run where the cut landed after the load ended, or before anything was
acknowledged, does not count as a fault; ``valid`` needs most runs to be real faults.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from conveyor.frozen import frozen
from conveyor.schemas.types import TaskSpec
from conveyor.store.memory import MemoryKV
from conveyor.streams.log.fileio import OS_IO, FileIO
from conveyor.streams.log.local import LocalLog
from conveyor.streams.node import Node
from conveyor.streams.routing import partition_for_key
from conveyor_devtools.chaos.disk import FaultyFileIO

TENANT = "t"
# A run of the default config makes 190-220 file operations when nothing cuts it (measured;
# group commit merges appends): cut inside the load, not after it.
OPS_PER_RUN_MIN = 180


@frozen
class PowerCutConfig:
    runs: int = 12
    seed: int = 0
    partitions: int = 3
    clients: int = 4
    enqueues: int = 25  # per client and run
    segment_bytes: int = 8192  # small: runs roll segments
    home: Path | None = None  # keep the runs' files here (default: a temp dir, removed)


def keyed_spec(key: str, partitions: int, rng: random.Random) -> TaskSpec:
    p = partition_for_key(TENANT, key, partitions)
    return TaskSpec(
        task_id=f"{p:04x}{rng.randbytes(14).hex()}",
        tenant=TENANT,
        app="app",
        task_type="job",
        idempotency_key=key,
        payload=rng.randbytes(rng.randint(0, 300)),
    )


async def _open(home: Path, config: PowerCutConfig, stores: list[MemoryKV], fs: FileIO) -> Node:
    log = await LocalLog.open(
        home / "log", config.partitions, segment_bytes=config.segment_bytes, fs=fs
    )
    events = await LocalLog.open(home / "events", config.partitions, fs=fs)
    node = Node(log, events, stores)
    await node.start()
    return node


async def one_run(
    home: Path, config: PowerCutConfig, seed: int, *, keep_state: bool
) -> Counter[str]:
    """One power cut and restart; the counts of the module docstring."""
    rng = random.Random(seed)
    fs = FaultyFileIO(home)
    usual = PowerCutConfig()
    load = config.clients * config.enqueues / (usual.clients * usual.enqueues)
    cut_at, seen = rng.randint(20, max(20, int(OPS_PER_RUN_MIN * load))), 0
    attempted: dict[str, str] = {}  # key -> task id
    acked: dict[str, str] = {}

    def nemesis(what: str, path: Path) -> None:
        nonlocal seen
        seen += 1
        if seen == cut_at:
            fs.power_cut(rng, torn=True, garbage=rng.random() < 0.5)

    async def client(node: Node, c: int, crng: random.Random) -> None:
        for i in range(config.enqueues):
            spec = keyed_spec(f"c{c}-{i}", config.partitions, crng)
            attempted[f"c{c}-{i}"] = spec.task_id
            try:
                (reply,) = await node.enqueue([spec])
            except Exception:  # the log failed under the cut: indeterminate
                return
            if reply.ok:
                acked[f"c{c}-{i}"] = reply.task_id

    stores = [MemoryKV() for _ in range(config.partitions)]
    node = await _open(home, config, stores, fs)
    fs.on_op = nemesis
    await asyncio.gather(
        *(client(node, c, random.Random(rng.random())) for c in range(config.clients))
    )
    counts: Counter[str] = Counter()
    counts["file operations"] += seen
    counts["power cuts under load"] += fs.dead and bool(acked)
    fs.power_cut(rng, torn=True)
    await node.stop()

    if not keep_state:
        stores = [MemoryKV() for _ in range(config.partitions)]
    node = await _open(home, config, stores, OS_IO)
    try:
        present = {t.task_id for p in range(config.partitions) for t in node.tables(p).tasks()}
        counts["attempted"] += len(attempted)
        counts["acked"] += len(acked)
        counts["info"] += len(attempted) - len(acked)
        counts["lost"] += sum(1 for task_id in acked.values() if task_id not in present)
        counts["unexpected"] += len(present - set(attempted.values()))
        counts["recovered"] += len(present & (set(attempted.values()) - set(acked.values())))
        for key, task_id in attempted.items():
            (reply,) = await node.enqueue([keyed_spec(key, config.partitions, random.Random(key))])
            had = key in acked or task_id in present
            counts["twin_mismatch"] += had and (reply.task_id != task_id or reply.created)
    finally:
        await node.stop()
    return counts


async def run_power_cut(config: PowerCutConfig) -> dict[str, Any]:
    """``config.runs`` runs, alternating kept and lost state; the figure of RELIABILITY §11."""
    started = time.monotonic()
    root = config.home or Path(tempfile.mkdtemp(prefix="conveyor-powercut-"))
    totals: Counter[str] = Counter()
    try:
        for run in range(config.runs):
            home = root / f"run-{run}"
            totals += await one_run(
                home, config, config.seed * 1_000 + run, keep_state=run % 2 == 0
            )
    finally:
        if config.home is None:
            shutil.rmtree(root, ignore_errors=True)
    safety = totals["lost"] + totals["unexpected"] + totals["twin_mismatch"]
    nontrivial = totals["power cuts under load"] >= config.runs // 2 and totals["acked"] > 0
    return {
        "test": "S1-power-cut",
        "seed": config.seed,
        "duration_s": round(time.monotonic() - started, 1),
        "nontrivial": nontrivial,
        "runs": config.runs,
        "attempted": totals["attempted"],
        "acked": totals["acked"],
        "info": totals["info"],
        "recovered": totals["recovered"],
        "lost": totals["lost"],
        "unexpected": totals["unexpected"],
        "twin_mismatch": totals["twin_mismatch"],
        "faults": {"power_cut": config.runs, "under_load": totals["power cuts under load"]},
        "valid": _verdict(safety, nontrivial),
    }


def _verdict(safety_violations: int, nontrivial: bool) -> bool | str:
    if safety_violations:
        return False
    return True if nontrivial else "unknown"
