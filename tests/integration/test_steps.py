"""Durable steps through ``conveyor.testing.Engine``: the real node, agent and machine, handlers
in this process, a fake clock. One test per rule of ``conveyor/steps.py``."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import conveyor
from conveyor.schemas.steps import STEP_BYTES_MAX
from conveyor.testing import Engine

pytestmark = pytest.mark.timeout(120)

app = conveyor.App("steps-tests")
RETRY = conveyor.Retry(attempts=3, base="1s", cap="1s")
calls: list[str] = []
flags: dict[str, Any] = {}


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()
    flags.clear()


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine(app, durable=False) as e:
        yield e


def note(text: str) -> str:
    calls.append(text)
    return text


@app.task(retry=RETRY)
def checkout(ctx: conveyor.Context, order: str) -> str:
    step = ctx.step
    charge = step.run("charge", lambda: {"id": note(f"charged {step.idempotency_key}")})
    step.run("receipt", lambda: note("receipt") if flags.get("mail_ok") else boom("mail down"))
    return str(charge["id"])


def boom(why: str) -> str:
    note(f"failed: {why}")
    raise RuntimeError(why)


def test_the_checkout_example_charges_once_across_retries(engine: Engine) -> None:
    handle = engine.client.enqueue(checkout, "o1")
    engine.run_until_idle()
    flags["mail_ok"] = True
    engine.drain()
    info = handle.get()
    assert info.status == "SUCCEEDED" and info.attempt == 2
    charges = [c for c in calls if c.startswith("charged")]
    assert charges == [f"charged {handle.id}:charge#0"]  # the key: <run key>:<identity>
    assert info.result == charges[0]


@app.task(retry=RETRY)
def sleeper(ctx: conveyor.Context, _: Any) -> list[int]:
    ctx.step.run("before", lambda: note("before"))
    ctx.step.sleep("1h", name="cool_off")
    ctx.step.sleep("30m")
    ctx.step.run("after", lambda: note(f"after in attempt {ctx.attempt}"))
    return [ctx.attempt]


def test_sleep_ends_the_attempt_and_spends_no_retry(engine: Engine) -> None:
    handle = engine.client.enqueue(sleeper)
    engine.run_until_idle()
    info = handle.get()
    assert info.status == "SLEEPING" and calls == ["before"]
    assert info.run_at_ms == engine.now_ms() + 3_600_000
    engine.advance("59m")
    assert handle.get().status == "SLEEPING"
    engine.advance("1m")  # the deadline fixed by the first commit
    assert handle.get().status == "SLEEPING" and calls == ["before"]  # now sleep#0
    engine.advance("30m")
    info = handle.get()
    assert info.status == "SUCCEEDED" and calls == ["before", "after in attempt 3"]
    outcomes = [a.outcome for a in info.attempts]
    assert outcomes == ["SLEPT", "SLEPT", "SUCCEEDED"]  # three runs, no failure, no retry spent


@app.task(retry=conveyor.Retry(attempts=1))
def one_shot_sleeper(ctx: conveyor.Context, _: Any) -> str:
    ctx.step.sleep("10m")
    if ctx.attempt < 3:
        raise RuntimeError("after the first sleep, fail once")  # spends the only retry
    return "unreachable with attempts=1"


def test_sleeps_do_not_count_against_attempts(engine: Engine) -> None:
    handle = engine.client.enqueue(one_shot_sleeper)
    engine.drain()
    info = handle.get()
    # attempts=1: the failure after the sleep is the one allowed attempt, not the second.
    assert info.status == "FAILED" and [a.outcome for a in info.attempts] == ["SLEPT", "FAILED"]


@app.task(retry=RETRY)
def keyed(ctx: conveyor.Context, ids: list[str]) -> list[str]:
    order = list(reversed(ids)) if flags.get("ok") else ids  # the retry iterates differently
    out = [ctx.step.run("fetch", lambda i=i: note(f"fetch {i}"), key=i) for i in order]  # type: ignore[misc]
    out.append(ctx.step.run("fetch", lambda: note("unkeyed")))  # still fetch#0
    if not flags.get("ok"):
        raise RuntimeError("retry me")
    return out


def test_keyed_steps_match_by_key_in_any_order_and_keep_occurrences(engine: Engine) -> None:
    handle = engine.client.enqueue(keyed, ["a", "b"])
    engine.run_until_idle()
    flags["ok"] = True
    # The retry sees the ids in another order: keyed steps match wherever they sit.
    engine.drain()
    assert handle.get().status == "SUCCEEDED"
    assert handle.get().result == ["fetch b", "fetch a", "unkeyed"]
    assert calls == ["fetch a", "fetch b", "unkeyed"]  # every one a memo hit on the retry


@app.task(retry=RETRY)
def dup_key(ctx: conveyor.Context, _: Any) -> None:
    ctx.step.run("fetch", lambda: 1, key="x")
    ctx.step.run("fetch", lambda: 2, key="x")


@app.task(retry=RETRY)
def long_name(ctx: conveyor.Context, _: Any) -> None:
    ctx.step.run("n" * 129, lambda: 1)


@app.task(retry=RETRY)
def long_key(ctx: conveyor.Context, _: Any) -> None:
    ctx.step.run("n", lambda: 1, key="k" * 257)


@app.task(retry=RETRY)
def nul_name(ctx: conveyor.Context, _: Any) -> None:
    ctx.step.run("n\x00", lambda: 1)


@pytest.mark.parametrize(
    ("task", "message"),
    [
        (dup_key, "two steps of this attempt derive the identity 'fetch:x'"),
        (long_name, "a step name is 1..128 bytes"),
        (long_key, "a step key is a string of at most 256 bytes"),
        (nul_name, "a step name cannot contain U+0000"),
    ],
)
def test_identity_rules_fail_the_task_without_retries(
    engine: Engine, task: Any, message: str
) -> None:
    handle = engine.client.enqueue(task)
    engine.drain()
    info = handle.get()
    assert info.status == "FAILED" and info.attempt == 1
    assert info.error is not None and message in (info.error.message or "")


@app.task(retry=RETRY)
def evolving(ctx: conveyor.Context, _: Any) -> None:
    for name in flags.get("names", ["charge", "notify", "receipt"]):
        ctx.step.run(name, lambda name=name: note(name))  # type: ignore[misc]
    if flags.get("fail", True):
        raise RuntimeError("fail after the steps")


DIVERGENCE = """step sequence changed for task {task_id} at position 2
  recorded: charge#0, notify#0, receipt#0
  running:  charge#0, notify#0, audit#0
  step 2 was 'receipt#0', now 'audit#0'
