"""Conveyor against pgqueuer and Dramatiq, measured the same way in one run.

    benchmarks/peers/run.sh [--tasks N] [--single N] [--idle N] [--only conveyor,pgqueuer]

Runs the systems one after the other (never two at once: the machine is small), then prints
one JSON object: each system's figures, and Conveyor/peer ratios of the headline figures
(throughput: above 1 is Conveyor faster; latencies: below 1 is Conveyor faster).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

from bench_dramatiq import bench_dramatiq
from bench_pgqueuer import bench_pgqueuer

SYSTEMS = ("conveyor", "pgqueuer", "dramatiq")
HEADLINE = (
    "tasks_per_s",
    "enqueue_p50_ms",
    "enqueue_p99_ms",
    "start_p50_ms",
    "start_p99_ms",
    "submit_to_start_p50_ms",
    "submit_to_start_p99_ms",
    "concurrent_per_s",
    "concurrent_p99_ms",
    "cpu_ms_per_task",
)
CONVEYOR_TIMEOUT_S = 900


def conveyor(args: argparse.Namespace) -> dict:
    """``conveyor bench e2e --json`` as a subprocess, exactly as a user would run it."""
    cmd = [sys.executable, "-m", "conveyor.cli", "bench", "e2e", "--json"]
    cmd += ["--tasks", str(args.tasks), "--single", str(args.single), "--idle", str(args.idle)]
    cmd += ["--concurrent", str(args.concurrent)]
    if args.conveyor_concurrency is not None:
        cmd += ["--concurrency", str(args.conveyor_concurrency)]
    if args.conveyor_prefetch is not None:
        cmd += ["--prefetch", str(args.conveyor_prefetch)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=CONVEYOR_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"conveyor bench e2e failed ({done.returncode}):\n{done.stderr}")
    result: dict = json.loads(done.stdout.strip().splitlines()[-1])
    # node, its projector process and its snapshot's PostgreSQL, agent, guests and client:
    # every process of the run
    cpu = sum(v for k, v in result.items() if k.endswith("_cpu_s"))
    result["cpu_ms_per_task"] = round(cpu * 1000 / args.tasks, 3)
    return result


async def peer(name: str, args: argparse.Namespace) -> dict:
    sizes = {
        "tasks": args.tasks,
        "single": args.single,
        "concurrent": args.concurrent,
        "idle": args.idle,
    }
    with tempfile.TemporaryDirectory(prefix=f"peers-{name}-") as tmp:
        if name == "pgqueuer":
            return await bench_pgqueuer(Path(tmp), **sizes, workers=args.pgqueuer_workers)
        return await bench_dramatiq(
            Path(tmp), **sizes, processes=args.dramatiq_processes, threads=args.dramatiq_threads
        )


def ratios(results: dict[str, dict]) -> dict[str, dict[str, float | None]]:
    ours = results.get("conveyor")
    if ours is None:
        return {}
    out = {}
    for name, theirs in results.items():
        if name == "conveyor" or "error" in theirs:
            continue
        out[f"conveyor/{name}"] = {k: _ratio(ours.get(k), theirs.get(k)) for k in HEADLINE}
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    if a is None or b is None or b == 0:
        return None
    return round(a / b, 3)


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "load_avg_1m": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "versions": {
            pkg: _version(pkg) for pkg in ("conveyor", "pgqueuer", "asyncpg", "dramatiq", "redis")
        },
    }


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=50_000, help="throughput tasks per system")
    parser.add_argument("--single", type=int, default=500, help="single enqueues timed")
    parser.add_argument(
        "--concurrent", type=int, default=4_000, help="single enqueues from 16 callers at once"
    )
    parser.add_argument("--idle", type=int, default=200, help="idle starts timed")
    parser.add_argument("--only", default=",".join(SYSTEMS), help="comma-separated systems")
    parser.add_argument("--conveyor-concurrency", type=int, help="guests (the agent's default)")
    parser.add_argument(
        "--conveyor-prefetch", type=int, help="leases held ahead (default: the agent's, adapted)"
    )
    parser.add_argument("--pgqueuer-workers", type=int, default=1, help="worker processes")
    parser.add_argument("--dramatiq-processes", type=int, default=2)
    parser.add_argument("--dramatiq-threads", type=int, default=8)
    return parser.parse_args()


def main() -> None:
    args = parse()
    started = time.monotonic()
    info = machine()
    results: dict[str, dict] = {}
    for name in args.only.split(","):
        print(f"running {name} ...", file=sys.stderr, flush=True)
        try:
            results[name] = conveyor(args) if name == "conveyor" else asyncio.run(peer(name, args))
        except Exception as exc:  # report the others even if one system fails
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
    info["load_avg_1m_after"] = round(os.getloadavg()[0], 2)
    info["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps({"machine": info, **results, "ratios": ratios(results)}, indent=2))


if __name__ == "__main__":
    main()
