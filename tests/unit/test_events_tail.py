"""The events log's reader (``streams/webhooks/stream.py``) on the memory log: resuming from
every cursor it handed out gives exactly the events after it, each once, even when the log
holds copies (a batch shipped twice; a replay that emitted the same facts in other batches);
and the webhook backoff and address rules."""

from __future__ import annotations

import asyncio
import random

import pytest

from conveyor.errors import ContractError
from conveyor.schemas.codec import EVENT_BATCH
from conveyor.schemas.types import EventBatch, EventKind, TaskEvent
from conveyor.streams.log.memory import MemoryLog
from conveyor.streams.webhooks.addresses import (
    AddressPolicy,
    AddressRefused,
    CheckedResolver,
    literal_refusal,
    parse_url,
)
from conveyor.streams.webhooks.deliver import backoff_ms
from conveyor.streams.webhooks.stream import Position, Tail, decode_cursor, encode_cursor


def event(version: int, task: str) -> TaskEvent:
    return TaskEvent(
        kind=EventKind.TaskEnqueued,
        task_id=task,
        tenant="t",
        app="a",
        task_type="x",
        queue="q",
        status="ENQUEUED",
        attempt=0,
        ts_ms=0,
        version=version,
    )


def batch(offset: int, events: list[TaskEvent]) -> bytes:
    return EVENT_BATCH.encode(EventBatch(partition=0, offset=offset, events=events))


# Record-log offsets 0..5; offsets 1 and 4 enqueue two tasks each.
FACTS = [event(0, "a"), event(1, "b"), event(1, "c"), event(2, "d"), event(3, "e")]
FACTS += [event(4, "f"), event(4, "g"), event(5, "h")]
LOG = [
    batch(1, FACTS[0:3]),  # records 0-1 in one commit
    batch(2, FACTS[3:4]),
    batch(2, FACTS[3:4]),  # the outbox shipped it again (crash before its delete)
    batch(3, FACTS[4:5]),
    batch(3, FACTS[1:5]),  # a replay after a kill -9: records 1-3 again, in one batch
    EVENT_BATCH.encode(EventBatch(partition=0, offset=4, events=[])),  # step events only
    batch(5, FACTS[5:8]),
]


async def read_all(log: MemoryLog, start: list[Position]) -> list[tuple[str, str, str]]:
    """(event id, task, cursor after it) of every event after ``start``."""
    found = []
    async with Tail(log, start) as tail:
        while (item := await tail.next(0.2)) is not None:
            found.append((item.id, item.event.task_id, tail.cursor()))
    return found


def test_every_cursor_resumes_with_exactly_the_rest() -> None:
    async def run() -> None:
        log = MemoryLog(1)
        await log.append(0, LOG)
        start = [Position(next=0, skip=0, seen=-1)]
        everything = await read_all(log, start)
        assert [task for _, task, _ in everything] == list("abcdefgh")
        ids = [event_id for event_id, _, _ in everything]
        assert ids[:3] == ["evt_0_0_0", "evt_0_1_0", "evt_0_1_1"]
        assert len(set(ids)) == len(ids)
        for k, (_, _, cursor) in enumerate(everything):
            rest = await read_all(log, decode_cursor(cursor, log))
            assert [task for _, task, _ in rest] == list("abcdefgh")[k + 1 :], k
            assert [i for i, _, _ in rest] == ids[k + 1 :]

    asyncio.run(run())


def test_a_copy_read_alone_gets_the_ids_of_the_original() -> None:
    async def run() -> None:
        log = MemoryLog(1)
        await log.append(0, [LOG[4]])  # only the replay's regrouped batch
        found = await read_all(log, [Position(next=0, skip=0, seen=-1)])
        assert [i for i, _, _ in found] == ["evt_0_1_0", "evt_0_1_1", "evt_0_2_0", "evt_0_3_0"]

    asyncio.run(run())


def test_a_cursor_is_checked_against_the_log() -> None:
    async def run() -> None:
        log = MemoryLog(2)
        await log.append(0, LOG[:2])
        good = encode_cursor([Position(next=2, skip=0, seen=1), Position(next=0, skip=0, seen=-1)])
        assert decode_cursor(good, log)[0] == Position(next=2, skip=0, seen=1)
        ahead = encode_cursor([Position(next=3, skip=0, seen=1), Position(next=0, skip=0, seen=-1)])
        one = encode_cursor([Position(next=0, skip=0, seen=-1)])
        for bad in ("", "c1.", "c1.e30", "x1.W10", ahead, one, "c1." + "A" * 20_000):
            with pytest.raises(ContractError) as err:
                decode_cursor(bad, log)
            assert err.value.field == "after"

    asyncio.run(run())


def test_backoff_is_full_jitter_under_a_doubling_ceiling() -> None:
    rng = random.Random(7)
    for failures in range(1, 30):
        ceiling = min(60_000, 500 * 2 ** (failures - 1))
        draws = [backoff_ms(failures, 500, 60_000, rng) for _ in range(200)]
        assert all(0 <= d <= ceiling for d in draws)
        assert max(draws) > ceiling * 0.8 and min(draws) < ceiling * 0.2  # spread, not fixed
    assert backoff_ms(3, 500, 60_000, random.Random(1)) == backoff_ms(
        3, 500, 60_000, random.Random(1)
    )


@pytest.mark.parametrize(
    ("address", "strict", "loopback_ok"),
    [
        ("127.0.0.1", "loopback", None),
        ("::1", "loopback", None),
        ("::ffff:127.0.0.1", "loopback", None),
        ("10.0.0.1", "private", "private"),
        ("172.16.5.4", "private", "private"),
        ("192.168.1.1", "private", "private"),
        ("169.254.169.254", "link-local", "link-local"),
        ("fe80::1", "link-local", "link-local"),
        ("fc00::1", "private", "private"),
        ("0.0.0.0", "private", "private"),
        ("100.64.0.1", "public", "public"),  # shared address space (CGNAT)
        ("93.184.215.14", None, None),
        ("2606:4700::1111", None, None),
    ],
)
def test_address_policy(address: str, strict: str | None, loopback_ok: str | None) -> None:
    for policy, expected in (
        (AddressPolicy(), strict),
        (AddressPolicy(allow_loopback=True), loopback_ok),
    ):
        why = policy.refusal(address)
        assert (why is None) == (expected is None), (policy, address, why)
        if expected is not None:
            assert why is not None and expected in why
    assert AddressPolicy(allow_private=True).refusal(address) is None


def test_parse_url_refuses_what_it_cannot_send_to() -> None:
    assert parse_url("https://example.com/hook?x=1") == (
        "https://example.com/hook?x=1",
        "example.com",
        443,
    )
    for bad in ("ftp://x/", "http://u:p@x/", "http:///nohost", "http://x:99999/", "http://x/#f", 7):
        with pytest.raises(ContractError):
            parse_url(bad)


def test_the_delivery_resolver_refuses_a_name_that_resolves_to_loopback() -> None:
    async def run() -> None:
        strict = CheckedResolver(AddressPolicy())
        with pytest.raises(AddressRefused, match="loopback"):
            await strict.resolve("localhost", 80)
        await strict.close()
        allowed = CheckedResolver(AddressPolicy(allow_loopback=True))
        assert {r["host"] for r in await allowed.resolve("localhost", 80)} <= {"127.0.0.1", "::1"}
        await allowed.close()
        assert literal_refusal("10.0.0.1", AddressPolicy()) is not None
        assert literal_refusal("example.com", AddressPolicy()) is None  # a name: the resolver's

    asyncio.run(run())
