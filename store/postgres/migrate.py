"""Versioned schema migrations, applied at start.

Rule: a migration file is ``NNNN_name.sql`` in ``migrations/``; once released it never
changes (a change is a new file). Each runs in its own transaction together with its row in
``schema_migrations``, under an advisory lock, so two processes starting at once apply each
migration exactly once and a failed one leaves nothing half-applied.
"""

from __future__ import annotations

import re
from pathlib import Path

import asyncpg

from conveyor.frozen import frozen

MIGRATIONS_DIR = Path(__file__).parent / "migrations"
_NAME = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# Any constant both processes agree on; "conv" in ASCII.
_LOCK_KEY = 0x636F6E76


@frozen
class Migration:
    version: int
    name: str
    sql: str


def available(directory: Path = MIGRATIONS_DIR) -> list[Migration]:
    found = []
    for path in sorted(directory.glob("*.sql")):
        match = _NAME.match(path.name)
        if match is None:
            raise ValueError(f"{path}: migration files are named NNNN_name.sql")
        found.append(Migration(int(match[1]), match[2], path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ValueError(f"{directory}: two migrations share a version number")
    return found


async def migrate(conn: asyncpg.Connection, directory: Path = MIGRATIONS_DIR) -> list[int]:
    """Apply every migration not yet applied, in order; the versions applied now."""
    await conn.execute(
        "CREATE TABLE IF NOT EXISTS schema_migrations ("
        " version integer PRIMARY KEY, name text NOT NULL,"
        " applied_at timestamptz NOT NULL DEFAULT now())"
    )
    applied_now: list[int] = []
    for migration in available(directory):
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
            done = await conn.fetchval(
                "SELECT 1 FROM schema_migrations WHERE version = $1", migration.version
            )
            if done:
                continue
            await conn.execute(migration.sql)
            await conn.execute(
                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                migration.version,
                migration.name,
            )
            applied_now.append(migration.version)
    return applied_now
