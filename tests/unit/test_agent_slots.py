"""The agent's slots over the nodes of a cluster (``agents/cluster.py`` rule 2): the slots
asked of all nodes never exceed the slots free, whichever nodes answer and when.

The nodes are fakes (a poll waits until the test answers it); the ``ClusterWorkerAPI`` is
the real one, driven as ``HostAgent`` drives it: poll with its free slots, start what comes
back, free a slot when an attempt ends.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import pytest

from conveyor.agents.cluster import Asks, ClusterWorkerAPI, split
from conveyor.agents.worker_api import (
    CheckpointItem,
    CompletionItem,
    ItemResult,
    LeaseOffer,
    StepItem,
)
from conveyor.errors import ContractError, InvariantError, TransientError


@pytest.mark.parametrize("free", range(0, 9))
@pytest.mark.parametrize("count", range(0, 5))
def test_split_gives_out_exactly_the_free_slots_evenly_and_in_turn(free: int, count: int) -> None:
    nodes = [f"n{i}" for i in range(count)]
    for turn in range(4):
        shares = split(free, nodes, turn)
        assert sum(shares.values()) == (free if nodes else 0)
        assert all(n >= 1 for n in shares.values())
        if shares and len(shares) == len(nodes):
            assert max(shares.values()) - min(shares.values()) <= 1
    if 0 < free < count:  # one slot each, to a different set of nodes each turn
        assert split(free, nodes, 0) != split(free, nodes, 1)


def test_the_ledger_refuses_an_ask_beyond_the_free_slots() -> None:
    asks = Asks()
    asks.ask("a", 2, capacity=3)
    with pytest.raises(InvariantError):
        asks.ask("b", 2, capacity=3)
    with pytest.raises(InvariantError):
        asks.ask("a", 1, capacity=3)  # one poll out per node
    asks.answer("a", [])
    asks.ask("b", 3, capacity=3)
    asks.check(3)


class FakeNode:
    """A node whose polls wait for the test to answer them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.asked: int | None = None  # the capacity of the poll out, if one is
        self.answer: asyncio.Future[list[LeaseOffer]] | None = None
        self.reports: list[str] = []
        self.down = False
        self.ids = 0
        self.signal_calls = 0
        self.pushed: asyncio.Future[list[tuple[str, int]]] | None = None

    async def register(self, **_: Any) -> None:
        if self.down:
            raise TransientError("down")

    async def poll(self, *, capacity: int, **_: Any) -> list[LeaseOffer]:
        assert self.asked is None, "two polls out to one node"
        if self.down:
            raise TransientError(f"{self.url} is down")
        self.asked = capacity
        self.answer = asyncio.get_running_loop().create_future()
        try:
            return await self.answer
        finally:
            self.asked = None

    def grant(self, n: int) -> None:
        assert self.answer is not None and self.asked is not None and n <= self.asked
        offers = []
        for _ in range(n):
            self.ids += 1
            offers.append(_offer(f"{self.url}-{self.ids}"))
        self.answer.set_result(offers)

    async def signals(self, *, agent_id: str, app: str, wait_ms: int) -> list[tuple[str, int]]:
        self.signal_calls += 1
        if self.url == "old":
            raise ContractError("no such call")
        self.pushed = asyncio.get_running_loop().create_future()
        return await self.pushed

    async def heartbeat(self, leases: Sequence[tuple[str, int]]) -> dict[str, str]:
        if self.down:
            raise TransientError("down")
        self.reports += [t for t, _ in leases]
        return {t: "CONTINUE" for t, _ in leases}

    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]:
        if self.down:
            raise TransientError("down")
        self.reports += [i.task_id for i in items]
        return [ItemResult(task_id=i.task_id, ok=True) for i in items]

    async def checkpoint(self, items: Sequence[CheckpointItem]) -> list[ItemResult]:
        return [ItemResult(task_id=i.task_id, ok=True) for i in items]

    async def steps(self, items: Sequence[StepItem]) -> list[ItemResult]:
        return [ItemResult(task_id=i.task_id, ok=True) for i in items]

    async def close(self) -> None:
        pass


def _offer(task_id: str) -> LeaseOffer:
    return LeaseOffer(
        task_id=task_id,
        lease_id=1,
        attempt=1,
        task_type="t",
        payload=None,
        checkpoint=None,
        lease_ms=30_000,
    )


def _cluster(nodes: dict[str, FakeNode]) -> ClusterWorkerAPI:
    async def discover(_: str) -> list[str]:
        return [url for url, node in nodes.items() if not node.down]

    return ClusterWorkerAPI("a", "key", connect=lambda url: nodes[url], discover=discover)


async def _register(api: ClusterWorkerAPI) -> None:
    await api.register(agent_id="x", app="app", version="1", task_types=["t"])


async def _poll(api: ClusterWorkerAPI, capacity: int) -> list[LeaseOffer]:
    return await api.poll(
        agent_id="x", app="app", queues=[], capacity=capacity, wait_ms=1_000, lease_ms=30_000
    )


