"""``HostAgent`` against a scripted worker API and an executor whose attempts end when the test
says: interleavings at the agent's awaits (heartbeat replies, polls, attempts ending) are
set up one step at a time, without guest processes or a node."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

import conveyor
from conveyor.agents.host import HostAgent
from conveyor.agents.sandbox import AttemptResult, Hooks, Job
from conveyor.agents.worker_api import (
    CheckpointItem,
    CompletionItem,
    ItemResult,
    LeaseOffer,
    StepItem,
)
from conveyor.errors import ContractError, TransientError

pytestmark = pytest.mark.timeout(30)

DEADLINE_S = 5.0
TOO_LARGE = "a checkpoint value the platform refuses"

app = conveyor.App("review-host")


@app.task
def work(ctx: conveyor.Context, payload: Any) -> None:
    return None


class FakeAPI:
    """Polls answer what the test puts in ``offers``; heartbeats answer ``replies`` (CONTINUE
    by default), after ``hold`` opens; every call is recorded."""

    def __init__(self) -> None:
        self.offers: asyncio.Queue[list[LeaseOffer]] = asyncio.Queue()
        self.heartbeats: list[list[tuple[str, int]]] = []
        self.replies: dict[str, str] = {}
        self.hold = asyncio.Event()
        self.hold.set()
        self.completed: list[CompletionItem] = []
        self.checkpoints: list[list[CheckpointItem]] = []
        self.checkpoint_error: Exception | None = None
        self.saved: list[CheckpointItem] = []  # checkpoints the platform took
        self.complete_open = asyncio.Event()  # completions answer once it is set
        self.complete_open.set()

    async def register(self, **_: Any) -> None:
        return None

    async def poll(self, **_: Any) -> list[LeaseOffer]:
        return await self.offers.get()

    async def heartbeat(self, leases: Sequence[tuple[str, int]]) -> dict[str, str]:
        self.heartbeats.append(list(leases))
        await self.hold.wait()
        return {t: self.replies.get(t, "CONTINUE") for t, _ in leases}

    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]:
        await self.complete_open.wait()
        self.completed.extend(items)
        return [ItemResult(task_id=i.task_id, ok=True) for i in items]

    async def checkpoint(self, items: Sequence[CheckpointItem]) -> list[ItemResult]:
        self.checkpoints.append(list(items))
        if self.checkpoint_error is not None:
            raise self.checkpoint_error
        if any(i.value == TOO_LARGE for i in items):  # one bad item refuses the request
            raise ContractError("checkpoints[0].value: too large")
        self.saved.extend(items)
        return [ItemResult(task_id=i.task_id, ok=True) for i in items]

    async def steps(self, items: Sequence[StepItem]) -> list[ItemResult]:
        return [ItemResult(task_id=i.task_id, ok=True) for i in items]

    async def close(self) -> None:
        return None


class FakeSandbox:
    pid: int | None = None

    def __init__(self, job: Job, hooks: Hooks) -> None:
        self.job = job
        self.hooks = hooks
        self.killed: str | None = None
        self._result: asyncio.Future[AttemptResult] = asyncio.get_running_loop().create_future()

    async def wait(self) -> AttemptResult:
        return await self._result

    def cancel(self) -> None:
        return None

    def kill(self, reason: str) -> None:
        self.killed = reason
        self.finish(AttemptResult(outcome="FAILED", error_class="Killed", error_message=reason))

    def finish(self, result: AttemptResult | None = None) -> None:
        if not self._result.done():
            self._result.set_result(result or AttemptResult(outcome="SUCCEEDED"))


class FakeExecutor:
    queued_max = 0

    def __init__(self) -> None:
        self.launched: dict[tuple[str, int], FakeSandbox] = {}  # by (task id, attempt)

    async def start(self) -> None:
        return None

    async def launch(self, job: Job, hooks: Hooks) -> FakeSandbox:
        sandbox = FakeSandbox(job, hooks)
        self.launched[(job.task_id, job.attempt)] = sandbox
        return sandbox

    async def close(self) -> None:
        return None


def offer(task_id: str, lease_id: int, attempt: int) -> LeaseOffer:
    return LeaseOffer(
        task_id=task_id,
        lease_id=lease_id,
        attempt=attempt,
        task_type="work",
        payload=None,
        checkpoint=None,
        lease_ms=30_000,
    )


async def until(what: str, check: Callable[[], bool]) -> None:
    deadline = asyncio.get_running_loop().time() + DEADLINE_S
    while not check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def agent_of(api: FakeAPI, executor: FakeExecutor) -> AsyncIterator[HostAgent]:
    """An agent that heartbeats only when the test calls ``heartbeat_now``."""
    agent = HostAgent(
        api,
        app,
        concurrency=4,
        heartbeat_s=3_600,
        executor=executor,
        complete_window_ms=0.0,
    )
    running = asyncio.create_task(agent.run())
    await asyncio.wait_for(agent.started.wait(), DEADLINE_S)
    try:
        yield agent
    finally:
        for sandbox in executor.launched.values():
            sandbox.finish()
        agent.stop()
        await asyncio.wait_for(running, DEADLINE_S)


def checkpoints_sent(api: FakeAPI, count: int) -> Callable[[], bool]:
    return lambda: len(api.checkpoints) == count


async def heartbeat_round(agent: HostAgent, api: FakeAPI) -> list[tuple[str, int]]:
    """The leases the next heartbeat round sends."""
    before = len(api.heartbeats)
    agent.heartbeat_now()
    await until("a heartbeat round", lambda: len(api.heartbeats) > before)
    return api.heartbeats[-1]


def test_an_old_attempt_ending_leaves_the_new_lease_of_its_task_heartbeated() -> None:
    """The node granted the task again (its first lease lapsed while this agent could not
    heartbeat) and the first attempt is still running here: the old attempt is dropped, and its
    end must leave the new lease held and heartbeated."""

    async def main() -> None:
        api, executor = FakeAPI(), FakeExecutor()
        async with agent_of(api, executor) as agent:
            api.offers.put_nowait([offer("t", 1, 1), offer("other", 5, 1)])
            await until("both attempts to start", lambda: len(executor.launched) == 2)
            api.offers.put_nowait([offer("t", 2, 2)])
            await until("the new lease to start", lambda: ("t", 2) in executor.launched)
            old = executor.launched[("t", 1)]
            old.finish()  # a no-op once the agent dropped it
            await until("the old attempt to end", lambda: len(agent._attempts) == 2)
            leases = await heartbeat_round(agent, api)
            assert ("t", 2) in leases, f"lease 2 of task t is no longer heartbeated: {leases}"
            # Lease 1 was gone at the node: its attempt is dropped as for a LOST reply (else it
            # holds a guest unwatched, neither heartbeated nor killed at shutdown).
            assert old.killed == "the lease was lost", "the stale attempt ran on"
            assert not any(i.lease_id == 1 for i in api.completed)
            executor.launched[("t", 2)].finish()
            await until(
                "lease 2 to be reported", lambda: any(i.lease_id == 2 for i in api.completed)
            )

    asyncio.run(main())


def test_a_lost_reply_for_an_ended_lease_does_not_drop_the_next_lease_of_the_task() -> None:
    """A heartbeat round names lease 1; while its reply is on the way, attempt 1 ends and the
    node grants the retry (lease 2) to this agent. The reply says LOST for lease 1 (it ended):
    that must not kill and drop lease 2's attempt."""

    async def main() -> None:
        api, executor = FakeAPI(), FakeExecutor()
        async with agent_of(api, executor) as agent:
            api.offers.put_nowait([offer("t", 1, 1)])
            await until("attempt 1 to start", lambda: ("t", 1) in executor.launched)
            api.hold.clear()
            api.replies["t"] = "LOST"  # what the node answers for lease 1 once it ended
            assert await heartbeat_round(agent, api) == [("t", 1)]
            executor.launched[("t", 1)].finish(AttemptResult(outcome="FAILED"))
            await until("attempt 1 to be reported", lambda: len(api.completed) == 1)
            api.offers.put_nowait([offer("t", 2, 2)])
            await until("attempt 2 to start", lambda: ("t", 2) in executor.launched)
            api.hold.set()  # the reply about lease 1 lands
            await asyncio.sleep(0.05)  # the agent acts on it
            second = executor.launched[("t", 2)]
            assert second.killed is None, f"attempt 2 was killed: {second.killed}"
            second.finish()
            await until(
                "attempt 2 to be reported", lambda: any(i.lease_id == 2 for i in api.completed)
            )

    asyncio.run(main())


