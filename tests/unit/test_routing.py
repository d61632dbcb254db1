"""Task ids: their partition is read off the id, and later ids sort after earlier ones."""

from __future__ import annotations

import time

import pytest

from conveyor.errors import ContractError
from conveyor.streams.routing import (
    TASK_ID_LENGTH,
    mint_task_id,
    partition_for_key,
    partition_of,
)
from conveyor.wire import MINTED_KEY_PREFIX, minted_key


def test_a_minted_id_names_its_partition() -> None:
    for partition in (0, 7, 0xFFFF):
        task_id = mint_task_id(partition)
        assert len(task_id) == TASK_ID_LENGTH and int(task_id, 16) >= 0
        assert partition_of(task_id, 0x10000) == partition


def test_ids_of_one_partition_are_time_ordered_and_unique() -> None:
    first = [mint_task_id(3) for _ in range(1_000)]
    time.sleep(0.002)
    later = [mint_task_id(3) for _ in range(1_000)]
    assert max(first) < min(later)  # new ids land at the right edge of every index
    assert len(set(first + later)) == 2_000
    minted_ms = int(later[0][4:16], 16)
    assert abs(minted_ms - time.time() * 1000) < 60_000


def test_an_id_of_a_partition_this_node_lacks_is_refused() -> None:
    with pytest.raises(ContractError, match="names no partition here"):
        partition_of(mint_task_id(8), 8)
    with pytest.raises(ContractError, match="not a Conveyor task id"):
        partition_of("g" * TASK_ID_LENGTH, 8)


def test_keys_the_sdk_mints_route_by_their_window_and_a_retry_meets_its_twin() -> None:
    partitions = 8
    window = [minted_key() for _ in range(50)]  # minted together: one or two windows
    assert all(k.startswith(MINTED_KEY_PREFIX) and len(k.encode()) <= 256 for k in window)
    assert len({partition_for_key("t", k, partitions) for k in window}) <= 2
    for key in window:  # a transport retry sends the same key: the same partition
        assert partition_for_key("t", key, partitions) == partition_for_key("t", key, partitions)
    # Windows spread over the partitions; tenants of one window too.
    spread = {partition_for_key("t", f"{MINTED_KEY_PREFIX}{w:x}~x", partitions) for w in range(64)}
    assert len(spread) == partitions
    assert len({partition_for_key(f"t{i}", window[0], partitions) for i in range(64)}) > 1


def test_a_key_of_the_users_routes_by_the_whole_key() -> None:
    partitions = 8
    spread = {partition_for_key("t", f"order-{i}", partitions) for i in range(64)}
    assert len(spread) == partitions
    # A key that only looks minted (no window end) is hashed whole, and does not fail.
    odd = {partition_for_key("t", f"{MINTED_KEY_PREFIX}{i}", partitions) for i in range(64)}
    assert len(odd) == partitions
