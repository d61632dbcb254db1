"""The events topic of a cluster is trimmed below what every node's readers and the task events
relay still need (``streams/cluster/events_trim.py``), on the memory log (the Kafka log's own
trim and a relay group's offsets are exercised by ``tests/integration/test_cluster_events_trim.py``
and ``tests/integration/test_task_events_trim.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import pytest

from conveyor.streams.clock import FakeClock
from conveyor.streams.cluster.events_trim import (
    NEEDED,
    RELAYS,
    EventsTrimmer,
    floor,
    needed,
    relay_floor,
)
from conveyor.streams.log.api import LogUnavailable
from conveyor.streams.log.memory import MemoryLog

GROUP = "c-task-events-relay"


def card(needs: dict[str, int] | None, relays: bool = False) -> dict[str, Any]:
    base: dict[str, Any] = {"node_id": "n", "url": "http://127.0.0.1:1", "leading": {}}
    return base if needs is None else {**base, NEEDED: needs, RELAYS: relays}


class Events(MemoryLog):
    """The memory log with a consumer group's committed offsets, as the broker would answer
    them (``KafkaLog.committed``); ``down``: the broker cannot be asked."""

    def __init__(self, partitions: int) -> None:
        super().__init__(partitions)
        self.offsets: dict[str, dict[int, int]] = {}
        self.asked = 0
        self.down = False

    async def committed(self, group: str) -> Mapping[int, int]:
        self.asked += 1
        if self.down:
            raise LogUnavailable("read the offsets of consumer group: Kafka did not answer")
        return dict(self.offsets.get(group, {}))


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
        events = Events(2)
        for p in (0, 1):
            await events.append(p, [b"e"] * 10)
        clusters = Clusters()
        clock = FakeClock()
        trimmer = EventsTrimmer(
            events,  # type: ignore[arg-type]  # keep_ms=0: offset_for_time is never asked
            lambda: clusters.cards,
            lambda p: p == 0,
            2,
            relay_group=GROUP,
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


def test_the_relay_needs_its_committed_offset_and_a_partition_whole_once_the_cluster_relays() -> (
    None
):
    quiet = {"n1": card({"0": 9, "1": 9})}
    relaying = {**quiet, "n2": card({"0": 9, "1": 9}, relays=True)}
    assert relay_floor(quiet, {0: 3}, 0) == 3  # the group's offset, whatever the cards say
    assert relay_floor(quiet, {0: 3}, 1) == 0  # it committed elsewhere: it reads 1 from 0
    assert relay_floor(relaying, {}, 1) == 0  # a node relays and has committed nothing yet
    assert relay_floor(quiet, {}, 0) is None  # nobody relays, no offsets: nothing held
    assert relay_floor({"old": card(None)}, {}, 0) is None  # an older node's card: no flag


def trimmer_of(events: Events, clusters: Clusters, keep_ms: int = 0) -> EventsTrimmer:
    return EventsTrimmer(
        events,  # type: ignore[arg-type]  # keep_ms=0: offset_for_time is never asked
        lambda: clusters.cards,
        lambda p: True,
        2,
        relay_group=GROUP,
        clock=FakeClock(),
        keep_ms=keep_ms,
    )


def test_a_lagging_relay_holds_the_trim_at_its_committed_offset_until_it_reads_on() -> None:
    async def main() -> None:
        events = Events(2)
        for p in (0, 1):
            await events.append(p, [b"e"] * 10)
        clusters = Clusters()
        trimmer = trimmer_of(events, clusters)
        clusters.cards = {"n1": card({"0": 10, "1": 10}, relays=True)}
        events.offsets[GROUP] = {0: 3, 1: 10}  # the relay lags in partition 0
        assert await trimmer.trim(0) == 3 and await trimmer.trim(1) == 10
        assert await trimmer.trim(0) is None and events.start_offset(0) == 3
        events.offsets[GROUP] = {0: 6, 1: 10}  # it read on
        assert await trimmer.trim(0) == 6 and events.start_offset(0) == 6
        # The node that relayed restarts without --task-events: the group's offsets stay,
        # and so does the hold (a relay stopped loses nothing), until the broker drops them.
        await events.append(0, [b"e"] * 4)
        clusters.cards = {"n1": card({"0": 14, "1": 10})}
        assert await trimmer.trim(0) is None and events.start_offset(0) == 6
        events.offsets.pop(GROUP)  # expired (offsets.retention.minutes) or deleted
        assert await trimmer.trim(0) == 14

    asyncio.run(main())


def test_a_relay_with_no_offset_in_a_partition_keeps_it_whole() -> None:
    async def main() -> None:
        events = Events(2)
        for p in (0, 1):
            await events.append(p, [b"e"] * 10)
        clusters = Clusters()
        trimmer = trimmer_of(events, clusters)
        clusters.cards = {"n1": card({"0": 8, "1": 8}, relays=True)}
        assert await trimmer.trim(0) is None  # a relay starting: it reads from the start
        clusters.cards = {"n1": card({"0": 8, "1": 8})}
        events.offsets[GROUP] = {1: 5}  # no node relays now, but the group committed in 1
        assert await trimmer.trim(0) is None and await trimmer.trim(1) == 5
        assert (events.start_offset(0), events.start_offset(1)) == (0, 5)
        events.offsets.pop(GROUP)
        assert await trimmer.trim(0) == 8  # nobody relays: the readers alone hold it

    asyncio.run(main())


def test_a_round_asks_the_broker_once_and_trims_nothing_when_it_cannot_ask(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        events = Events(2)
        for p in (0, 1):
            await events.append(p, [b"e"] * 10)
        clusters = Clusters()
        trimmer = trimmer_of(events, clusters)
        clusters.cards = {"n1": card({"0": 0, "1": 0})}
        await trimmer._round()
        assert events.asked == 0  # nothing to trim: the group is not asked for
        clusters.cards = {"n1": card({"0": 7, "1": 9})}
        events.down = True
        await trimmer._round()
        assert (events.start_offset(0), events.start_offset(1)) == (0, 0)
        assert "not trimmed now" in caplog.text and "did not answer" in caplog.text
        events.down = False
        events.asked = 0
        await trimmer._round()
        assert events.asked == 1  # one question for both partitions
        assert (events.start_offset(0), events.start_offset(1)) == (7, 9)

    asyncio.run(main())
