"""Checkers over a history (``history.py``) and what the run read back after it healed.

Pure functions: the runner gathers the evidence (the history, the specs found in the log, the
tasks found in the stopped node's state, the execution journal) and ``check`` turns it into the
figure of tests/PLAN.md. ``valid`` is ``True`` only when every safety count is 0, the drain
completed and the run was non-trivial (enough kills and acks): the anti-vacuity guard, so a run
where everything errored or nothing was killed can never pass.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from conveyor.frozen import frozen
from conveyor_devtools.chaos.history import NEMESIS, Op

TERMINAL = frozenset({"SUCCEEDED", "FAILED", "CANCELED", "EXPIRED"})
SAFETY = ("lost", "unexpected", "duplicated", "double_terminal", "regressions")


@frozen
class Thresholds:
    """The least a run must show to be judged at all."""

    min_acks: int = 1
    min_node_kills: int = 1
    min_agent_kills: int = 1


@frozen
class Evidence:
    """Everything read after the run, besides the history.

    ``log_keys``: the idempotency key of every task spec in the log's ``EnqueueTasks`` records
    (a retried key appears once per append). ``state_keys``: task id -> idempotency key of every
    task in the stopped node's state. ``executions``: task id -> handler runs, from the journal.
    """

    log_keys: list[str | None] = field(default_factory=list)
    state_keys: Mapping[str, str | None] = field(default_factory=dict)
    executions: Mapping[str, int] = field(default_factory=dict)
    drained: bool = True


@dataclass
class _Enqueues:
    """The client side of the history, per idempotency key."""

    attempted: set[str] = field(default_factory=set)
    acked: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))
    failed: set[str] = field(default_factory=set)
    info_ops: int = 0
    info_keys: set[str] = field(default_factory=set)


def _enqueues(ops: Iterable[Op]) -> _Enqueues:
    out = _Enqueues()
    for op in ops:
        if op.f != "enqueue":
            continue
        key = str(op.value["key"])
        if op.type == "invoke":
            out.attempted.add(key)
        elif op.type == "ok":
            out.acked[key].add(str(op.value["task_id"]))
        elif op.type == "fail":
            out.failed.add(key)
        else:
            out.info_ops += 1
            out.info_keys.add(key)
    return out


def _observations(ops: Iterable[Op]) -> dict[str, list[str | None]]:
    """Task id -> every status read, in history order (sampled reads and final reads)."""
    seen: dict[str, list[str | None]] = defaultdict(list)
    for op in ops:
        if op.f in ("read", "poll", "final-read") and op.type == "ok":
            seen[str(op.value["task_id"])].append(op.value.get("status"))
    return seen


def _terminal_violations(seen: Mapping[str, list[str | None]]) -> tuple[int, int]:
    """(double_terminal, regressions): tasks whose status changed after it was first seen
    terminal, to another terminal state (a fork) or back to a live one or to nothing."""
    forks = regressions = 0
    for statuses in seen.values():
        first = next((s for s in statuses if s in TERMINAL), None)
        if first is None:
            continue
        after = statuses[statuses.index(first) :]
        if any(s in TERMINAL and s != first for s in after):
            forks += 1
        elif any(s not in TERMINAL for s in after):
            regressions += 1
    return forks, regressions


def _final(ops: Iterable[Op]) -> dict[str, dict[str, Any]]:
    return {str(op.value["task_id"]): op.value for op in ops if op.f == "final-read"}


def _kills(ops: Iterable[Op]) -> dict[str, int]:
    kills: dict[str, int] = defaultdict(int)
    for op in ops:
        if op.process == NEMESIS and op.f == "kill":
            kills[str(op.value["role"])] += 1
    return dict(sorted(kills.items()))


def _heal_ms(ops: Iterable[Op]) -> int | None:
    for op in ops:
        if op.process == NEMESIS and op.f == "heal":
            return op.time_ns // 1_000_000
    return None


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 3)


def _after_heal(final: Mapping[str, dict[str, Any]], heal_ms: int | None) -> dict[str, Any]:
    """Seconds from the heal to each terminal state reached after it (tasks already terminal
    at the heal took no time after it and are left out)."""
    waits: list[float] = []
    if heal_ms is not None:
        for value in final.values():
            done = value.get("finished_ms")
            if isinstance(done, int) and done > heal_ms:
                waits.append((done - heal_ms) / 1000)
    return {"p50": _percentile(waits, 0.5), "p99": _percentile(waits, 0.99), "n": len(waits)}


def _executions(acked_ids: set[str], executions: Mapping[str, int]) -> dict[str, Any]:
    counts = [executions.get(t, 0) for t in acked_ids]
    if not counts:
        return {"mean": None, "max": None}
    return {"mean": round(sum(counts) / len(counts), 3), "max": max(counts)}


def check(ops: list[Op], evidence: Evidence, thresholds: Thresholds) -> dict[str, Any]:
    enq = _enqueues(ops)
    final = _final(ops)
    acked_ids = {t for ids in enq.acked.values() for t in ids}
    # I1: an acked task must be readable and terminal after the drain.
    unread = sorted(t for t in acked_ids if t not in final)  # no answer at the deadline
    lost = sorted(t for t in acked_ids if t in final and final[t].get("status") is None)
    live = {t for t in acked_ids if t in final and final[t].get("status") is not None}
    stuck = sorted(t for t in live if final[t]["status"] not in TERMINAL)
    # I2: every task in the log and in the state comes from a key some client invoked.
    unexpected_log = [k for k in evidence.log_keys if k not in enq.attempted]
    unexpected_state = [t for t, k in evidence.state_keys.items() if k not in enq.attempted]
    # Idempotency: one key, one task, in the replies and in the state.
    per_key: dict[str | None, set[str]] = defaultdict(set)
    for task_id, key in evidence.state_keys.items():
        per_key[key].add(task_id)
    duplicated = {k for k, ids in enq.acked.items() if len(ids) > 1}
    duplicated |= {str(k) for k, ids in per_key.items() if len(ids) > 1}
    # I3: a status seen terminal never changes afterwards.
    forks, regressions = _terminal_violations(_observations(ops))
    recovered = {k for k in enq.attempted - set(enq.acked) if per_key.get(k) and k in enq.info_keys}
    kills = _kills(ops)
    nontrivial = (
        len(enq.acked) >= thresholds.min_acks
        and kills.get("node", 0) >= thresholds.min_node_kills
        and kills.get("agent", 0) >= thresholds.min_agent_kills
    )
    counts = {
        "lost": len(lost),
        "unexpected": len(unexpected_log) + len(unexpected_state),
        "duplicated": len(duplicated),
        "double_terminal": forks,
        "regressions": regressions,
    }
    drained = evidence.drained and not stuck and not unread
    return {
        "nontrivial": nontrivial,
        "attempted": len(enq.attempted),
        "acked": len(enq.acked),
        "failed": len(enq.failed - set(enq.acked)),
        "info": enq.info_ops,
        "info_keys": len(enq.info_keys),
        "recovered": len(recovered),
        **counts,
        "forks": forks,
        "faults": {"kill9": kills},
        "executions_per_task": _executions(acked_ids, evidence.executions),
        "time_to_terminal_after_heal_s": _after_heal(final, _heal_ms(ops)),
        "stuck": len(stuck),
        "unread": len(unread),
        "observed_reads": sum(1 for op in ops if op.f == "read" and op.type == "ok"),
        "examples": {"lost": lost[:5], "stuck": stuck[:5], "unexpected": unexpected_log[:5]},
        "valid": _verdict(counts, drained, nontrivial),
    }


def _verdict(counts: Mapping[str, int], drained: bool, nontrivial: bool) -> bool | str:
    if any(counts[name] for name in SAFETY):
        return False
    if not drained or not nontrivial:
        return "unknown"
    return True
