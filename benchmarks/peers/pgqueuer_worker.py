"""The pgqueuer worker of the comparison: ``python pgqueuer_worker.py DSN STAMP_PORT BATCH``.

One asyncio process (pgqueuer runs handlers in its event loop: no process isolation), woken
by LISTEN/NOTIFY, dequeuing ``BATCH`` jobs per round trip; status logs are buffered and
written in batches by pgqueuer itself. SIGTERM asks it to stop.
"""

from __future__ import annotations

import asyncio
import signal
import sys

import asyncpg
from peerlib import send_stamp
from pgqueuer import AsyncpgDriver, Job, QueueManager
from pgqueuer.queries import Queries


async def main(dsn: str, stamp_port: int, batch: int) -> None:
    conn = await asyncpg.connect(dsn)
    qm = QueueManager(Queries(AsyncpgDriver(conn)))

    @qm.entrypoint("noop")
    async def noop(job: Job) -> None:
        return None

    @qm.entrypoint("stamp")
    async def stamp(job: Job) -> None:
        send_stamp(stamp_port, (job.payload or b"").decode())

    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    await qm.run(batch_size=batch)
    await conn.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
