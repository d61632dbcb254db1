"""RocksDB (rocksdict) implementation of the KV protocol: one database per partition."""

from conveyor.store.rocksdb.kv import RocksKV

__all__ = ["RocksKV"]
