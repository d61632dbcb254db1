"""S3 of tests/PLAN.md: corruption in the middle of a partition's log is fail-stop for that
partition only.

A bit flip in an acknowledged record can not be repaired on one machine, and skipping it would
silently lose a task. So the partition halts with ``LogCorruption`` naming the file and the
record offset, applies nothing at or after that record, and the node's other partitions keep
taking and applying work. Two ways to meet it:

- found on open (a bad frame followed by valid ones in the part of the segment recovery scans):
  the log opens with that partition halted;
- found on read (an older part of the segment, here read because the partition's RocksDB state
  was lost and is rebuilt from the log).
"""

from __future__ import annotations

import asyncio
import shutil
import struct
from pathlib import Path

import httpx
import pytest

from conveyor.errors import TransientError
from conveyor.schemas.types import TaskSpec
from conveyor.streams.gateway import KeyStore, Registry, build_app, start
from conveyor.streams.log.api import LogCorruption
from conveyor.streams.log.local import HEADER_BYTES, INDEX_INTERVAL, LocalLog
from conveyor.streams.node import Node

pytestmark = pytest.mark.timeout(60)

PARTITIONS = 3
VICTIM = 1
ROUNDS = 24


def spec(p: int, n: int, payload_bytes: int) -> TaskSpec:
    return TaskSpec(
        task_id=f"{p:04x}{n:028x}",
        tenant="t",
        app="app",
        task_type="job",
        payload=b"x" * payload_bytes,
    )


async def populate(home: Path, payload_bytes: int, rounds: int = ROUNDS) -> int:
    """``rounds`` enqueue records per partition (one per partition per call), all acked.
    Returns the victim's applied offset."""
    node = await Node.open(home, partitions=PARTITIONS)
    await node.start()
    try:
        for n in range(rounds):
            replies = await node.enqueue([spec(p, n, payload_bytes) for p in range(PARTITIONS)])
            assert all(r.ok for r in replies)
        return node.processors[VICTIM].applied
    finally:
        await node.stop()


def frame_positions(segment: Path) -> list[int]:
    data = segment.read_bytes()
    positions, at = [], 0
    while at + HEADER_BYTES <= len(data):
        positions.append(at)
        (length,) = struct.unpack_from("<I", data, at)
        at += HEADER_BYTES + length
    return positions


def flip_record(home: Path, record: int) -> Path:
    """Flip one payload byte of record ``record`` in the victim partition's log."""
    (segment,) = sorted((home / "log" / f"p{VICTIM:04d}").glob("*.log"))
    at = frame_positions(segment)[record] + HEADER_BYTES + 2
    with segment.open("r+b") as f:
        f.seek(at)
        byte = f.read(1)[0]
        f.seek(at)
        f.write(bytes([byte ^ 0x10]))
    return segment


async def check_health_reports(node: Node) -> None:
    """The gateway's /healthz answers 503 naming the halted partition and why."""
    runner, url = await start(build_app(node, KeyStore({}), Registry()), "127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=url) as http:
            reply = await http.get("/healthz")
        assert reply.status_code == 503, reply.text
        body = reply.json()
        assert body["ok"] is False and list(body["halted"]) == [str(VICTIM)]
        assert "LogCorruption" in body["halted"][str(VICTIM)]
    finally:
        await runner.cleanup()


async def check_halted_alone(
    home: Path, segment: Path, record: int, *, applied_max: int, on_open: bool
) -> None:
    """The victim halted naming the file and record, applied nothing new (at most
    ``applied_max``), refuses work; the other partitions take and apply work."""
    node = await Node.open(home, partitions=PARTITIONS)
    await node.start()
    try:
        victim = node.processors[VICTIM]
        error = victim.halted
        assert isinstance(error, LogCorruption), error
        assert error.path == str(segment) and error.offset == record, error
        assert isinstance(node.log, LocalLog)
        assert (node.log.corruption(VICTIM) is error) == on_open
        assert victim.applied <= applied_max, "applied records after the corruption"
        with pytest.raises(TransientError, match="partition 1 halted"):
            await node.enqueue([spec(VICTIM, 1_000, 10)])
        await check_health_reports(node)
        for p in range(PARTITIONS):
            if p == VICTIM:
                continue
            assert node.processors[p].halted is None
            (reply,) = await node.enqueue([spec(p, 1_000, 10)])
            assert reply.ok and reply.created, reply
            assert node.get("t", spec(p, 1_000, 10).task_id).status == "ENQUEUED"
            assert node.get("t", spec(p, 0, 10).task_id).status == "ENQUEUED"  # old state intact
    finally:
        await node.stop()


def test_corruption_found_on_open_halts_only_that_partition(tmp_path: Path) -> None:
    async def body() -> None:
        applied = await populate(tmp_path, payload_bytes=0, rounds=12)  # recovery scans it all
        record = 6
        segment = flip_record(tmp_path, record)
        assert segment.stat().st_size < INDEX_INTERVAL
        await check_halted_alone(tmp_path, segment, record, applied_max=applied, on_open=True)

    asyncio.run(body())


def test_corruption_found_when_rebuilding_state_halts_only_that_partition(tmp_path: Path) -> None:
    async def body() -> None:
        await populate(tmp_path, payload_bytes=600)  # several index entries per segment
        record = 2  # before the last index entry: recovery does not scan it, a read does
        segment = flip_record(tmp_path, record)
        assert segment.stat().st_size > 2 * INDEX_INTERVAL
        shutil.rmtree(tmp_path / "state" / f"p{VICTIM:04d}")  # lost: rebuild from the log
        await check_halted_alone(tmp_path, segment, record, applied_max=record - 1, on_open=False)

    asyncio.run(body())
