"""Payload codecs through ``conveyor.testing.Engine``: the node stores only envelopes (payload,
result, checkpoint, step values, children's payloads and results, an event's payload) while
the handlers see plaintext and the client reads it back decoded."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest

import conveyor
from conveyor.codecs import Chain, Compression, Encryption, Keys, describe, encode_value
from conveyor.schemas.envelope import is_envelope
from conveyor.schemas.steps import COMPENSATE_PREFIX
from conveyor.streams.machine.handlers.workflows import child_id
from conveyor.testing import Engine
from conveyor.typed import PayloadInvalid

pytestmark = pytest.mark.timeout(120)

KEYS = Keys({"shop-1": os.urandom(32)}, current="shop-1")
CODEC = Chain(Compression(threshold_bytes=256), Encryption(KEYS))
app = conveyor.App("codec-tests", codec=CODEC)
plain_app = conveyor.App("codec-tests-plain")  # given a codec by Engine(..., codec=...)
seen: list[Any] = []


@pytest.fixture(autouse=True)
def _reset() -> None:
    seen.clear()


@pytest.fixture
def engine() -> Iterator[Engine]:
    with Engine(app, durable=False) as e:
        yield e


@app.task(retry=conveyor.Retry(attempts=2, base=1, cap=1))
def charge(ctx: conveyor.Context, order: dict[str, Any]) -> dict[str, Any]:
    seen.append(("payload", order, ctx.last_checkpoint))
    ctx.checkpoint({"stage": "secret-checkpoint"})
    card = ctx.step.run("card", lambda: {"card": "secret-card-4111"}, compensate=lambda _: None)
    seen.append(("step", card))
    if ctx.attempt == 1:
        raise RuntimeError("first attempt fails after its step and checkpoint")
    return {"receipt": "secret-receipt", "big": "x" * 1000, "card": card["card"]}


@app.task
def square(n: int) -> int:
    seen.append(("child", n))
    return n * n


@app.workflow
def fan(ctx: conveyor.Context, numbers: list[int]) -> dict[str, Any]:
    squares = ctx.parallel("squares", [(square, n) for n in numbers])
    decision = ctx.wait_for_event("approved")
    return {"squares": squares, "decision": decision}


@dataclasses.dataclass
class Invoice:
    number: int
    note: str


@app.task
def bill(invoice: Invoice) -> str:
    return f"billed {invoice.number}"


@app.task
async def relay(note: str) -> str:
    seen.append(("relay", note))
    return note.upper()


@app.task
def hoard(ctx: conveyor.Context) -> str:
    return str(ctx.step.run("blob", lambda: "y" * 250_000))


@plain_app.task
def echo(payload: Any) -> Any:
    seen.append(payload)
    return {"echo": payload}


def stored(engine: Engine, task_id: str) -> conveyor.TaskInfo:
    """The task as the gateway answers it: no codec between the test and the node's state."""
    reply = engine.call(engine.gateway.task(engine.tenant, task_id, 0))
    return conveyor.TaskInfo.from_json(msgspec.to_builtins(reply))


def stored_steps(engine: Engine, task_id: str) -> dict[str, Any]:
    async def go() -> dict[str, Any]:
        tables = engine.node.tables(engine.node.partition_of(task_id))
        rows = tables.steps(task_id)
        return {r.identity: None if r.value is None else json.loads(r.value) for r in rows}

    return engine.call(go())


def test_the_node_holds_envelopes_while_the_handler_sees_plaintext(engine: Engine) -> None:
    handle = engine.client.enqueue(charge, {"order": "secret-order", "cents": 1250})
    engine.run_until_idle()  # the first attempt failed; its step and checkpoint are kept
    steps = stored_steps(engine, handle.id)
    assert is_envelope(steps["card#0"])
    assert steps[f"{COMPENSATE_PREFIX}card#0"] is True  # the platform's marker stays plain
    assert "secret" not in json.dumps(steps)
    engine.drain()
    result = handle.result()
    assert result == {"receipt": "secret-receipt", "big": "x" * 1000, "card": "secret-card-4111"}
    # The second attempt got the first one's checkpoint and its committed step, decoded.
    order = {"order": "secret-order", "cents": 1250}
    assert seen == [
        ("payload", order, None),
        ("step", {"card": "secret-card-4111"}),
        ("payload", order, {"stage": "secret-checkpoint"}),
        ("step", {"card": "secret-card-4111"}),
    ]
    raw = stored(engine, handle.id)
    assert [is_envelope(v) for v in (raw.payload, raw.result, raw.checkpoint)] == [True] * 3
    assert raw.payload["metadata"] == {"key_id": "shop-1"}
    assert describe(raw.result) == "encoded (conveyor/v1, zlib+aes-gcm)"  # over the threshold
    assert describe(raw.payload) == "encoded (conveyor/v1, aes-gcm)"
    assert "secret" not in json.dumps([raw.payload, raw.result, raw.checkpoint])
    # The engine's client decodes what it reads.
    info = engine.client.get(handle.id)
    assert (info.payload, info.checkpoint) == (order, {"stage": "secret-checkpoint"})


