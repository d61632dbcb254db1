"""RocksKV.scan: exactly the keys under a prefix, in order, whatever lies around them."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from conveyor.store.rocksdb.kv import RocksKV, successor


@pytest.fixture
def kv(tmp_path: Path) -> Iterator[RocksKV]:
    db = RocksKV(tmp_path / "db")
    yield db
    db.close()


def test_successor_is_the_least_key_above_the_prefix() -> None:
    assert successor(b"k") == b"l"
    assert successor(b"a\x01") == b"a\x02"
    assert successor(b"a\xff") == b"b"
    assert successor(b"a\xfe\xff\xff") == b"a\xff"
    assert successor(b"\xff\xff") is None
    assert successor(b"") is None


def test_scan_yields_the_prefix_only_in_key_order(kv: RocksKV) -> None:
    kv.write({b"j9": b"0", b"k": b"1", b"k\x00": b"2", b"k\xff\xff": b"3", b"l": b"4"})
    assert list(kv.scan(b"k")) == [(b"k", b"1"), (b"k\x00", b"2"), (b"k\xff\xff", b"3")]
    assert list(kv.scan(b"k\xff")) == [(b"k\xff\xff", b"3")]
    assert list(kv.scan(b"\xff")) == []


def test_scan_from_a_start_inside_the_prefix(kv: RocksKV) -> None:
    kv.write({b"q1": b"a", b"q2": b"b", b"q3": b"c", b"r1": b"d"})
    assert [k for k, _ in kv.scan(b"q", b"q2")] == [b"q2", b"q3"]
    assert [k for k, _ in kv.scan(b"q", b"p")] == [b"q1", b"q2", b"q3"]  # start below: prefix
    assert list(kv.scan(b"q", b"q4")) == []


def test_scan_ends_at_its_prefix_before_tombstones_and_live_keys_after_it(kv: RocksKV) -> None:
    kv.write({b"l%05d" % i: b"x" for i in range(2_000)})
    kv.write({b"l%05d" % i: None for i in range(2_000)})
    kv.write({b"k1": b"1", b"l99999": b"live"})
    assert list(kv.scan(b"k")) == [(b"k1", b"1")]
    assert list(kv.scan(b"l")) == [(b"l99999", b"live")]
