"""What a fault run on Kafka reads back after it healed: the record log's topic, and the
partition states the stopped nodes left in their homes.

The log is read ``read_committed`` from its first offset, so it shows what every node applies:
an aborted transaction (a fenced producer's) is not in it. Along each partition's offsets a
leader record (epoch > 0; client and agent records carry 0) at an epoch below one announced
earlier on that partition is *stale*: the machine ignores it (``machine/apply.py``
``accepts``), and it can only be there if a former leader's producer was not fenced when it
appended. A fault run expects none.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conveyor.schemas import codec, types
from conveyor.streams.log.kafka import KafkaLog
from conveyor_devtools.chaos.runner import _state_keys, enqueued_keys


@dataclass
class LogEvidence:
    keys: list[str | None] = field(default_factory=list)  # of every enqueued task spec
    stale_records: int = 0
    stale_examples: list[dict[str, Any]] = field(default_factory=list)
    announced: int = 0  # AnnounceEpoch records: one per leadership


@dataclass
class _Partition:
    announced_epoch: int = 0
    leader: str = ""


async def read_log(bootstrap: str, partitions: int, topic: str) -> LogEvidence:
    log = await KafkaLog.open(bootstrap, partitions, topic=topic)
    out = LogEvidence()
    try:
        for p in range(partitions):
            if log.end_offset(p) <= log.start_offset(p):
                continue
            state = _Partition()
            async for batch in log.read(p, log.start_offset(p), follow=False):
                for record in batch:
                    _note(out, state, p, record.offset, record.data)
    finally:
        await log.close()
    return out


def _note(out: LogEvidence, state: _Partition, p: int, offset: int, data: bytes) -> None:
    out.keys.extend(enqueued_keys(data))
    envelope = codec.decode_envelope(data)
    kind = codec.kind_of(envelope)[0]
    if envelope.epoch and envelope.epoch < state.announced_epoch:
        out.stale_records += 1
        out.stale_examples.append(
            {
                "partition": p,
                "offset": offset,
                "kind": kind,
                "epoch": envelope.epoch,
                "announced": state.announced_epoch,
                "announced_by": state.leader,
            }
        )
    if kind == "AnnounceEpoch" and envelope.epoch >= state.announced_epoch:
        record = codec.decode_body(envelope)
        assert isinstance(record, types.AnnounceEpoch)
        state.announced_epoch, state.leader = envelope.epoch, record.leader_id
        out.announced += 1


def state_keys(state_roots: Iterable[Path]) -> dict[str, str | None]:
    """Task id -> idempotency key over every node's partition states (a partition a node led
    once and handed over is there too, as it was when it left)."""
    out: dict[str, str | None] = {}
    for root in state_roots:
        if root.is_dir():
            out.update(_state_keys(root))
    return out
