"""Completions a partition cannot take for now (it halted, its disk is full) answer
``retry_after_ms``: the node answers them alone, the other partitions' items are applied, and
the agent's completer sends them again after the pause without holding back later batches."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest
from test_processor_halt import FailingLaterLog

from conveyor.agents import completer as completer_module
from conveyor.agents.completer import Completer
from conveyor.agents.worker_api import CompletionItem, ItemResult
from conveyor.errors import ConveyorError, TransientError
from conveyor.schemas.types import Completion, Outcome, TaskSpec
from conveyor.store.memory import MemoryKV
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.node import Node
from conveyor.streams.routing import mint_task_id


def test_a_halted_partition_answers_its_completions_alone_and_the_others_are_applied() -> None:
    async def main() -> None:
        log = FailingLaterLog(partitions=2, failing=1)
        node = Node(log, MemoryLog(2), [MemoryKV(), MemoryKV()])
        await node.start()
        try:
            specs = [
                TaskSpec(task_id=mint_task_id(p), tenant="t", app="shop", task_type="email")
                for p in (0, 1)
            ]
            await node.enqueue(specs)
            leases = []
            while len(leases) < 2:
                leases += await node.poll(
                    agent_id="a", app="shop", tenants=[], queues=[], capacity=2, wait_ms=2_000
                )
            log.broken = True
            done = [
                Completion(task_id=x.task_id, lease_id=x.lease_id, outcome=Outcome.SUCCEEDED)
                for x in sorted(leases, key=lambda x: x.task_id)
            ]
            first, second = await node.complete(done)
            assert first.ok and first.retry_after_ms is None
            assert node.get("t", specs[0].task_id).status == "SUCCEEDED"
            assert not second.ok and second.retry_after_ms is not None, second
            assert "partition 1 halted" in (second.reason or "")
        finally:
            await node.stop()

    asyncio.run(main())


class RefusingAPI:
    """Answers the first completion of ``refused`` with retry_after_ms, everything else ok."""

    def __init__(self, refused: str) -> None:
        self.refused = refused
        self.calls: list[list[str]] = []

    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]:
        self.calls.append([i.task_id for i in items])
        first = sum(self.refused in call for call in self.calls) == 1
        return [
            ItemResult(task_id=i.task_id, ok=False, reason="halted", retry_after_ms=50)
            if i.task_id == self.refused and first
            else ItemResult(task_id=i.task_id, ok=True)
            for i in items
        ]


def item(task_id: str) -> CompletionItem:
    return CompletionItem(task_id=task_id, lease_id=1, outcome="SUCCEEDED")


def test_the_completer_sends_a_refused_completion_again_without_holding_back_the_next() -> None:
    async def main() -> None:
        api = RefusingAPI("b")
        completer = Completer(api, window_ms=1)  # type: ignore[arg-type]
        running = asyncio.create_task(completer.run())
        try:
            await completer.put(item("a"), None)
            await completer.put(item("b"), None)
            while not api.calls:
                await asyncio.sleep(0.001)
            await completer.put(item("c"), None)
            assert completer.unreported == {"b": 1, "c": 1}  # b's lease is heartbeated on
            await asyncio.wait_for(completer.flushed(), 5)
            assert api.calls == [["a", "b"], ["c"], ["b"]]  # c did not wait behind b
            assert (completer.completed, completer.dropped, completer.unacked) == (3, 0, 0)
            assert completer.unreported == {}
        finally:
            running.cancel()

    asyncio.run(main())


class UnreachableAPI:
    """Fails ``down`` calls as a whole, as an unreachable node does (or, with
    ``own_error``, with an error of the node's own), then answers every item ok."""

    def __init__(self, down: int, *, own_error: bool = False) -> None:
        self.down = down
        self.own_error = own_error
        self.calls = 0

    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]:
        self.calls += 1
        if self.calls <= self.down:
            if self.own_error:
                raise ConveyorError("500: internal error")
            raise TransientError("POST /worker/complete: gave up after 9 tries: 503")
        return [ItemResult(task_id=i.task_id, ok=True) for i in items]


def test_a_report_waits_out_an_unreachable_node_and_gives_up_only_on_its_own_errors(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The old completer gave up after five failed calls (31 s), and the finished tasks ran
    again once their leases lapsed; a node restarting for longer than that must not cost
    that."""
    monkeypatch.setattr(completer_module, "RETRY_PAUSE_S", 0.001)
    monkeypatch.setattr(completer_module, "RETRY_PAUSE_MAX_S", 0.002)

    async def send(api: UnreachableAPI) -> Completer:
        completer = Completer(api, window_ms=1)  # type: ignore[arg-type]
        running = asyncio.create_task(completer.run())
        try:
            await completer.put(item("a"), None)
            await asyncio.wait_for(completer.flushed(), 5)
        finally:
            running.cancel()
        return completer

    async def main() -> None:
        waited = await send(UnreachableAPI(down=12))
        assert (waited.completed, waited.dropped, waited.unreported) == (1, 0, {})
        own = UnreachableAPI(down=12, own_error=True)
        gave_up = await send(own)
        assert own.calls == completer_module.TRIES_MAX and gave_up.completed == 0

    asyncio.run(main())


class TrippedAPI:
    """Fails every call that holds ``culprit`` (any call at all, with None) with an error of
    the node's own (a 500), as a node bug set off by one report would; answers the others ok."""

    def __init__(self, culprit: str | None) -> None:
        self.culprit = culprit
        self.calls: list[list[str]] = []

    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]:
        self.calls.append([i.task_id for i in items])
        if self.culprit is None or any(i.task_id == self.culprit for i in items):
            raise ConveyorError("500: internal error")
        return [ItemResult(task_id=i.task_id, ok=True) for i in items]


@pytest.mark.parametrize(
    ("culprit", "completed", "halves"),
    [
        # Before, all eight were given up after five tries: seven finished tasks would have run
        # again for the one report the node could not take.
        ("c", 7, ["abcd", "efgh", "ab", "cd", "c", "d"]),
        # Every call fails: not one report's doing, so no search through the batch either.
        (None, 0, ["abcd", "efgh"]),
    ],
)
def test_a_report_that_trips_the_node_is_given_up_alone(
    monkeypatch: pytest.MonkeyPatch, culprit: str | None, completed: int, halves: list[str]
) -> None:
    monkeypatch.setattr(completer_module, "RETRY_PAUSE_S", 0.001)
    monkeypatch.setattr(completer_module, "RETRY_PAUSE_MAX_S", 0.002)

    async def main() -> None:
        api = TrippedAPI(culprit)
        completer = Completer(api, window_ms=1)  # type: ignore[arg-type]
        running = asyncio.create_task(completer.run())
        try:
            for task_id in "abcdefgh":
                await completer.put(item(task_id), None)
            await asyncio.wait_for(completer.flushed(), 5)
        finally:
            running.cancel()
        # Given up: no longer heartbeated, the lease lapses and the task runs again.
        assert (completer.completed, completer.unreported) == (completed, {})
        tries = completer_module.TRIES_MAX
        assert api.calls == [list("abcdefgh")] * tries + [list(half) for half in halves]

    asyncio.run(main())
