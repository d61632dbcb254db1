"""pgqueuer on a private PostgreSQL 16 (pgserver), ``synchronous_commit=on``, ``fsync=on``.

Enqueues go through pgqueuer's own ``Queries.enqueue`` (the list form is its batch insert:
one statement per 1,000 jobs); each concurrent caller has its own connection, because a
pgqueuer driver serializes the statements of its connection. Workers are
``pgqueuer_worker.py`` processes. "Remaining" is the row count of the queue table: pgqueuer
deletes a job's row when it logs the job's final status.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import asyncpg
import pgserver
from peerlib import CALLERS, SINGLE_CALLERS, Stamps, drained, run_phases, spawn, stop, wait_for
from pgqueuer import AsyncpgDriver
from pgqueuer.queries import Queries

SETTINGS = ("server_version", "synchronous_commit", "fsync", "wal_sync_method")


class PgqueuerPeer:
    def __init__(
        self,
        single: Queries,
        callers: list[Queries],
        probe: asyncpg.Connection,
        singles: list[Queries],
    ):
        self.single = single
        self.singles = singles  # one connection per concurrent single enqueuer
        self.callers: asyncio.Queue[Queries] = asyncio.Queue()
        for q in callers:
            self.callers.put_nowait(q)
        self.probe = probe

    async def enqueue_noop(self) -> None:
        await self.single.enqueue("noop", None)

    async def enqueue_stamp(self, key: str) -> None:
        await self.single.enqueue("stamp", key.encode())

    async def enqueue_batch(self, n: int) -> None:
        q = await self.callers.get()
        try:
            await q.enqueue(["noop"] * n, [None] * n, [0] * n)
        finally:
            self.callers.put_nowait(q)

    async def enqueue_noops_at_once(self, n: int, callers: int) -> list[float]:
        latencies: list[float] = []

        async def caller(k: int, q: Queries) -> None:
            for _ in range(k, n, callers):
                sent = time.perf_counter()
                await q.enqueue("noop", None)
                latencies.append((time.perf_counter() - sent) * 1000)

        await asyncio.gather(*(caller(k, q) for k, q in enumerate(self.singles[:callers])))
        return latencies

    async def remaining(self) -> int:
        return int(await self.probe.fetchval("SELECT count(*) FROM pgqueuer"))


async def bench_pgqueuer(
    tmp: Path,
    *,
    tasks: int,
    single: int,
    concurrent: int,
    idle: int,
    workers: int = 1,
    batch: int = 100,
) -> dict:
    server = pgserver.get_server(tmp / "pgdata", cleanup_mode="delete")
    conns: list[asyncpg.Connection] = []
    procs = []
    stamps = Stamps()
    try:
        dsn = server.get_uri()
        for _ in range(CALLERS + 2 + SINGLE_CALLERS):
            conns.append(await asyncpg.connect(dsn))
        config = await _configure(conns[0])
        await Queries(AsyncpgDriver(conns[0])).install()
        args = [sys.executable, "pgqueuer_worker.py", dsn, str(stamps.port), str(batch)]
        for k in range(workers):
            procs.append(spawn(args, tmp / f"pgqueuer-worker-{k}.out"))
        peer = PgqueuerPeer(
            Queries(AsyncpgDriver(conns[0])),
            [Queries(AsyncpgDriver(c)) for c in conns[1 : CALLERS + 1]],
            conns[CALLERS + 1],
            [Queries(AsyncpgDriver(c)) for c in conns[CALLERS + 2 :]],
        )
        await _warm_up(peer)
        result = await run_phases(
            peer,
            stamps,
            tasks=tasks,
            single=single,
            concurrent=concurrent,
            idle=idle,
            server=[server.get_pid() or 0],
            workers=[p.pid for p in procs],
        )
        statuses = await _statuses(conns[0])
        extra = {"workers": workers, "batch_size": batch, "statuses": statuses}
        return {**result, **extra, "postgres": config}
    finally:
        for proc in procs:
            stop(proc)
        for conn in conns:
            await conn.close()
        stamps.close()
        server.cleanup()


async def _configure(conn: asyncpg.Connection) -> dict:
    """Make the durability setting explicit (it is PostgreSQL's default) and record it."""
    await conn.execute("ALTER SYSTEM SET synchronous_commit = 'on'")
    await conn.execute("SELECT pg_reload_conf()")
    return {name: await conn.fetchval(f"SHOW {name}") for name in SETTINGS}


async def _statuses(conn: asyncpg.Connection) -> dict[str, int]:
    """Final statuses pgqueuer logged, of every job of the run (warm-up and latency ones too)."""
    rows = await conn.fetch(
        "SELECT status::text AS status, count(*) AS n FROM pgqueuer_log "
        "WHERE status <> 'picked' AND status <> 'queued' GROUP BY status"
    )
    return {r["status"]: int(r["n"]) for r in rows}


async def _warm_up(peer: PgqueuerPeer) -> None:
    """The workers are up once they have run a few jobs."""

    async def ran() -> bool:
        return await peer.remaining() == 0

    await peer.enqueue_batch(10)
    await wait_for("pgqueuer workers", ran, 60.0)
    await drained(peer, 60.0)
