"""``GET /v1/events``: the events stream of the caller's tenant, as Server-Sent Events or JSON.

    GET /v1/events?after=<cursor>&state=FAILED,CANCELED&task_type=..&queue=..&type=..
      Accept: text/event-stream  -> id: <cursor> / event: task.failed / data: {...}  (forever)
      otherwise                  -> {"events": [...], "cursor": "..."}  (long poll, wait_ms)

Rule 1 (tenancy): only the events of the key's tenant, whatever the filters say.
Rule 2 (source): the node's events log, read from the cursor (``webhooks/stream.py``): durable
events only, each once, nothing before the cursor. No cursor: from the newest events on (a
JSON answer with no events still carries a cursor to go on from). ``after=start`` reads the
whole retained log. An SSE client resumes with ``Last-Event-ID`` (its EventSource does) or
``after``; ``after`` wins when both are sent.
Rule 3 (cursor): every event's SSE ``id`` is the cursor just after it; the JSON ``cursor`` is the
position after the last event read, including the ones the filters dropped, so the next call
starts where this one stopped. A bad cursor is a 400 (``invalid_request``, field ``after``).
Rule 4 (bounded): a stream reads the log through a queue of a few batches and writes each
event with backpressure (aiohttp waits for the socket to drain), so a client that does not
read stops the stream's readers instead of filling the node's memory; at most
``STREAMS_MAX`` streams are open at once (503 beyond). A comment line every
``KEEPALIVE_S`` keeps idle proxies from closing the connection.
"""

from __future__ import annotations

import json
import re
import time

from aiohttp import web
from multidict import MultiMapping

from conveyor.contract import replies as out
from conveyor.errors import ContractError, TransientError
from conveyor.frozen import frozen
from conveyor.schemas.types import TaskStatus
from conveyor.streams.gateway import routes
from conveyor.streams.gateway.validation import WAIT_MS_MAX
from conveyor.streams.webhooks.stream import (
    EVENT_TYPES,
    Event,
    Position,
    Tail,
    decode_cursor,
    tail_positions,
)

STREAMS_MAX = 256  # open SSE streams per node (rule 4)
KEEPALIVE_S = 15.0
LIMIT_DEFAULT = 100
LIMIT_MAX = 1_000
FILTER_VALUES_MAX = 64
WRITE_EVENTS_MAX = 256  # events per write of a stream
READ_S = 5.0  # the longest a long poll waits for records already in the log


class _Open:
    """The SSE streams open on this node (rule 4)."""

    def __init__(self) -> None:
        self.streams = 0


_OPEN = web.AppKey("event_streams", _Open)
_STATES = frozenset(TaskStatus)
_FILTERS = ("state", "task_type", "queue", "type")


@frozen(kw_only=True)
class EventFilter:
    """What a reader asks for; an empty set matches every value."""

    tenant: str
    states: frozenset[str] = frozenset()
    task_types: frozenset[str] = frozenset()
    queues: frozenset[str] = frozenset()
    types: frozenset[str] = frozenset()

    def matches(self, item: Event) -> bool:
        e = item.event
        return (
            e.tenant == self.tenant
            and (not self.states or e.status in self.states)
            and (not self.task_types or e.task_type in self.task_types)
            and (not self.queues or e.queue in self.queues)
            and (not self.types or item.type in self.types)
        )


def _values(query: MultiMapping[str], name: str) -> frozenset[str]:
    # Spaces around a comma-separated value are not part of it (the document allows them);
    # any other whitespace is, so a tab around a state is refused, as the document refuses it.
    values = [
        v.strip(" ") for raw in query.getall(name, []) for v in raw.split(",") if v.strip(" ")
    ]
    if len(values) > FILTER_VALUES_MAX:
        raise ContractError(
            f"{name}: {len(values)} values, over the limit of {FILTER_VALUES_MAX}", field=name
        )
    return frozenset(values)


def parse_filter(tenant: str, query: MultiMapping[str]) -> EventFilter:
    unknown = sorted(set(query) - {*_FILTERS, "after", "wait_ms", "limit"})
    if unknown:
        raise ContractError(
            f"{unknown[0]}: not a parameter of /v1/events (after, wait_ms, limit, "
            f"{', '.join(_FILTERS)})",
            field=unknown[0],
        )
    f = EventFilter(
        tenant=tenant,
        states=_values(query, "state"),
        task_types=_values(query, "task_type"),
        queues=_values(query, "queue"),
        types=_values(query, "type"),
    )
    for name, given, known in (("state", f.states, _STATES), ("type", f.types, EVENT_TYPES)):
        bad = sorted(given - known)
        if bad:
            raise ContractError(
                f"{name}: {bad[0]!r} is not one of {', '.join(sorted(known))}", field=name
            )
    return f


