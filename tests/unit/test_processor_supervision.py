"""Rule 6 of ``processor/loop.py``: a leader duty that fails on an error nobody expects (a bug)
does not leave the partition taking work it never dispatches: the processor leads again, as a
new leader would, and the work moves."""

from __future__ import annotations

import asyncio
import logging

import pytest

from conveyor.schemas.types import TaskSpec
from conveyor.streams.node import Node
from conveyor.streams.processor.dispatch import Dispatcher
from conveyor.streams.routing import mint_task_id


def test_a_failed_leader_duty_is_led_again_and_the_waiting_task_is_dispatched(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    requests = Dispatcher._requests
    failures = 0

    def once_broken(self: Dispatcher) -> object:
        nonlocal failures
        if failures == 0:
            failures += 1
            raise RuntimeError("a bug in the dispatcher")
        return requests(self)

    async def main() -> None:
        node = Node.in_memory(1)
        await node.start()
        processor = node.processors[0]
        epoch = processor.epoch
        monkeypatch.setattr(Dispatcher, "_requests", once_broken)
        try:
            spec = TaskSpec(task_id=mint_task_id(0), tenant="t", app="shop", task_type="email")
            await node.enqueue([spec])
            leases = await node.poll(
                agent_id="a", app="shop", tenants=[], queues=[], capacity=1, wait_ms=10_000
            )
            assert [lease.task_id for lease in leases] == [spec.task_id]
            assert failures == 1 and processor.duty_failures == 1
            assert processor.leader and processor.epoch > epoch
        finally:
            await node.stop()

    with caplog.at_level(logging.ERROR):
        asyncio.run(main())
    assert "a leader duty failed" in caplog.text and "a bug in the dispatcher" in caplog.text
