"""Webhook deliveries: the events log -> matching deliveries -> signed POSTs, retried.

    events log --Tail(cursor)--> match webhooks --> ONE transaction: deliveries + cursor
                                                          |
                        due deliveries <------------------+
                              |
           POST url (signed, timeout, no redirects) --> succeeded | pending (backoff) | failed

Rules, and why:

1. Driven from the events log, from the cursor committed in ``store.py`` with the deliveries it
   made (rule 1 there): a kill -9 loses no delivery; at worst one is sent again.
2. A webhook gets the events of its tenant, of the types it asked for (and task types, if it
   named some), that happened at or after its registration (``ts_ms >= created_ms``): a
   deliverer catching up does not send a new webhook what came before it.
3. Signed per Standard Webhooks with the ``standardwebhooks`` package: ``webhook-id`` is the
   event's id (``stream.py`` rule 5), the same on every retry and redelivery, so a receiver
   dedupes on it; ``webhook-timestamp`` is the attempt's time; ``webhook-signature`` signs
   ``id.timestamp.body``. The body is fixed when the delivery is made.
4. An attempt succeeds on a 2xx. Anything else (another status, a redirect: never followed, a
   timeout of ``attempt_timeout_ms``, a refused address) is retried after a full-jitter
   exponential backoff (``backoff_ms``: uniform in [0, min(cap, base * 2^(n-1))], the
   randomness and the clock injected) until ``retry_for_ms`` after the delivery was made; then
   it is kept as failed, listed, and can be redelivered.
5. At most ``concurrency`` attempts at once, over one HTTP client whose resolver checks every
   address (``addresses.py`` rule 2). Secrets and URLs are never logged.
6. With no webhook registered the events are not read: the cursor moves to the events log's
   end every ``CURSOR_COMMIT_MS`` instead (decoding every event to match nothing cost a busy
   node ~3% of its CPU). An end is taken only if no registration began while it was read, so
   every event before it happened before any registration's ``created_ms`` (rule 2 would not
   deliver it). Only where this process writes the whole events log (``Log.ends_known``: the
   local log): on Kafka other nodes append, the end this node knows lags, and its cursor
   there holds the cluster's trim of the events topic, so it keeps reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import secrets
import time
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import aiohttp
from standardwebhooks import Webhook as Signer

from conveyor.errors import ContractError, NotFound
from conveyor.frozen import frozen
from conveyor.streams.clock import Clock, SystemClock
from conveyor.streams.log.api import Log
from conveyor.streams.processor.waiting import Poke
from conveyor.streams.webhooks.addresses import (
    AddressPolicy,
    CheckedResolver,
    literal_refusal,
)
from conveyor.streams.webhooks.store import (
    FAILED,
    PENDING,
    SUCCEEDED,
    Delivery,
    NewDelivery,
    Outcome,
    Store,
    Webhook,
)
from conveyor.streams.webhooks.stream import (
    Event,
    Position,
    Tail,
    decode_cursor,
    encode_cursor,
    tail_positions,
)

log = logging.getLogger("conveyor.webhooks")

FEED_CHUNK_MAX = 2_000  # events matched per transaction
CURSOR_COMMIT_MS = 1_000  # a cursor that made no deliveries is committed at most this often
PRUNE_EVERY_MS = 60_000
ERROR_CHARS_MAX = 300
RESPONSE_BYTES_MAX = 4_096  # of a receiver's answer, read and dropped


@frozen(kw_only=True)
class Settings:
    policy: AddressPolicy = AddressPolicy()
    retry_for_ms: int = 24 * 3_600_000
    backoff_base_ms: int = 1_000
    backoff_max_ms: int = 600_000
    attempt_timeout_ms: int = 10_000
    concurrency: int = 32
    keep_succeeded_ms: int = 24 * 3_600_000


def backoff_ms(failures: int, base_ms: int, cap_ms: int, rng: random.Random) -> int:
    """Full jitter: uniform in [0, min(cap, base * 2^(failures-1))] (rule 4)."""
    ceiling = min(cap_ms, base_ms * 2 ** min(failures - 1, 40))
    return int(rng.uniform(0, ceiling))


def sign(secret: str, msg_id: str, timestamp_s: int, body: str) -> dict[str, str]:
    """The Standard Webhooks headers of one attempt (rule 3)."""
    when = datetime.fromtimestamp(timestamp_s, UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp_s),
        "webhook-signature": Signer(secret).sign(msg_id, when, body),
    }


def new_secret() -> str:
    import base64

    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


def payload(item: Event) -> str:
    """A delivery's body: ``{type, timestamp, data}`` as Standard Webhooks suggests."""
    when = datetime.fromtimestamp(item.event.ts_ms / 1000, UTC).isoformat().replace("+00:00", "Z")
    body = {"type": item.type, "timestamp": when, "data": item.body()}
    return json.dumps(body, separators=(",", ":"))


