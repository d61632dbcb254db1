"""The projector in a process of its own, fed the events log by the node over a socket.

    node process                                     projector process
    events log p --read(follow)--> ship --RECORDS--> ShippedLog --> Projector --> PostgreSQL
                                  ^                                   |
                                  +---- READ p from offset -----------+
                                  +---- PROGRESS (after each write) --+

The projection is a fifth of a busy node's event loop (folding events, encoding the rows for
asyncpg); here it runs on the other core. Rules, and why:

1. The node only reads and ships: the child asks for each partition from its watermark (READ),
   and the node follows that partition from there, sending the records as they are (RECORDS),
   so the child reads exactly what an in-process projector would, durable records only
   (``LocalLog`` rule 9), without opening a log that another process writes.
2. The child is the same ``Projector``: every rule of ``projector.py`` holds unchanged.
3. The node keeps the progress the child reports (PROGRESS after each write): the lag gauges,
   ``wait_caught_up`` and the projected-events counter read it as they read an in-process
   projector's. The event-derived metrics are not the projector's: the node's processors feed
   them as they commit (``Metrics.watch``).
4. Either side ending ends the other: the child exits when its socket closes (the node
   stopped or died), and ``run`` returns the child's failure when it exits, for the snapshot's
   supervisor to restart it from its watermark (rule 1 of ``projector.py``).
5. Bounded: the child stops reading its socket while a partition has ``SHIPPED_MAX`` read
   batches waiting, and the node's sends wait for the socket, so a projector that is behind
   holds a few batches in memory, not the events log.
6. A trickle is shipped every ``SHIP_LINGER_S`` at most, per partition, not a send (and a
   wakeup of the child) per record. The projector lingers longer for a small chunk anyway
   (``LINGER_MS``), so the snapshot hardly lags more.
7. The projection is background work: the child runs at a lower priority (``NICE``), so on
   a busy machine the node answering enqueues and polls, the agent and its guests come first,
   and the snapshot lags instead (bounded by rule 5). At the same priority, single-enqueue p99
   under load was ~25% worse than with the projector in the node's loop; at nice 10 it is
   better than that, and throughput is higher still.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import socket
import struct
import sys
from collections.abc import AsyncIterator, Sequence
from typing import Any

import asyncpg

from conveyor.errors import InvariantError
from conveyor.store.postgres import connect_pool, projection
from conveyor.store.postgres.server import DSN_ENV
from conveyor.streams.clock import Clock
from conveyor.streams.log.api import LogRecord
from conveyor.streams.node import Node
from conveyor.streams.sinks.metrics import Metrics
from conveyor.streams.sinks.projector import READ_BATCH, Events, Progress, Projector

log = logging.getLogger("conveyor.projector")

# A frame: kind, partition, offset, then ``size`` bytes of body.
_HEAD = struct.Struct("<BIQI")
_LEN = struct.Struct("<I")
READ, RECORDS, FAILED, PROGRESS = 1, 2, 3, 4
STOP_TIMEOUT_S = 10.0  # for the child to exit once its socket is closed
CHILD_POOL_SIZE = 2  # the projector writes one chunk at a time
SHIPPED_MAX = 4  # read batches waiting in the child per partition (rule 5)
SHIP_LINGER_S = 0.02  # rule 6
NICE = 10  # rule 7


def _frame(kind: int, partition: int, offset: int, body: bytes = b"") -> bytes:
    return _HEAD.pack(kind, partition, offset, len(body)) + body


async def _read_frame(reader: asyncio.StreamReader) -> tuple[int, int, int, bytes] | None:
    """The next frame; None at the end of the stream."""
    try:
        head = await reader.readexactly(_HEAD.size)
    except asyncio.IncompleteReadError:
        return None
    kind, partition, offset, size = _HEAD.unpack(head)
    return kind, partition, offset, await reader.readexactly(size)


def _pack_records(records: Sequence[LogRecord]) -> bytes:
    return b"".join(_LEN.pack(len(r.data)) + r.data for r in records)


def _unpack_records(first: int, body: bytes) -> list[LogRecord]:
    records: list[LogRecord] = []
    at = 0
    while at < len(body):
        (size,) = _LEN.unpack_from(body, at)
        at += _LEN.size
        records.append(LogRecord(offset=first + len(records), data=body[at : at + size]))
        at += size
    return records


# -- the node's side ------------------------------------------------------------------------


class ProjectorProcess(Progress):
    """Runs the projector process and keeps its progress (rule 3). ``run`` returns or raises
    when the child exits; the snapshot's supervisor restarts it."""

    def __init__(
        self,
        events: Events,
        pool: asyncpg.Pool,
        dsn: str,
        *,
        metrics: Metrics | None = None,
        clock: Clock | None = None,
    ) -> None:
        super().__init__(events, pool, metrics=metrics, clock=clock)
        self.dsn = dsn
        self.pid: int | None = None
        self._child_projected = 0  # events the running child reported projected

    async def run(self) -> None:
        async with self.pool.acquire() as conn:  # where the child will start: the lag until
            self.next_offsets = await projection.watermarks(conn)  # its first write
        mine, theirs = socket.socketpair()
        reader, writer = await asyncio.open_unix_connection(sock=mine)
        proc = None
        ships: dict[int, asyncio.Task[None]] = {}
        side = [asyncio.create_task(self.refresh_gauges())] if self.metrics else []
        try:
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "conveyor.streams.sinks.projector_process",
                "--fd",
                str(theirs.fileno()),
                "--partitions",
                str(self.events.partitions),
                pass_fds=[theirs.fileno()],
                stdin=asyncio.subprocess.DEVNULL,
                env={**os.environ, DSN_ENV: self.dsn},
            )
            theirs.close()
            self.pid, self._child_projected = proc.pid, 0
            await self._serve(reader, writer, ships)
        finally:
            theirs.close()
            for task in [*ships.values(), *side]:
                task.cancel()
            for task in [*ships.values(), *side]:
                with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                    await task
            writer.close()  # the child sees the end of its socket and exits (rule 4)
            if proc is not None:
                await _reap(proc)
        if proc.returncode != 0:
            raise RuntimeError(f"the projector process exited with {proc.returncode}")

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        ships: dict[int, asyncio.Task[None]],
    ) -> None:
        while (frame := await _read_frame(reader)) is not None:
            kind, partition, offset, body = frame
            if kind == READ:  # once per partition and child (``ShippedLog.read``)
                ships[partition] = asyncio.create_task(self._ship(partition, offset, writer))
            elif kind == PROGRESS:
                self._progress(json.loads(body))

    async def _ship(self, partition: int, start: int, writer: asyncio.StreamWriter) -> None:
        try:
            start = await self._readable(partition, start)
            async for records in self.events.read(
                partition, start, follow=True, max_batch=READ_BATCH
            ):
                writer.write(_frame(RECORDS, partition, records[0].offset, _pack_records(records)))
                await writer.drain()
                if len(records) < READ_BATCH:  # rule 6: a trickle goes in fewer, larger sends
                    await asyncio.sleep(SHIP_LINGER_S)
        except (asyncio.CancelledError, ConnectionError):
            raise
        except Exception as exc:  # the child's reader raises it: its projector stops
            writer.write(_frame(FAILED, partition, start, repr(exc).encode()))

    async def _readable(self, partition: int, start: int) -> int:
        """``start``, or the events log's start if it was trimmed past it: a cluster trims the
        events topic below what every node's card says its readers need
        (``cluster/events_trim.py``), so only a node that was gone through a trim, or is new
        to a trimmed cluster, gets here. Its snapshot then lists the tasks whose events are
        still in the log."""
        refresh = getattr(self.events, "refresh_start_offset", None)  # a log others trim
        if refresh is None:
            return start
        first = int(await refresh(partition))
        if start < first:
            log.warning(
                "projector: events partition %d was trimmed below %d, past this snapshot's "
                "watermark %d; projecting from %d (the snapshot lacks the tasks whose events "
                "were all trimmed)",
                partition,
                first,
                start,
                first,
            )
            return first
        return start

    def _progress(self, report: dict[str, Any]) -> None:
        self.next_offsets = {int(p): int(o) for p, o in report["next_offsets"].items()}
        projected = int(report["events_projected"])  # by this child, from 0
        new, self._child_projected = projected - self._child_projected, projected
        self.events_projected += new
        self.last_event_ms = report["last_event_ms"]
        if self.metrics is not None:
            self.metrics.projected_events.inc(new)
            for write_s in report["write_s"]:
                self.metrics.projection_batch.observe(write_s)


