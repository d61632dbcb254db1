"""Benchmarks of the engine itself (``conveyor bench engine|fairness``)."""

from conveyor.streams.bench.engine import bench_engine
from conveyor.streams.bench.fairness import bench_fairness

__all__ = ["bench_engine", "bench_fairness"]
