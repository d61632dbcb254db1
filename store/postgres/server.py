"""Where the snapshot lives: a private PostgreSQL in the data dir, or an external DSN.

The embedded default runs the PostgreSQL 16 that the ``pgserver`` wheel ships, with its data
in ``home/postgres`` and its Unix socket inside that directory (no TCP port to collide with).
pgserver reference-counts servers per directory across processes, so ``conveyor projection
rebuild`` next to a stopped node simply starts it again.

After a kill -9 of the node the server keeps running (pgserver starts it as a daemon); the
next node joins it, and its clean stop stops it (``forget_dead_handles``). If the server died
too, its stale ``postmaster.pid`` is removed (``forget_dead_postmaster``) and PostgreSQL
recovers from its WAL on start:
committed rows and watermarks survive, so the projector resumes where it was
(``tests/integration/test_embedded_postgres.py``).
"""

from __future__ import annotations

import asyncio
import json
import os
import traceback
import warnings
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from conveyor.errors import TransientError
from conveyor.store.postgres.migrate import migrate

DSN_ENV = "CONVEYOR_POSTGRES_DSN"
POOL_SIZE_MAX = 8
CONNECT_TIMEOUT_S = 30.0

# pgserver keeps a lock file in the user's runtime dir; where XDG_RUNTIME_DIR is unset
# (containers, CI, ssh sessions) platformdirs warns and falls back to /tmp, which is fine:
# the warning was the first thing ``conveyor dev`` printed.
warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")


class StoreUnavailable(TransientError):
    """PostgreSQL could not be started or reached."""

    code = "store_unavailable"


class EmbeddedPostgres:
    """A pgserver-managed PostgreSQL whose data directory is ``data_dir``."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self._server: Any = None

    async def start(self) -> str:
        """Start (or join) the server; its DSN."""
        self._server = await asyncio.to_thread(self._start_blocking)
        dsn = str(self._server.get_uri())
        await _tune(dsn)
        return dsn

    def _start_blocking(self) -> Any:
        try:
            from pgserver import postgres_server
        except ImportError as exc:
            raise StoreUnavailable(f"the pgserver package is not installed: {exc}") from exc
        self.data_dir.mkdir(parents=True, exist_ok=True)
        forget_dead_handles(self.data_dir)
        forget_dead_postmaster(self.data_dir)
        try:
            return postgres_server.get_server(self.data_dir, cleanup_mode="stop")
        except Exception as exc:  # pgserver raises plain exceptions for initdb/pg_ctl failures
            where = traceback.extract_tb(exc.__traceback__)[-1]  # pgserver asserts bare
            reason = f"{type(exc).__name__}: {exc} ({Path(where.filename).name}:{where.lineno})"
            raise StoreUnavailable(f"cannot start PostgreSQL in {self.data_dir}: {reason}") from exc

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await asyncio.to_thread(server.cleanup)


# pgserver (0.1.x) lists the pids of the processes using a server in this file and stops the
# server when the last of them cleans up.
HANDLES_FILE = ".handle_pids.json"


def forget_dead_handles(data_dir: Path) -> list[int]:
    """Drop the pids of processes that died without cleaning up (a node killed with -9) from
    pgserver's list of a server's users; the pids dropped.

    Without this, the server a killed node leaves running is joined by the next node (its
    data survives: PostgreSQL runs as a daemon, and recovers from its WAL if it died too),
    but the dead pid stays listed forever, so no clean stop ever stops the server again."""
    path = data_dir / HANDLES_FILE
    try:
        listed = [int(pid) for pid in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return []  # no list yet (or not one pgserver wrote): nothing to forget
    alive = [pid for pid in listed if _running(pid)]
    if alive != listed:
        path.write_text(json.dumps(alive))
    return sorted(set(listed) - set(alive))


def forget_dead_postmaster(data_dir: Path) -> list[str]:
    """Remove the lock files of a dead server (``postmaster.pid`` and its socket's lock, both
    naming its pid); the names removed.

    PostgreSQL ignores lock files whose pid is gone, but a server killed and not yet reaped
    by its parent (pgserver daemonizes it: the parent is init, which may reap late) is a
    zombie that still has its pid: pgserver then takes it for a running server and joins it,
    and PostgreSQL refuses to start over its locks. A zombie serves nothing."""
    removed = []
    for path in [data_dir / "postmaster.pid", *sorted(data_dir.glob(".s.PGSQL.*.lock"))]:
        try:
            pid = int(path.read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if not _running(pid):
            path.unlink(missing_ok=True)
            removed.append(path.name)
    return removed


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:  # exists, but we may not look at it
        return True


# The embedded server's data is on a local disk that the OS caches: a random page read costs
# about what a sequential one does. With the default (4.0, for spinning disks) the planner
# sorts every match of a filter rather than walk an index in listing order and stop early.
EMBEDDED_SETTINGS = {"random_page_cost": "1.1"}


async def _tune(dsn: str) -> None:
    conn = await _first_connection(dsn)
    try:
        for name, value in EMBEDDED_SETTINGS.items():
            await conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


async def _first_connection(dsn: str) -> asyncpg.Connection:
    """A connection to a server just started or joined. One that crashed replays its WAL
    first, and one pgserver joined may still be coming up: refused connections are retried
    until ``CONNECT_TIMEOUT_S``."""
    deadline = asyncio.get_running_loop().time() + CONNECT_TIMEOUT_S
    while True:
        try:
            return await asyncpg.connect(dsn, timeout=CONNECT_TIMEOUT_S)
        except (OSError, asyncpg.CannotConnectNowError) as exc:
            if asyncio.get_running_loop().time() > deadline:
                raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
            await asyncio.sleep(0.2)
        except asyncpg.PostgresError as exc:
            raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc


def configured_dsn(dsn: str | None) -> str | None:
    """The external DSN asked for (option first, then the environment), or None: embedded."""
    return dsn or os.environ.get(DSN_ENV) or None


async def connect_pool(dsn: str, *, size_max: int = POOL_SIZE_MAX) -> asyncpg.Pool:
    """A connection pool on ``dsn`` with the schema migrated to the newest version."""
    try:
        pool = await asyncpg.create_pool(
            dsn, min_size=1, max_size=size_max, timeout=CONNECT_TIMEOUT_S
        )
    except (OSError, asyncpg.PostgresError) as exc:
        raise StoreUnavailable(f"cannot connect to PostgreSQL: {exc}") from exc
    async with pool.acquire() as conn:
        await migrate(conn)
    return pool
