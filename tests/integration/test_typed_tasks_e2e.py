"""Typed tasks end to end: a real node, a real agent running the handlers in guest processes,
and the SDK's client. A dataclass payload is encoded by the client, decoded in the guest by
the handler's annotation, and its dataclass result comes back decoded by ``result()``; a
payload that does not fit fails the task at once (FATAL, one attempt), never five retries."""

from __future__ import annotations

import asyncio
from pathlib import Path

import agent_app
from test_agent import APP_REF, DEADLINE_S, KEY, gateway, run  # noqa: F401 (gateway: fixture)

import conveyor
from conveyor.agents.host import HostAgent
from conveyor.agents.worker_api import HttpWorkerAPI


def test_typed_payloads_and_results_cross_a_real_node(gateway: str, tmp_path: Path) -> None:  # noqa: F811
    async def main() -> None:
        api = HttpWorkerAPI(gateway, KEY)
        agent = HostAgent(api, APP_REF, log_dir=tmp_path / "logs", heartbeat_s=0.3, poll_wait_s=1.0)
        running = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(agent.started.wait(), DEADLINE_S)
            async with conveyor.AsyncClient(gateway, KEY) as client:
                parcel = agent_app.Parcel("BOX", 700)
                weighed = await (await client.enqueue(agent_app.weigh, parcel)).result(DEADLINE_S)
                assert weighed == agent_app.Parcel("BOX", 1400, fragile=False)
                summed = await (await client.enqueue(agent_app.add, (2, 40))).result(DEADLINE_S)
                assert summed == 42
                # The agent registered the Avro schema derived from the annotation: a payload
                # that does not fit is refused at the enqueue, with its field, and never runs.
                try:
                    await client.enqueue(agent_app.weigh, {"sku": "BOX", "grams": "heavy"})
                except conveyor.ContractError as exc:
                    assert "payload.grams" in str(exc), exc
                else:
                    raise AssertionError("a payload that does not fit its schema was enqueued")
        finally:
            agent.stop()
            await asyncio.wait_for(running, DEADLINE_S)
            await api.close()

    run(main)


def test_an_async_handler_keeps_its_module_level_session_across_attempts(
    gateway: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    """Attempts in one warm guest run on one long-lived event loop, so an aiohttp session
    made by the first attempt still works in the next ones (a loop per attempt closes it)."""

    async def main() -> None:
        api = HttpWorkerAPI(gateway, KEY)
        logs = tmp_path / "logs"
        agent = HostAgent(api, APP_REF, log_dir=logs, concurrency=1, poll_wait_s=1.0)
        running = asyncio.create_task(agent.run())
        try:
            await asyncio.wait_for(agent.started.wait(), DEADLINE_S)
            async with conveyor.AsyncClient(gateway, KEY) as client:
                replies = []
                for _ in range(3):
                    handle = await client.enqueue(agent_app.fetch_health, f"{gateway}/healthz")
                    replies.append(await handle.result(DEADLINE_S))
            assert all(r["status"] == 200 for r in replies), replies
            assert len({(r["pid"], r["loop"]) for r in replies}) == 1, replies  # one guest, loop
        finally:
            agent.stop()
            await asyncio.wait_for(running, DEADLINE_S)
            await api.close()

    run(main)