async def _reap(proc: asyncio.subprocess.Process) -> None:
    try:
        await asyncio.wait_for(proc.wait(), STOP_TIMEOUT_S)
    except TimeoutError:
        log.warning("the projector process did not exit; killing it")
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()


# -- the projector process ------------------------------------------------------------------


class ShippedLog:
    """The events log as the node ships it: what ``Projector`` reads (rule 1). A partition's
    records come in order from the offset asked for; a FAILED frame raises in its reader."""

    def __init__(self, partitions: int, writer: asyncio.StreamWriter) -> None:
        self._partitions = partitions
        self._writer = writer
        self._queues: dict[int, asyncio.Queue[list[LogRecord] | Exception]] = {}
        self._next: dict[int, int] = {}  # per partition, the offset the next records start at
        self._opening: set[int] = set()  # partitions whose first records have not come yet

    @property
    def partitions(self) -> int:
        return self._partitions

    def end_offset(self, partition: int) -> int:
        raise NotImplementedError("the node keeps the lag of a projector process")

    async def read(
        self, partition: int, from_offset: int, *, follow: bool = False, max_batch: int = 1024
    ) -> AsyncIterator[list[LogRecord]]:
        if not follow or partition in self._queues:
            raise InvariantError(f"partition {partition}: a projector process follows each once")
        queue = self._queues[partition] = asyncio.Queue(SHIPPED_MAX)
        self._next[partition] = from_offset
        self._opening.add(partition)
        self._writer.write(_frame(READ, partition, from_offset))
        while True:
            item = await queue.get()
            if isinstance(item, Exception):
                raise item
            yield item

    async def receive(self, reader: asyncio.StreamReader) -> None:
        """File the node's frames until its end of the socket closes."""
        while (frame := await _read_frame(reader)) is not None:
            kind, partition, offset, body = frame
            queue = self._queues[partition]
            if kind == RECORDS:
                records = _unpack_records(offset, body)
                # The first records may start later: the log was trimmed past the offset
                # asked for, and the node starts at the log's start (``_readable``).
                opening = partition in self._opening and offset > self._next[partition]
                self._opening.discard(partition)
                if offset != self._next[partition] and not opening:
                    raise RuntimeError(
                        f"events partition {partition}: shipped from {offset}, "
                        f"expected {self._next[partition]}"
                    )
                self._next[partition] = records[-1].offset + 1
                await queue.put(records)  # when full, the node's sends wait (rule 5)
            elif kind == FAILED:
                await queue.put(RuntimeError(f"events partition {partition}: {body.decode()}"))