def test_a_checkpoint_the_platform_refuses_does_not_stop_the_heartbeats() -> None:
    """One attempt keeps saving a checkpoint the platform refuses (say, too large): the
    heartbeats of every lease the agent holds must still go out, or they all lapse."""

    async def main() -> None:
        api, executor = FakeAPI(), FakeExecutor()
        api.checkpoint_error = ContractError("checkpoints[0].value: too large")
        async with agent_of(api, executor) as agent:
            api.offers.put_nowait([offer("big", 1, 1), offer("other", 2, 1)])
            await until("both attempts to start", lambda: len(executor.launched) == 2)
            hooks = executor.launched[("big", 1)].hooks
            for sent in range(1, 4):
                hooks.on_checkpoint({"blob": "x" * 100, "round": sent})
                agent.heartbeat_now()
                await until("the checkpoint to be sent", checkpoints_sent(api, sent))
                await asyncio.sleep(0.02)  # the rest of the round
            assert len(api.heartbeats) == 3, (
                f"{len(api.heartbeats)} heartbeat calls in 3 rounds: every lease of the agent "
                "goes unheartbeated while one attempt's checkpoint is refused"
            )

    asyncio.run(main())


def test_an_ended_attempt_s_lease_is_heartbeated_until_its_report_is_through() -> None:
    """The node is slow to take completions (a backlog, retries after errors): the attempt has
    ended, and its lease must not lapse meanwhile, or the platform runs the work again."""

    async def main() -> None:
        api, executor = FakeAPI(), FakeExecutor()
        api.complete_open.clear()
        async with agent_of(api, executor) as agent:
            api.offers.put_nowait([offer("t", 1, 1)])
            await until("the attempt to start", lambda: ("t", 1) in executor.launched)
            executor.launched[("t", 1)].finish()
            await until("the attempt to end", lambda: not agent.running)
            leases = await heartbeat_round(agent, api)
            assert ("t", 1) in leases, f"the unreported attempt's lease lapses: {leases}"
            api.offers.put_nowait([offer("u", 1, 1)])
            await until("another attempt to start", lambda: ("u", 1) in executor.launched)
            api.complete_open.set()
            await until("the report", lambda: [i.task_id for i in api.completed] == ["t"])
            assert await heartbeat_round(agent, api) == [("u", 1)], "reported: no more beats"

    asyncio.run(main())


