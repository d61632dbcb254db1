"""The host agent's loops and an error they do not expect: the agent must not go on half alive
(heartbeating leases while it no longer polls or completes). A reply that is not what the
protocol says fails the call like a transport error, which the loops retry; any other error
stops the agent as a whole and ``run`` raises it, for its supervisor to restart it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Sequence
from typing import Any

import pytest
from test_host_agent_leases import DEADLINE_S, FakeAPI, FakeExecutor, app, offer, until

from conveyor.agents.host import HostAgent
from conveyor.agents.worker_api import CompletionItem, HttpWorkerAPI, ItemResult, LeaseOffer
from conveyor.ahttp import Reply
from conveyor.errors import TransientError

pytestmark = pytest.mark.timeout(30)


class PollBug(FakeAPI):
    async def poll(self, **kwargs: Any) -> list[LeaseOffer]:
        raise KeyError("lease_id")  # what a bug in reading an offer raises


class CompleteBug(FakeAPI):
    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]:
        raise TypeError("a completion the agent cannot send")


def run_of(api: FakeAPI, executor: FakeExecutor) -> asyncio.Task[None]:
    agent = HostAgent(api, app, concurrency=2, heartbeat_s=0.01, executor=executor)
    return asyncio.create_task(agent.run())


async def ended(running: asyncio.Task[None], what: str) -> BaseException:
    """The error ``running`` (the agent's ``run``) ended with."""
    done, _ = await asyncio.wait([running], timeout=DEADLINE_S)
    if not done:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        raise AssertionError(f"the agent went on running without its {what} loop")
    error = running.exception()
    assert error is not None, f"the agent stopped without the error of its {what} loop"
    return error


def test_an_unexpected_error_in_the_poll_loop_stops_the_agent() -> None:
    async def main() -> None:
        api, executor = PollBug(), FakeExecutor()
        running = run_of(api, executor)
        error = await ended(running, "poll")
        assert isinstance(error, KeyError)

    asyncio.run(main())


def test_an_unexpected_error_in_the_complete_loop_stops_the_agent() -> None:
    async def main() -> None:
        api, executor = CompleteBug(), FakeExecutor()
        running = run_of(api, executor)
        # One attempt ends (its completion fails); the other holds a lease a half alive agent
        # would go on heartbeating.
        api.offers.put_nowait([offer("done", 1, 1), offer("running", 2, 1)])
        await until("both attempts to start", lambda: len(executor.launched) == 2)
        executor.launched[("done", 1)].finish()
        error = await ended(running, "complete")
        assert isinstance(error, TypeError)

    asyncio.run(main())


def _poll_answered(content: bytes) -> Any:
    """``HttpWorkerAPI.poll`` against a gateway that answers 200 with ``content``."""

    async def main() -> Any:
        api = HttpWorkerAPI("http://gateway.invalid", "key")

        async def request(*args: Any, **kwargs: Any) -> Reply:
            return Reply(200, content, {})

        api._http.request = request  # type: ignore[method-assign]
        try:
            return await api.poll(
                agent_id="a", app="x", queues=[], capacity=2, wait_ms=0, lease_ms=1
            )
        finally:
            await api.close()

    return asyncio.run(main())


@pytest.mark.parametrize("content", [b"<html>a proxy's page</html>", b'{"leases": 7}'])
def test_a_poll_reply_that_is_not_what_the_protocol_says_is_a_transient_error(
    content: bytes,
) -> None:
    """Retried by the poll loop like a failed call (the leases it granted lapse and are
    retried), not a bug that stops the agent."""
    with pytest.raises(TransientError, match="/worker/poll: unexpected reply"):
        _poll_answered(content)


def test_an_offer_the_agent_cannot_read_lapses_alone() -> None:
    good = {"task_id": "t2", "lease_id": 3, "attempt": 1, "task_type": "work"}
    offers = _poll_answered(json.dumps({"leases": [{"task_id": "t1"}, good]}).encode())
    assert [(o.task_id, o.lease_id) for o in offers] == [("t2", 3)]