async def _serve_child(fd: int, partitions: int) -> None:
    reader, writer = await asyncio.open_unix_connection(sock=socket.socket(fileno=fd))
    pool = await connect_pool(os.environ[DSN_ENV], size_max=CHILD_POOL_SIZE)
    shipped = ShippedLog(partitions, writer)
    writes: list[float] = []
    wrote = asyncio.Event()

    def on_write(write_s: float) -> None:
        writes.append(write_s)
        wrote.set()

    projector = Projector(shipped, pool, on_write=on_write)

    async def report() -> None:
        """PROGRESS after each write (rule 3)."""
        while True:
            await wrote.wait()
            wrote.clear()
            body = {
                "next_offsets": projector.next_offsets,
                "events_projected": projector.events_projected,
                "last_event_ms": projector.last_event_ms,
                "write_s": writes[:],
            }
            writes.clear()
            writer.write(_frame(PROGRESS, 0, 0, json.dumps(body).encode()))
            await writer.drain()

    tasks = [
        asyncio.create_task(shipped.receive(reader)),
        asyncio.create_task(projector.run()),
        asyncio.create_task(report()),
    ]
    try:
        done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in done:
            task.result()  # a projector failure exits non-zero; the node restarts us
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await task
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--fd", type=int, required=True)
    parser.add_argument("--partitions", type=int, required=True)
    args = parser.parse_args()
    # Its life is the node's (rule 4): a Ctrl-C or a SIGTERM sent to the node's process group
    # is for the node, which closes the socket once it has stopped using the projection.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.nice(NICE)  # rule 7
    logging.basicConfig(level=logging.WARNING, format="projector: %(levelname)s %(message)s")
    Node.tune_gc()  # as in the node, where the projector ran before: folds hold no cycles
    asyncio.run(_serve_child(args.fd, args.partitions))


if __name__ == "__main__":
    main()
