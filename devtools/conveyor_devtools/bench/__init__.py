"""The benchmarks of ``conveyor bench``; ``bench_engine`` and ``bench_fairness`` time the engine
itself, without HTTP (``conveyor bench engine|fairness``)."""

from conveyor_devtools.bench.engine import bench_engine
from conveyor_devtools.bench.fairness import bench_fairness

__all__ = ["bench_engine", "bench_fairness"]
