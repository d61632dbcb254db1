"""Group-commit throughput benchmark of LocalLog (``conveyor bench log --json``).

Many writer tasks append small batches (1-16 records) concurrently; writer ``i`` appends to
partition ``i % partitions``. Every append is durable when it returns, so the figure that
matters besides records/s is records per fdatasync: how well group commit amortises the sync.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from pathlib import Path
from typing import Any

from conveyor.streams.log.local import DEFAULT_SEGMENT_BYTES, LocalLog

MAX_BATCH = 16


async def _writer(log: LocalLog, partition: int, records: int, payload: bytes, seed: int) -> None:
    rng = random.Random(seed)
    left = records
    while left > 0:
        n = min(left, rng.randint(1, MAX_BATCH))
        await log.append(partition, [payload] * n)
        left -= n


async def bench_log(
    root: str | Path,
    *,
    partitions: int = 8,
    writers: int = 64,
    records: int = 200_000,
    record_bytes: int = 200,
    segment_bytes: int | None = None,
) -> dict[str, Any]:
    """Append ``records`` records of ``record_bytes`` bytes from ``writers`` concurrent tasks.

    ``root`` should be an empty directory on the disk under test. Returns records, seconds,
    records_per_s, fsyncs, records_per_fsync, partitions (plus writers and record_bytes).
    """
    segment_bytes = segment_bytes or DEFAULT_SEGMENT_BYTES
    log = await LocalLog.open(root, partitions, segment_bytes=segment_bytes)
    payload = os.urandom(record_bytes)
    share, extra = divmod(records, writers)
    try:
        started = time.perf_counter()
        await asyncio.gather(
            *(
                _writer(log, i % partitions, share + (i < extra), payload, seed=i)
                for i in range(writers)
            )
        )
        seconds = time.perf_counter() - started
        fsyncs, written = log.fsync_count, log.records_written
    finally:
        await log.close()
    return {
        "records": written,
        "seconds": round(seconds, 4),
        "records_per_s": round(written / seconds) if seconds > 0 else 0,
        "fsyncs": fsyncs,
        "records_per_fsync": round(written / fsyncs, 1) if fsyncs else 0.0,
        "partitions": partitions,
        "writers": writers,
        "record_bytes": record_bytes,
    }