def _describe(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return text[:ERROR_CHARS_MAX]


class Webhooks:
    """The registrations (for the routes) and the two loops that deliver (``run``)."""

    def __init__(
        self,
        store: Store,
        events: Log,
        settings: Settings | None = None,
        *,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.store = store
        self.events = events
        self.settings = settings or Settings()
        self.clock = clock or SystemClock()
        self.rng = rng or random.Random()
        self.hooks: dict[str, Webhook] = {}
        self._creating = 0  # registrations under way (rule 6)
        self._registered = asyncio.Event()  # set by each registration (rule 6)
        self._poke = Poke(self.clock)
        self._busy: set[tuple[str, str]] = set()
        self._attempts: set[asyncio.Task[None]] = set()
        self._outcomes: list[Outcome] = []  # attempts ended, not yet written
        self._flush: asyncio.Future[None] | None = None
        self.sent = 0  # attempts made
        self.delivered = 0  # attempts that succeeded
        # Per events partition, the offset the deliverer reads next from its stored cursor:
        # what it still needs of the events log (a cluster trims below it,
        # ``cluster/events_trim.py``). Empty until it has read its cursor: it needs all.
        self.needed: dict[int, int] = {}

    async def load(self) -> None:
        self.hooks = {h.id: h for h in await self.store.webhooks()}

    # -- registrations -------------------------------------------------------------------------

    async def create(
        self, tenant: str, url: str, events: frozenset[str], task_types: frozenset[str] | None
    ) -> Webhook:
        self._creating += 1  # before its created_ms is taken (rule 6)
        try:
            hook = Webhook(
                id="wh_" + secrets.token_hex(8),
                tenant=tenant,
                url=url,
                events=events,
                task_types=task_types,
                secret=new_secret(),
                created_ms=self.clock.now_ms(),
            )
            await self.store.add_webhook(hook)
            self.hooks[hook.id] = hook
        finally:
            self._creating -= 1
            self._registered.set()
        return hook

    def _any(self) -> bool:
        """Whether a webhook is registered, or being registered (rule 6)."""
        return bool(self.hooks) or self._creating > 0

    def of_tenant(self, tenant: str) -> list[Webhook]:
        return [h for h in self.hooks.values() if h.tenant == tenant]

    def get(self, tenant: str, webhook_id: str) -> Webhook:
        hook = self.hooks.get(webhook_id)
        if hook is None or hook.tenant != tenant:
            raise NotFound(f"no webhook {webhook_id!r}", field="webhook_id")
        return hook

    async def delete(self, tenant: str, webhook_id: str) -> None:
        self.get(tenant, webhook_id)
        self.hooks.pop(webhook_id, None)
        await self.store.delete_webhook(tenant, webhook_id)

    async def deliveries(
        self, tenant: str, webhook_id: str, status: str | None, limit: int
    ) -> list[Delivery]:
        self.get(tenant, webhook_id)
        return await self.store.deliveries(webhook_id, status, limit)

    async def redeliver(self, tenant: str, webhook_id: str, delivery_id: str) -> None:
        self.get(tenant, webhook_id)
        now = self.clock.now_ms()
        if not await self.store.redeliver(
            webhook_id, delivery_id, now, now + self.settings.retry_for_ms
        ):
            raise NotFound(
                f"no delivery {delivery_id!r} of webhook {webhook_id}", field="delivery_id"
            )
        self._poke.poke()

    # -- the loops -------------------------------------------------------------------------------

    async def run(self) -> None:
        """Feed and send until cancelled."""
        timeout = aiohttp.ClientTimeout(total=self.settings.attempt_timeout_ms / 1000)
        connector = aiohttp.TCPConnector(
            resolver=CheckedResolver(self.settings.policy), limit=self.settings.concurrency
        )
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, trust_env=False
        ) as session:
            try:
                await asyncio.gather(self.feed(), self._send(session))
            finally:
                for task in self._attempts:
                    task.cancel()
                for task in list(self._attempts):
                    with contextlib.suppress(BaseException):
                        await task

    async def _start_positions(self) -> Any:
        cursor = await self.store.cursor()
        if cursor is not None:
            try:
                return decode_cursor(cursor, self.events)
            except ContractError as exc:
                log.warning(
                    "webhooks: the stored cursor no longer fits the events log (%s); "
                    "delivering from the newest events on",
                    exc,
                )
        positions = await tail_positions(self.events)
        now = self.clock.now_ms()
        await self.store.commit(encode_cursor(positions), [], now, now)
        return positions

    async def feed(self) -> None:
        """The events log -> deliveries, with the cursor (rule 1); until cancelled. While no
        webhook is registered, the events are skipped, not read (rule 6)."""
        positions = await self._start_positions()
        self.needed = {p: pos.next for p, pos in enumerate(positions)}
        while True:
            if self.events.ends_known and not self._any():
                positions = await self._skip(positions)
            positions = await self._follow(positions)

    async def _skip(self, positions: list[Position]) -> list[Position]:
        """Move the cursor to the events log's end every ``CURSOR_COMMIT_MS`` without reading
        the events, until a webhook is registered; the positions to read on from (rule 6)."""
        while True:
            self._registered.clear()
            ends = await tail_positions(self.events)
            if self._any():  # one began while the ends were read: they may be past its events
                return positions
            if ends != positions:
                now = self.clock.now_ms()
                await self.store.commit(encode_cursor(ends), [], now, now)
                positions = ends
                self.needed = {p: pos.next for p, pos in enumerate(ends)}
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._registered.wait(), CURSOR_COMMIT_MS / 1000)
            if self._any():
                return positions

    async def _follow(self, positions: list[Position]) -> list[Position]:
        """Read the events into deliveries while a webhook is registered; the positions
        committed when none is left."""
        last_commit = self.clock.monotonic_ms()
        dirty = False
        async with Tail(self.events, positions) as tail:
            while True:
                item = await tail.next(CURSOR_COMMIT_MS / 1000)
                new: list[NewDelivery] = []
                taken = 0
                while item is not None:
                    new.extend(self._matches(item))
                    taken += 1
                    if taken >= FEED_CHUNK_MAX:
                        break
                    item = await tail.next(0)
                dirty = dirty or taken > 0
                due = self.clock.monotonic_ms() - last_commit >= CURSOR_COMMIT_MS
                # every webhook was deleted: commit, then skip from here (rule 6)
                leaving = self.events.ends_known and not self._any()
                if new or (dirty and (due or leaving)):
                    now = self.clock.now_ms()
                    deadline = now + self.settings.retry_for_ms
                    committed = {p: pos.next for p, pos in enumerate(tail.positions)}
                    if await self.store.commit(tail.cursor(), new, now, deadline):
                        self._poke.poke()
                    self.needed = committed
                    last_commit, dirty = self.clock.monotonic_ms(), False
                if leaving and not self._any():
                    return list(tail.positions)

    def _matches(self, item: Event) -> list[NewDelivery]:
        e = item.event
        body: str | None = None
        found = []
        for hook in self.hooks.values():
            if hook.tenant != e.tenant or item.type not in hook.events:
                continue
            if hook.task_types is not None and e.task_type not in hook.task_types:
                continue
            if e.ts_ms < hook.created_ms:
                continue
            body = body or payload(item)
            found.append(
                NewDelivery(webhook_id=hook.id, event_id=item.id, event_type=item.type, body=body)
            )
        return found

    async def _send(self, session: aiohttp.ClientSession) -> None:
        last_prune = -float(PRUNE_EVERY_MS)
        while True:
            now = self.clock.now_ms()
            free = self.settings.concurrency - len(self._busy)
            if free > 0:
                for d in await self.store.due(now, free, self._busy):
                    self._busy.add((d.webhook_id, d.event_id))
                    task = asyncio.create_task(self._attempt(session, d))
                    self._attempts.add(task)
                    task.add_done_callback(self._attempts.discard)
            if self.clock.monotonic_ms() - last_prune >= PRUNE_EVERY_MS:
                last_prune = self.clock.monotonic_ms()
                await self.store.prune(now - self.settings.keep_succeeded_ms)
            # Due ones not taken now wait for a slot: an attempt's end pokes.
            next_ms = await self.store.next_due_ms(after_ms=now)
            wait = 1_000.0 if next_ms is None else float(min(max(next_ms - now, 1), 1_000))
            await self._poke.wait(wait)

    async def _attempt(self, session: aiohttp.ClientSession, d: Delivery) -> None:
        try:
            hook = self.hooks.get(d.webhook_id)
            now = self.clock.now_ms()
            if hook is None:  # deleted after its deliveries were read: never sent
                outcome = Outcome(
                    delivery=d,
                    status=FAILED,
                    now_ms=now,
                    next_ms=now,
                    http_status=None,
                    error="the webhook was deleted",
                )
                await self._record(outcome)
                return
            http_status, error = await self._post(session, hook, d)
            now = self.clock.now_ms()
            self.sent += 1
            if error is None:
                self.delivered += 1
                status, next_ms = SUCCEEDED, now
            else:
                failures = d.attempts + 1
                delay = backoff_ms(
                    failures, self.settings.backoff_base_ms, self.settings.backoff_max_ms, self.rng
                )
                status = PENDING if now + delay < d.deadline_ms else FAILED
                next_ms = now + delay
            await self._record(
                Outcome(
                    delivery=d,
                    status=status,
                    now_ms=now,
                    next_ms=next_ms,
                    http_status=http_status,
                    error=error,
                )
            )
        except Exception:
            log.exception("webhooks: an attempt of delivery %s failed to record", d.event_id)
        finally:
            self._busy.discard((d.webhook_id, d.event_id))
            self._poke.poke()

    async def _record(self, outcome: Outcome) -> None:
        """Write ``outcome`` with those of the attempts that ended meanwhile: one transaction
        (one fsync) for all of them, not one each."""
        self._outcomes.append(outcome)
        if self._flush is None or self._flush.done():
            self._flush = asyncio.ensure_future(self._flush_outcomes())
        await asyncio.shield(self._flush)  # it runs until the list is empty, ours included

    async def _flush_outcomes(self) -> None:
        while self._outcomes:
            taken, self._outcomes = self._outcomes, []
            await self.store.record(taken)

    async def _post(
        self, session: aiohttp.ClientSession, hook: Webhook, d: Delivery
    ) -> tuple[int | None, str | None]:
        """One attempt: ``(HTTP status, None)`` on a 2xx, else the status (if any) and why."""
        refusal = literal_refusal(urlsplit(hook.url).hostname or "", self.settings.policy)
        if refusal is not None:
            return None, f"refused: {refusal}"
        headers = sign(hook.secret, d.event_id, self.clock.now_ms() // 1000, d.body)
        headers["content-type"] = "application/json"
        headers["user-agent"] = "conveyor-webhooks"
        started = time.monotonic()
        try:
            async with session.post(
                hook.url, data=d.body.encode(), headers=headers, allow_redirects=False
            ) as response:
                await response.content.read(RESPONSE_BYTES_MAX)
                status = response.status
        except TimeoutError:
            elapsed = time.monotonic() - started
            return None, f"timed out after {elapsed:.1f} s"
        except (aiohttp.ClientError, OSError) as exc:
            return None, _describe(exc)
        if 200 <= status < 300:
            return status, None
        if 300 <= status < 400:
            return status, f"HTTP {status}: a redirect (redirects are not followed)"
        return status, f"HTTP {status}"

    def stats(self) -> dict[str, int]:
        return {"attempts": self.sent, "delivered": self.delivered}
