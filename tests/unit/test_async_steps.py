"""Async step bodies (``conveyor.steps`` rule 7), through the runner a guest uses, with a
recording step channel in place of the platform: an ``async def`` body is awaited between its
claim and its commit, a memo hit is awaitable too, a lambda that returns a coroutine is refused
by name (and its coroutine closed, not left unawaited), and an async compensation runs."""

from __future__ import annotations

import asyncio
import gc
import warnings
from typing import Any

import conveyor
from conveyor.agents.runner import run_sync
from conveyor.context import Context
from conveyor.steps import StepAck

app = conveyor.App("async-steps")
calls: list[str] = []


async def fetch() -> dict[str, int]:
    await asyncio.sleep(0)
    calls.append("fetch")
    return {"n": 7}


async def unfetch(value: Any) -> None:
    await asyncio.sleep(0)
    calls.append(f"unfetch {value['n']}")


@app.task
async def fetch_twice(ctx: Context, _: Any) -> int:
    first = await ctx.step.run("fetch", fetch, compensate=unfetch)
    second = await ctx.step.run("fetch", fetch)
    return int(first["n"]) + int(second["n"])


@app.task
async def lambda_body(ctx: Context, _: Any) -> Any:
    return ctx.step.run("fetch", lambda: fetch())


@app.workflow
async def sleeps_after_fetch(ctx: Context, _: Any) -> None:
    await ctx.step.run("fetch", fetch, compensate=unfetch)
    ctx.step.sleep("1h", name="nap")


class Recorder:
    def __init__(self) -> None:
        self.writes: list[tuple[str, str, Any]] = []

    def heartbeat(self, progress: Any) -> None: ...

    def checkpoint(self, value: Any) -> None: ...

    def step(self, op: str, identity: str, position: int, value: Any) -> StepAck:
        self.writes.append((op, identity, value))
        return StepAck(ok=True)


def attempt(task: Any, steps: list[dict[str, Any]], *, compensating: bool = False) -> Any:
    calls.clear()
    channel = Recorder()
    ctx = Context(
        task_id="t" * 32,
        task_type=task.name,
        attempt=1,
        checkpoint=None,
        channel=channel,
        steps=steps,
        started_ms=1_000,
        compensating=compensating,
    )
    return run_sync(task, ctx, None), channel


def test_an_async_body_is_awaited_between_its_claim_and_its_commit() -> None:
    result, channel = attempt(fetch_twice, [])
    assert (result.outcome, result.result) == ("SUCCEEDED", 14)
    assert calls == ["fetch", "fetch"]
    assert [(op, identity) for op, identity, _ in channel.writes] == [
        ("COMMIT", "@compensate:fetch#0"),
        ("CLAIM", "fetch#0"),
        ("COMMIT", "fetch#0"),
        ("CLAIM", "fetch#1"),
        ("COMMIT", "fetch#1"),
    ]
    assert channel.writes[2][2] == {"n": 7}


def test_a_memo_hit_is_awaitable_and_runs_nothing() -> None:
    committed = [
        {"identity": "@compensate:fetch#0", "position": -1, "committed": True, "value": True},
        {"identity": "fetch#0", "position": 0, "committed": True, "value": {"n": 1}},
    ]
    result, channel = attempt(fetch_twice, committed)
    assert (result.outcome, result.result) == ("SUCCEEDED", 8)  # 1 recorded + 7 fresh
    assert calls == ["fetch"]  # the second occurrence only
    assert [identity for _, identity, _ in channel.writes] == ["fetch#1", "fetch#1"]


def test_a_lambda_returning_a_coroutine_is_refused_and_its_coroutine_closed() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "coroutine ... was never awaited" would fail here
        result, _ = attempt(lambda_body, [])
        gc.collect()
    assert result.outcome == "FATAL"
    assert result.error_class == "StepRefused"
    assert "pass the async function itself" in (result.error_message or "")
    assert calls == []


def test_an_async_compensation_runs_when_the_workflow_is_canceled() -> None:
    committed = [
        {"identity": "@compensate:fetch#0", "position": -1, "committed": True, "value": True},
        {"identity": "fetch#0", "position": 0, "committed": True, "value": {"n": 3}},
        {"identity": "nap#0", "position": 1, "committed": True, "wake_at_ms": 9 << 40},
    ]
    result, channel = attempt(sleeps_after_fetch, committed, compensating=True)
    assert result.outcome == "CANCELED", result
    assert calls == ["unfetch 3"]
    assert [(op, identity) for op, identity, _ in channel.writes][-1] == (
        "COMMIT",
        "@undo:fetch#0",
    )