def test_children_and_events_cross_encoded_too(engine: Engine) -> None:
    handle = engine.client.enqueue(fan, [2, 3])
    engine.run_until_idle()
    assert handle.get().status == "WAITING"
    # The parallel step's value holds each child's result as the child's attempt encoded it.
    results = stored_steps(engine, handle.id)["squares#0"]["results"]
    assert len(results) == 2 and all(is_envelope(r) for r in results)
    child = stored(engine, child_id(handle.id, "squares#0", 0, 2))
    assert is_envelope(child.payload) and is_envelope(child.result)
    assert engine.client.get(child.task_id).payload == 2
    # The event is kept encoded until the workflow's next attempt takes it.
    workflow = engine.client.get_workflow(handle.id)
    assert [s.identity for s in workflow.steps][:1] == ["squares#0"]
    engine.client.send_event(handle.id, "approved", {"by": "secret-approver"})
    engine.run_until_idle()
    assert handle.result() == {"squares": [4, 9], "decision": {"by": "secret-approver"}}
    assert sorted(seen) == [("child", 2), ("child", 3)]


def test_a_typed_payload_is_checked_by_the_sdk_before_it_is_encoded(engine: Engine) -> None:
    """The node cannot check an envelope against the schema it derived from the annotation,
    so the client refuses a payload that does not fit before anything is sent."""
    with pytest.raises(PayloadInvalid, match="number"):
        engine.client.enqueue(bill, {"number": "not a number", "note": "n"})
    handle = engine.client.enqueue(bill, Invoice(number=7, note="secret-note"))
    engine.run_until_idle()
    assert handle.result() == "billed 7"
    assert is_envelope(stored(engine, handle.id).payload)


def test_engine_takes_a_codec_for_an_app_without_one() -> None:
    with Engine(plain_app, durable=False, codec=CODEC) as engine:
        handle = engine.client.enqueue(echo, "secret-value")
        engine.run_until_idle()
        assert handle.result() == {"echo": "secret-value"}
        assert seen == ["secret-value"]
        raw = stored(engine, handle.id)
        assert is_envelope(raw.payload) and is_envelope(raw.result)


def test_a_payload_under_a_key_the_agent_lacks_fails_the_attempt_by_name() -> None:
    other = Chain(Encryption(Keys({"shop-9": os.urandom(32)}, current="shop-9")))
    with Engine(plain_app, durable=False, codec=CODEC) as engine:
        sealed = encode_value(other, "from another key")
        handle = engine.client.enqueue(echo, sealed)  # an envelope passes through as it is
        engine.drain()
        info = stored(engine, handle.id)  # the client would refuse it too: no such key
        assert info.status == "FAILED"
        assert info.error is not None and info.error.error_class == "CodecError"
        assert "'shop-9'" in (info.error.message or "") and seen == []


def test_a_scheduled_payload_and_an_async_handler_cross_encoded(engine: Engine) -> None:
    info = engine.client.schedule(relay, "secret-tick", cron="*/5 * * * *")
    assert info.next_fire_ms is not None
    engine.advance((info.next_fire_ms - engine.now_ms()) / 1000)
    assert seen == [("relay", "secret-tick")]
    (row,) = engine.client.schedules()
    assert row.last_task_id is not None
    assert engine.client.get(row.last_task_id).result == "SECRET-TICK"
    raw = stored(engine, row.last_task_id)
    assert is_envelope(raw.payload) and is_envelope(raw.result)


def test_a_step_value_over_the_cap_once_encoded_is_refused_by_the_sdk() -> None:
    """The cap is on what the node stores: 250,000 bytes fit as plaintext, not encrypted."""
    encrypt_only = Chain(Encryption(KEYS))
    with Engine(app, durable=False, codec=encrypt_only) as engine:
        handle = engine.client.enqueue(hoard)
        engine.run_until_idle()
        info = engine.client.get(handle.id)
        assert info.status == "FAILED" and info.error is not None
        assert info.error.error_class == "StepRefused"
        assert "exceeds the step bytes limit" in (info.error.message or "")
        assert "as the codec encoded it" in (info.error.message or "")
