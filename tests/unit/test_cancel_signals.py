"""Cancel signals: the node's boxes (``streams/processor/signals.py``) and the agent's use of
them (``agents/signals.py``): a pushed cancel stops the attempt of that lease and no other."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
from test_host_agent_leases import FakeAPI, FakeExecutor, app, offer, until

from conveyor.agents.host import HostAgent
from conveyor.errors import NotFound
from conveyor.streams.clock import SystemClock
from conveyor.streams.processor.signals import PENDING_MAX, CancelSignals

pytestmark = pytest.mark.timeout(30)


def test_a_post_wakes_the_agents_waiting_call_at_once() -> None:
    async def main() -> None:
        board = CancelSignals(SystemClock())
        waiting = asyncio.create_task(board.wait("t1", "shop", "agent-a", 10_000))
        await until("the call to wait", lambda: len(board) == 1)
        loop = asyncio.get_running_loop()
        posted = loop.time()
        board.post("t1", "shop", "agent-a", "task-1", 7)
        assert await asyncio.wait_for(waiting, 1.0) == [("task-1", 7)]
        assert loop.time() - posted < 0.5

    asyncio.run(main())


def test_signals_between_two_calls_wait_for_the_next_one() -> None:
    async def main() -> None:
        board = CancelSignals(SystemClock())
        assert await board.wait("t1", "shop", "agent-a", 0) == []  # the agent listens
        board.post("t1", "shop", "agent-a", "task-1", 7)
        board.post("t1", "shop", "agent-a", "task-2", 3)
        assert await board.wait("t1", "shop", "agent-a", 10_000) == [("task-1", 7), ("task-2", 3)]
        assert await board.wait("t1", "shop", "agent-a", 0) == []

    asyncio.run(main())


def test_an_agent_that_never_listens_gets_nothing_kept() -> None:
    async def main() -> None:
        board = CancelSignals(SystemClock())
        board.post("t1", "shop", "agent-a", "task-1", 7)
        board.post("t1", "shop", None, "task-2", 1)  # a lease of no known agent
        assert len(board) == 0 and board.posted == 0
        assert await board.wait("t1", "shop", "agent-a", 0) == []

    asyncio.run(main())


def test_another_tenant_or_app_naming_the_agent_id_reads_none_of_its_cancels() -> None:
    async def main() -> None:
        board = CancelSignals(SystemClock())
        for tenant, app_name in (("t1", "shop"), ("t2", "shop"), ("t1", "other")):
            await board.wait(tenant, app_name, "agent-a", 0)
        board.post("t1", "shop", "agent-a", "task-1", 7)
        assert await board.wait("t2", "shop", "agent-a", 0) == []
        assert await board.wait("t1", "other", "agent-a", 0) == []
        assert await board.wait("t1", "shop", "agent-a", 0) == [("task-1", 7)]

    asyncio.run(main())


def test_a_box_holds_at_most_its_bound() -> None:
    async def main() -> None:
        board = CancelSignals(SystemClock())
        await board.wait("t1", "shop", "agent-a", 0)
        for i in range(PENDING_MAX + 5):
            board.post("t1", "shop", "agent-a", f"task-{i}", 1)
        got = await board.wait("t1", "shop", "agent-a", 0)
        assert len(got) == PENDING_MAX
        assert got[-1] == (f"task-{PENDING_MAX + 4}", 1)  # the oldest were dropped

    asyncio.run(main())


class SignalingAPI(FakeAPI):
    """Heartbeats always answer CONTINUE; cancels come only through ``signals``."""

    def __init__(self) -> None:
        super().__init__()
        self.pushed: asyncio.Queue[list[tuple[str, int]]] = asyncio.Queue()
        self.calls = 0

    async def signals(self, *, agent_id: str, app: str, wait_ms: int) -> list[tuple[str, int]]:
        self.calls += 1
        return await self.pushed.get()


class Cancels(FakeExecutor):
    """Records which attempts were asked to stop."""

    def __init__(self) -> None:
        super().__init__()
        self.canceled: list[str] = []

    async def launch(self, job: Any, hooks: Any) -> Any:
        sandbox = await super().launch(job, hooks)
        sandbox.cancel = lambda: self.canceled.append(job.task_id)
        return sandbox


@contextlib.asynccontextmanager
async def agent_of(api: FakeAPI, executor: FakeExecutor) -> AsyncIterator[HostAgent]:
    agent = HostAgent(api, app, concurrency=4, heartbeat_s=3_600, executor=executor)
    running = asyncio.create_task(agent.run())
    await asyncio.wait_for(agent.started.wait(), 5)
    try:
        yield agent
    finally:
        for sandbox in executor.launched.values():
            sandbox.finish()
        agent.stop()
        await asyncio.wait_for(running, 5)


def test_a_pushed_cancel_stops_that_lease_only_without_a_heartbeat() -> None:
    async def main() -> None:
        api, executor = SignalingAPI(), Cancels()
        async with agent_of(api, executor) as agent:
            api.offers.put_nowait([offer("a", 1, 1), offer("b", 4, 1)])
            await until("both attempts to start", lambda: len(executor.launched) == 2)
            # A signal for an older lease of b, and one for a task not held here: ignored.
            api.pushed.put_nowait([("b", 3), ("elsewhere", 9)])
            api.pushed.put_nowait([("a", 1)])
            await until("a to be asked to stop", lambda: executor.canceled == ["a"])
            assert agent.running["a"].stop_reason == "CANCEL"
            assert agent.running["b"].stop_reason is None
            assert api.heartbeats == []  # nothing but the signal told it
            await until("the next signals call", lambda: api.calls >= 3)

    asyncio.run(main())


class OldNodeAPI(FakeAPI):
    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    async def signals(self, *, agent_id: str, app: str, wait_ms: int) -> list[tuple[str, int]]:
        self.calls += 1
        raise NotFound("no route POST /worker/signals")


def test_a_node_without_signals_leaves_the_agent_on_heartbeats() -> None:
    async def main() -> None:
        api, executor = OldNodeAPI(), FakeExecutor()
        async with agent_of(api, executor) as agent:
            api.offers.put_nowait([offer("a", 1, 1)])
            await until("the attempt to start", lambda: len(executor.launched) == 1)
            api.replies["a"] = "CANCEL"
            agent.heartbeat_now()
            await until(
                "the heartbeat's cancel", lambda: agent.running["a"].stop_reason is not None
            )
            assert api.calls == 1  # asked once, not retried in a loop

    asyncio.run(main())