def _int(query: MultiMapping[str], name: str, lo: int, hi: int, default: int) -> int:
    given = query.getall(name, [])
    if len(given) > 1:
        raise ContractError(f"{name}: given {len(given)} times; give it once", field=name)
    text = given[0] if given else ""
    if text == "":
        return default
    if not re.fullmatch(r"[0-9]{1,9}", text) or not lo <= int(text) <= hi:
        raise ContractError(
            f"{name}: must be an integer from {lo} to {hi}, got {text!r}", field=name
        )
    return int(text)


async def _start(request: web.Request, after: str | None) -> list[Position]:
    log = request.app[routes.GATEWAY].node.events
    if after is None or after == "":
        return await tail_positions(log)
    if after == "start":
        return [Position(next=log.start_offset(p), skip=0, seen=-1) for p in range(log.partitions)]
    return decode_cursor(after, log)


async def events(request: web.Request) -> web.StreamResponse:
    _, tenant = routes.context(request)
    wanted = parse_filter(tenant, request.query)
    if "text/event-stream" in request.headers.get("Accept", ""):
        after = request.query.get("after") or request.headers.get("Last-Event-ID")
        return await _stream(request, wanted, await _start(request, after))
    wait_ms = _int(request.query, "wait_ms", 0, WAIT_MS_MAX, 0)
    limit = _int(request.query, "limit", 1, LIMIT_MAX, LIMIT_DEFAULT)
    start = await _start(request, request.query.get("after"))
    return routes.reply(await _long_poll(request, wanted, start, wait_ms, limit))


async def _long_poll(
    request: web.Request, wanted: EventFilter, start: list[Position], wait_ms: int, limit: int
) -> out.Events:
    """Up to ``limit`` events: those already in the log at once, else the first that come
    within ``wait_ms``."""
    log = request.app[routes.GATEWAY].node.events
    ends = [log.end_offset(p) for p in range(log.partitions)]  # what is there already
    deadline = time.monotonic() + wait_ms / 1000
    found: list[out.Event] = []
    async with Tail(log, start) as tail:
        while len(found) < limit:
            left = deadline - time.monotonic()
            behind = not tail.reached(ends)
            if not behind and (found or left <= 0):
                break  # all that was there is read: answer with it, or with none
            # The log has the records behind: they come at once, whatever the wait.
            item = await tail.next(max(left, READ_S) if behind else left)
            if item is None:
                if behind:
                    break
                continue
            if wanted.matches(item):
                found.append(out.Event(**item.body()))
        return out.Events(events=found, cursor=tail.cursor())


def _frame(cursor: str, item: Event) -> bytes:
    data = json.dumps(item.body(), separators=(",", ":"))
    return f"id: {cursor}\nevent: {item.type}\ndata: {data}\n\n".encode()


async def _stream(
    request: web.Request, wanted: EventFilter, start: list[Position]
) -> web.StreamResponse:
    open_ = request.app[_OPEN]
    if open_.streams >= STREAMS_MAX:
        raise TransientError(
            f"this node serves {STREAMS_MAX} event streams already; try again later or use the "
            "JSON long poll (no Accept: text/event-stream)",
            retry_after_ms=5_000,
        )
    response = web.StreamResponse(
        headers={
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            "X-Accel-Buffering": "no",
        }
    )
    open_.streams += 1
    try:
        await response.prepare(request)
        await response.write(b"retry: 1000\n\n")
        log = request.app[routes.GATEWAY].node.events
        async with Tail(log, start) as tail:
            while True:
                item = await tail.next(KEEPALIVE_S)
                if item is None:
                    await response.write(b": keepalive\n\n")
                    continue
                frames = []  # what is already read goes out in one write
                while item is not None:
                    if wanted.matches(item):
                        frames.append(_frame(tail.cursor(), item))
                        if len(frames) >= WRITE_EVENTS_MAX:
                            break
                    item = await tail.next(0)
                if frames:
                    await response.write(b"".join(frames))
    finally:
        open_.streams -= 1


def add_routes(app: web.Application) -> None:
    app[_OPEN] = _Open()
    app.router.add_get("/v1/events", events, allow_head=False)
