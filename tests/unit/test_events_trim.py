"""The events topic of a cluster is trimmed below what every node's readers still need
(``streams/cluster/events_trim.py``), on the memory log (the Kafka log's own trim is
exercised by ``tests/integration/test_cluster_events_trim.py``)."""

from __future__ import annotations

import asyncio
from typing import Any

from conveyor.streams.clock import FakeClock
from conveyor.streams.cluster.events_trim import NEEDED, EventsTrimmer, floor, needed
from conveyor.streams.log.memory import MemoryLog


def card(needs: dict[str, int] | None) -> dict[str, Any]:
    base: dict[str, Any] = {"node_id": "n", "url": "http://127.0.0.1:1", "leading": {}}
    return base if needs is None else {**base, NEEDED: needs}


def test_a_node_needs_the_lowest_next_offset_of_its_readers_and_all_of_what_they_never_read() -> (
    None
):
    assert needed([{0: 7, 1: 3}, {0: 5}], 3) == {"0": 5, "1": 0, "2": 0}
    assert needed([], 3) == {}  # no reader: it needs nothing


def test_the_floor_is_the_lowest_need_of_every_card_and_an_older_card_holds_it_back() -> None:
    cards = {"n1": card({"0": 9, "1": 4}), "n2": card({"0": 6, "1": 8}), "n3": card({})}
    assert (floor(cards, 0), floor(cards, 1), floor(cards, 2)) == (6, 4, None)
    assert floor({**cards, "old": card(None)}, 0) is None
    assert floor({}, 0) is None


class Clusters:
    """The cards a directory would hold; the test changes them."""

    def __init__(self) -> None:
        self.cards: dict[str, dict[str, Any]] = {}


def test_the_owner_trims_each_partition_it_leads_no_further_than_any_reader_needs() -> None:
    async def main() -> None:
        events = MemoryLog(2)
        for p in (0, 1):
            await events.append(p, [b"e"] * 10)
        clusters = Clusters()
        clock = FakeClock()
        trimmer = EventsTrimmer(
            events,  # type: ignore[arg-type]  # keep_ms=0: offset_for_time is never asked
            lambda: clusters.cards,
            lambda p: p == 0,
            2,
            clock=clock,
            interval_ms=1_000,
            keep_ms=0,
        )
        clusters.cards = {"n1": card({"0": 7, "1": 9}), "n2": card({"0": 4, "1": 9})}
        trimmer.start()
        try:
            for _ in range(100):  # its loop sleeps on the fake clock: move it until it ran
                if events.start_offset(0) == 4:
                    break
                clock.advance(1_000)
                await asyncio.sleep(0)
            assert (events.start_offset(0), events.start_offset(1)) == (4, 0)  # 1 not led here
            # n2 is down: its last card stays and holds the trim where its reader stopped.
            clusters.cards["n1"] = card({"0": 10, "1": 10})
            assert await trimmer.trim(0) is None and events.start_offset(0) == 4
            clusters.cards["n2"] = card({"0": 8, "1": 10})  # back, and caught up to 8
            assert await trimmer.trim(0) == 8 and events.start_offset(0) == 8
            clusters.cards["n3"] = card(None)  # a node of an older build joins
            assert await trimmer.trim(0) is None and events.start_offset(0) == 8
        finally:
            await trimmer.stop()

    asyncio.run(main())