@pytest.mark.parametrize("seed", range(20))
def test_slots_asked_of_all_nodes_never_exceed_the_free_slots(seed: int) -> None:
    asyncio.run(_slots_never_over_asked(seed))


async def _slots_never_over_asked(seed: int) -> None:
    rng = random.Random(seed)
    slots = rng.randint(1, 5)
    nodes = {url: FakeNode(url) for url in ("a", "b", "c")[: rng.randint(2, 3)]}
    api = _cluster(nodes)
    await _register(api)
    held: list[str] = []
    grants = 0
    for _ in range(60):
        free = slots - len(held)
        poll = asyncio.create_task(_poll(api, free)) if free > 0 else None
        await asyncio.sleep(0)  # the polls go out
        await asyncio.sleep(0)
        asked = sum(n.asked or 0 for n in nodes.values())
        assert asked + len(held) <= slots, f"seed {seed}: {asked} asked, {len(held)} held"
        waiting = [n for n in nodes.values() if n.asked]
        if waiting:
            node = rng.choice(waiting)
            assert node.asked is not None
            node.grant(rng.randint(0, node.asked))
        if poll is not None:
            if waiting:
                offers = await poll
                held += [o.task_id for o in offers]
                grants += len(offers)
            else:
                poll.cancel()
        assert len(held) <= slots, f"seed {seed}"
        for task_id in [t for t in held if rng.random() < 0.4]:
            held.remove(task_id)
            await api.complete([CompletionItem(task_id=task_id, lease_id=1, outcome="SUCCEEDED")])
    assert grants > 0
    await api.close()


def test_reports_go_to_the_granting_node_and_to_another_when_it_is_down() -> None:
    asyncio.run(_reports())


async def _reports() -> None:
    nodes = {url: FakeNode(url) for url in ("a", "b")}
    api = _cluster(nodes)
    await _register(api)
    poll = asyncio.create_task(_poll(api, 2))
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert nodes["a"].asked == 1 and nodes["b"].asked == 1  # one slot each
    nodes["b"].grant(1)
    (offer,) = await poll
    assert offer.task_id.startswith("b-")
    assert await api.heartbeat([(offer.task_id, 1)]) == {offer.task_id: "CONTINUE"}
    assert nodes["b"].reports == [offer.task_id] and nodes["a"].reports == []
    nodes["b"].down = True  # its reports now go to a, which forwards them to the owner
    item = CompletionItem(task_id=offer.task_id, lease_id=1, outcome="SUCCEEDED")
    (result,) = await api.complete([item])
    assert result.ok and nodes["a"].reports == [offer.task_id]
    nodes["a"].grant(0)
    await api.close()


def test_cancels_pushed_by_any_node_come_through_and_an_older_node_is_not_asked_again() -> None:
    async def signals(api: ClusterWorkerAPI) -> list[tuple[str, int]]:
        for _ in range(3):  # an answer of [] (the older node's refusal) comes first, maybe
            if got := await api.signals(agent_id="x", app="app", wait_ms=1_000):
                return got
        raise AssertionError("no signal came through")

    async def main() -> None:
        nodes = {url: FakeNode(url) for url in ("a", "b", "old")}
        api = _cluster(nodes)
        await _register(api)
        call = asyncio.create_task(signals(api))
        for _ in range(3):
            await asyncio.sleep(0)
        assert nodes["b"].pushed is not None
        nodes["b"].pushed.set_result([("t1", 3)])
        assert await call == [("t1", 3)]
        call = asyncio.create_task(signals(api))
        for _ in range(3):
            await asyncio.sleep(0)
        assert nodes["a"].pushed is not None
        nodes["a"].pushed.set_result([("t2", 1)])
        assert await call == [("t2", 1)]
        assert nodes["a"].signal_calls == 1  # its call stayed out: never two at once
        assert nodes["b"].signal_calls == 2 and nodes["old"].signal_calls == 1
        await api.close()

    asyncio.run(main())


def test_an_agent_polls_a_node_back_at_once_when_every_node_was_left_out() -> None:
    async def main() -> None:
        nodes = {url: FakeNode(url) for url in ("a", "b")}
        clock = [0.0]

        async def directory(_: str) -> list[str]:
            return list(nodes)  # a dead node's card stays listed for a while

        api = ClusterWorkerAPI(
            "a", "key", connect=lambda url: nodes[url], discover=directory, now=lambda: clock[0]
        )
        await _register(api)
        nodes["a"].down = nodes["b"].down = True  # a dies; b fails calls while taking over
        for _ in range(4):
            assert await _poll(api, 2) == []
        assert all(m.skip_until > clock[0] for m in api.members.values())  # both left out
        nodes["b"].down = False  # b leads a's partitions now
        for _ in range(3):  # at most one more try of a (due back first) before b is asked
            poll = asyncio.create_task(_poll(api, 2))
            for _ in range(3):
                await asyncio.sleep(0)
            if nodes["b"].asked:
                break
            assert await poll == []
        assert nodes["b"].asked == 2, "the agent idles while b could deal its tasks"
        nodes["b"].grant(2)
        assert len(await poll) == 2
        await api.close()

    asyncio.run(main())
