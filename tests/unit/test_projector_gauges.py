"""The projection's gauges. Tasks by state: recounted every 15 s, unless a count takes long (it
scans every task row), then only when its last run is at most 1% of the time since. The lag:
read from the projector when scraped, so it is current between its writes."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest

from conveyor.store.postgres import queries
from conveyor.streams.clock import FakeClock
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.sinks import projector
from conveyor.streams.sinks.metrics import Metrics


class _Pool:
    @contextlib.asynccontextmanager
    async def acquire(self) -> AsyncIterator[None]:
        yield None


def _counts(clock: FakeClock, took_ms: float, at: list[float]) -> Any:
    async def tasks_by_state(conn: Any) -> list[tuple[str, str, int]]:
        at.append(clock.monotonic_ms())
        clock.advance(took_ms)  # the count's own time
        return [("default", "ENQUEUED", 1)]

    return tasks_by_state


@pytest.mark.parametrize(("took_ms", "every_ms"), [(20.0, 15_000.0), (2_000.0, 200_000.0)])
def test_a_slow_count_is_redone_at_most_at_one_percent_of_the_time(
    monkeypatch: pytest.MonkeyPatch, took_ms: float, every_ms: float
) -> None:
    async def main() -> list[float]:
        clock = FakeClock()
        counted: list[float] = []
        monkeypatch.setattr(queries, "tasks_by_state", _counts(clock, took_ms, counted))
        p = projector.Projector(MemoryLog(1), _Pool(), metrics=Metrics(), clock=clock)  # type: ignore[arg-type]
        task = asyncio.create_task(p.refresh_gauges())
        for _ in range(40):  # 600 s in steps of the refresh interval
            await asyncio.sleep(0)
            clock.advance(projector.GAUGE_REFRESH_MS)
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        return counted

    counted = asyncio.run(main())
    gaps = [b - a for a, b in itertools.pairwise(counted)]
    assert gaps and all(every_ms <= gap < every_ms + projector.GAUGE_REFRESH_MS for gap in gaps)


def test_the_projection_lag_is_read_when_scraped() -> None:
    async def main() -> None:
        metrics = Metrics()
        assert b"conveyor_projection_lag" not in metrics.exposition()  # no projector yet
        events = MemoryLog(2)
        p = projector.Projector(events, _Pool(), metrics=metrics, clock=FakeClock())
        p.next_offsets = {0: 1, 1: 0}
        await events.append(0, [b"a", b"b", b"c"])
        text = metrics.exposition().decode()
        assert 'conveyor_projection_lag_records{partition="0"} 2.0' in text
        assert 'conveyor_projection_lag_records{partition="1"} 0.0' in text
        p.next_offsets = {0: 3}
        text = metrics.exposition().decode()
        assert 'conveyor_projection_lag_records{partition="0"} 0.0' in text
        assert "conveyor_projection_lag_seconds 0.0" in text

    asyncio.run(main())