def test_a_checkpoint_that_failed_to_go_out_goes_with_the_next_round() -> None:
    async def main() -> None:
        api, executor = FakeAPI(), FakeExecutor()
        async with agent_of(api, executor) as agent:
            api.offers.put_nowait([offer("t", 1, 1)])
            await until("the attempt to start", lambda: ("t", 1) in executor.launched)
            executor.launched[("t", 1)].hooks.on_checkpoint({"cursor": 7})
            api.checkpoint_error = TransientError("the node is restarting")
            await heartbeat_round(agent, api)
            api.checkpoint_error = None
            await heartbeat_round(agent, api)  # the handler saved nothing new meanwhile
            assert [i.value for i in api.saved] == [{"cursor": 7}], "the cursor was lost"

    asyncio.run(main())


def test_a_refused_checkpoint_does_not_take_the_others_of_its_round_with_it() -> None:
    async def main() -> None:
        api, executor = FakeAPI(), FakeExecutor()
        async with agent_of(api, executor) as agent:
            api.offers.put_nowait([offer("big", 1, 1), offer("small", 2, 1)])
            await until("both attempts to start", lambda: len(executor.launched) == 2)
            executor.launched[("big", 1)].hooks.on_checkpoint(TOO_LARGE)
            executor.launched[("small", 1)].hooks.on_checkpoint({"cursor": 3})
            await heartbeat_round(agent, api)
            assert [(i.task_id, i.value) for i in api.saved] == [("small", {"cursor": 3})]
            await heartbeat_round(agent, api)
            assert len(api.checkpoints) == 3, "the refused one is dropped, not sent every round"

    asyncio.run(main())