A memoized result would answer a different question than the step asking for it.
Drain or dead-letter this task type's in-flight tasks before deploying a change to its
step sequence."""


def test_divergence_fails_the_task_at_once_with_the_report(engine: Engine) -> None:
    handle = engine.client.enqueue(evolving)
    engine.run_until_idle()
    flags["names"] = ["charge", "notify", "audit"]
    engine.drain()
    info = handle.get()
    assert info.status == "FAILED" and info.attempt == 2  # not retried to attempts=3
    assert info.error is not None and info.error.error_class == "StepDivergence"
    assert info.error.message == DIVERGENCE.format(task_id=handle.id)
    assert calls == ["charge", "notify", "receipt"]  # audit never ran


def test_steps_added_or_removed_at_the_end_are_not_divergence(
    engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    handle = engine.client.enqueue(evolving)
    engine.run_until_idle()
    flags.update(names=["charge", "notify"], fail=False)  # receipt removed from the end
    engine.drain()
    assert handle.get().status == "SUCCEEDED"
    assert "fewer steps than recorded" in caplog.text
    assert "recorded: charge#0, notify#0, receipt#0" in caplog.text
    calls.clear()
    flags.update(fail=True)
    other = engine.client.enqueue(evolving)
    engine.run_until_idle()  # records charge#0, notify#0 and fails
    flags.update(names=["charge", "notify", "audit"], fail=False)  # added at the end: it just runs
    engine.drain()
    assert other.get().status == "SUCCEEDED" and calls == ["charge", "notify", "audit"]
    assert other.get().attempt == 2


@app.task(retry=RETRY)
def big(ctx: conveyor.Context, _: Any) -> None:
    ctx.step.run("render", lambda: "x" * 1_468_004)  # 1468006 bytes as JSON


def test_a_step_over_the_bytes_cap_is_refused(engine: Engine) -> None:
    handle = engine.client.enqueue(big)
    engine.drain()
    info = handle.get()
    expected = f"step 'render#0' exceeds the step bytes limit: 1468006 > {STEP_BYTES_MAX}"
    assert info.status == "FAILED" and info.attempt == 1
    assert info.error is not None and info.error.message == expected


@app.task(retry=RETRY)
def swallow_sleep(ctx: conveyor.Context, _: Any) -> str:
    with contextlib.suppress(BaseException):  # the point: a catch-everything body
        ctx.step.sleep("1h")
    return "went on without a claim"


@app.task(retry=RETRY)
def swallow_divergence(ctx: conveyor.Context, _: Any) -> str:
    ctx.step.run("a" if not flags.get("changed") else "b", lambda: 1)
    if not flags.get("changed"):
        raise RuntimeError("retry")
    return "swallowed nothing yet"


@app.task(retry=RETRY)
def catch_all(ctx: conveyor.Context, _: Any) -> str:
    try:
        ctx.step.sleep("1h")
    except Exception:  # an ordinary catch-all does not see the signal
        return "caught"
    return "unreachable"


def test_a_swallowed_signal_fails_the_attempt_naming_it(engine: Engine) -> None:
    handle = engine.client.enqueue(swallow_sleep)
    engine.drain()
    info = handle.get()
    assert info.status == "FAILED" and info.attempt == 1
    assert info.error is not None and info.error.error_class == "SwallowedSignal"
    assert "swallowed Sleep" in (info.error.message or "")
    caught = engine.client.enqueue(catch_all)
    engine.run_until_idle()
    assert caught.get().status == "SLEEPING"  # except Exception did not catch the sleep


@app.task(retry=RETRY)
def outside(ctx: conveyor.Context, _: Any) -> str:
    return ctx.step.idempotency_key


@app.task(retry=RETRY)
def nested(ctx: conveyor.Context, _: Any) -> None:
    ctx.step.run("outer", lambda: ctx.step.run("inner", lambda: 1))


def test_idempotency_key_outside_a_step_and_nested_steps_fail(engine: Engine) -> None:
    a = engine.client.enqueue(outside)
    b = engine.client.enqueue(nested)
    engine.drain()
    err = a.get().error
    assert err is not None and "only inside a step body" in (err.message or "")
    info = b.get()
    assert info.status == "FAILED" and info.error is not None
    assert info.error.error_class == "StepsOverlapped" and info.attempt == 1


@app.task(retry=RETRY)
def via_current_task(ctx: conveyor.Context, _: Any) -> str:
    return str(conveyor.current_task.step.run("x", lambda: conveyor.current_task.task_id))


def test_current_task_reaches_the_running_context(engine: Engine) -> None:
    handle = engine.client.enqueue(via_current_task)
    engine.drain()
    assert handle.get().result == handle.id
    with pytest.raises(conveyor.ContractError):
        _ = conveyor.current_task.step


@app.task(retry=RETRY)
def claimed(ctx: conveyor.Context, _: Any) -> int:
    def body() -> int:
        attempt = ctx.step.attempt
        note(f"step attempt {attempt}")
        if attempt == 1:
            raise RuntimeError("died before the commit")
        return attempt

    return ctx.step.run("work", body)


def test_a_step_claimed_before_reports_its_attempt(engine: Engine) -> None:
    handle = engine.client.enqueue(claimed)
    engine.drain()
    assert handle.get().result == 2
    assert calls == ["step attempt 1", "step attempt 2"]


@app.task(retry=RETRY)
def dead_letter(ctx: conveyor.Context, _: Any) -> str:
    key = ctx.step.run("charge", lambda: ctx.step.idempotency_key)
    if not flags.get("ok"):
        raise conveyor.FatalError("to the dead letters")
    return key


def test_a_dead_letter_retry_keeps_the_run_key(engine: Engine) -> None:
    handle = engine.client.enqueue(dead_letter)
    engine.drain()
    assert handle.get().status == "FAILED"
    flags["ok"] = True
    (new_id,) = engine.client.retry_failed([handle.id]).values()
    engine.drain()
    assert engine.client.get(new_id).result == f"{handle.id}:charge#0"


# Declared with the app, not inside the test: the engine's agent polls for the types its app has.
RACE_STARTED, RACE_RELEASE = threading.Event(), threading.Event()


@app.task(retry=RETRY)
def racer(ctx: conveyor.Context, _: Any) -> None:
    def slow() -> int:
        RACE_STARTED.set()
        RACE_RELEASE.wait(10)
        return 1

    worker = threading.Thread(target=lambda: ctx.step.run("slow", slow))
    worker.start()
    RACE_STARTED.wait(10)
    try:
        ctx.step.run("fast", lambda: 2)
    finally:
        RACE_RELEASE.set()
        worker.join()


def test_threads_racing_two_steps_fail_the_attempt(engine: Engine) -> None:
    handle = engine.client.enqueue(racer)
    engine.drain()
    info = handle.get()
    assert info.status == "FAILED" and info.error is not None
    assert info.error.error_class == "StepsOverlapped"


@app.task(retry=RETRY)
def fenced(ctx: conveyor.Context, _: Any) -> int:
    def body() -> int:
        attempt = ctx.step.attempt
        note(f"run {attempt}")
        if attempt == 1:
            flags["entered"].set()
            flags["go"].wait(10)
        return attempt

    return ctx.step.run("work", body)


def test_a_commit_under_a_lost_lease_is_refused_and_the_attempt_dropped(engine: Engine) -> None:
    from conveyor.schemas.types import ExpireLeases, LeaseRef

    flags.update(entered=threading.Event(), go=threading.Event())
    handle = engine.client.enqueue(fenced)
    assert flags["entered"].wait(10)
    lease_id = engine.node.get(engine.tenant, handle.id).lease_id
    processor = engine.node.processors[engine.node.partition_of(handle.id)]

    async def expire() -> None:  # what the leader proposes when heartbeats stop
        offset = await processor.propose(
            ExpireLeases(items=[LeaseRef(task_id=handle.id, lease_id=lease_id)])
        )
        await processor.wait_applied(offset)

    engine.call(expire())
    flags["go"].set()  # the body returns: its commit carries the dead lease
    engine.drain()
    info = handle.get()
    assert info.status == "SUCCEEDED" and info.result == 2  # the step's own attempt count
    assert calls == ["run 1", "run 2"]
    assert [a.outcome for a in info.attempts] == ["FAILED", "SUCCEEDED"]
    assert info.attempts[0].error is not None
    assert info.attempts[0].error.error_class == "LeaseExpired"  # the zombie reported nothing


@app.task(retry=RETRY)
def migrating(ctx: conveyor.Context, _: Any) -> list[str]:
    """Its code changes while tasks are asleep in it: ``flags["v2"]`` is the deploy."""
    out = [ctx.step.run("quote", lambda: note("quote"))]
    ctx.step.sleep("1h")
    if flags.get("v2") and ctx.version("charge-with-tax"):
        out.append(ctx.step.run("charge_with_tax", lambda: note("charge with tax")))
    else:
        out.append(ctx.step.run("charge", lambda: note("charge")))
    out.append(ctx.step.run("receipt", lambda: note("receipt")))
    return out


def test_version_markers_let_new_code_branch_without_breaking_old_runs(engine: Engine) -> None:
    old = engine.client.enqueue(migrating)
    engine.run_until_idle()  # asleep before the branch point, under the old code
    flags["v2"] = True  # the deploy
    new = engine.client.enqueue(migrating)
    engine.run_until_idle()
    engine.advance("1h")
    engine.drain()
    # The old run had not reached the branch point: it records the marker and branches too.
    assert old.result() == new.result() == ["quote", "charge with tax", "receipt"]


@app.task(retry=RETRY)
def past_the_point(ctx: conveyor.Context, _: Any) -> list[Any]:
    """Attempt 1 (the old code) records ``charge`` at position 0 and fails; attempt 2 (the new
    code) asks for the marker at that position."""
    if ctx.attempt == 1:
        ctx.step.run("charge", lambda: note("charge"))
        raise RuntimeError("failed after the charge")
    took_new = ctx.version("charge-with-tax")
    charged = ctx.step.run("charge_with_tax" if took_new else "charge", lambda: note("again"))
    return [took_new, charged]


def test_a_run_already_past_the_branch_point_keeps_the_old_branch(engine: Engine) -> None:
    handle = engine.client.enqueue(past_the_point)
    engine.drain()
    # The marker takes no position in the old run, so its steps still line up: no
    # divergence, and the committed charge is not run again.
    assert handle.result() == [False, "charge"] and calls == ["charge"]
