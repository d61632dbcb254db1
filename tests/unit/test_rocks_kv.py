"""RocksKV: scans yield exactly the keys under a prefix, in order; point reads of flushed tables."""

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


def test_point_reads_of_flushed_tables_go_through_bloom_filters(tmp_path: Path) -> None:
    db = RocksKV(tmp_path / "db")
    db.write({b"t%05d" % i: b"v%d" % i for i in range(0, 4_000, 2)})
    db.close()  # flushes: what follows reads table files, not the memtable
    db = RocksKV(tmp_path / "db")
    try:
        assert db.get(b"t00042") == b"v42"
        assert db.get(b"t00043") is None  # a miss, which the filter answers
        latest = max((tmp_path / "db").glob("OPTIONS-*"), key=lambda f: f.stat().st_mtime_ns)
        assert "filter_policy=bloomfilter" in latest.read_text()
    finally:
        db.close()
