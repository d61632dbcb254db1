"""One agent working for every node of a cluster: a poll to each node that leads partitions,
one ledger of the agent's slots.

Each partition is led by one node and deals its tasks to the polls that node holds, so an
agent that polled only the node it was pointed at would never run the tasks of the others.
``ClusterWorkerAPI`` is a ``WorkerAPI`` over all of them, behind which the host agent runs
unchanged (it polls with its free slots, reports what it ran).

Rule 1 (nodes): the nodes to poll are those ``GET /worker/nodes`` of any known node lists
(the cluster's directory: the nodes leading partitions now), asked again every
``NODES_REFRESH_S``. A node that fails ``FAILURES_MAX`` calls in a row is left out for a
while (doubling, up to ``SKIP_MAX_S``), and gone once the directory stops listing it (its
partitions led elsewhere, at higher epochs: their leases expire there as on one node). A
node of no cluster (or an older one) is polled alone.
Rule 1b (never every node left out): when every node is left out, the one due back first is
tried anyway. When a node dies, the one taking its partitions may fail a few calls while it
restores them; leaving both out would idle the agent up to ``SKIP_MAX_S`` with work waiting.
A dead node tried this way fails again and is left out longer, so the other is tried next.
Rule 2 (slots are never counted twice): a slot is the host's (``HostAgent``): taken when a
poll answers with a lease, freed when its attempt ends; the host asks with its free slots
(``capacity``). Here ``Asks`` keeps the slots asked of each node whose poll is still out,
and the offers answered and not yet handed to the host: a poll goes out only for
``capacity - asked - answered`` slots, split across the nodes not being polled (``split``),
so the slots asked of all nodes never exceed the slots free, and an agent never holds more
leases than it has slots whichever nodes answer. (An adaptive prefetch may shrink the free
slots under polls already out; no poll is taken back: none goes out until enough answered.)
Rule 3 (reports go where the lease came from): heartbeats, completions, checkpoints and
steps go to the node that granted the lease; if it cannot be reached, to another node,
which forwards them to the partition's owner (``streams/gateway/forward.py``). Every one of
them is safe to resend (``worker_api.py`` rule 2).
Rule 3b (cancels pushed): the signals call (``agents/signals.py``) is out to every node at
once, since a cancel comes from the node leading the task's partition.
Rule 4 (idle slots move): with more than one node a poll waits at most
``CLUSTER_POLL_WAIT_MS``, so slots asked of a node with nothing to deal come back soon and
are split again, over the nodes that have work too.

What it costs: offers answered after the host stopped polling are never started; their
leases lapse and are retried, as a crashed agent's are.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from conveyor.agents.worker_api import (
    CheckpointItem,
    CompletionItem,
    HttpWorkerAPI,
    ItemResult,
    LeaseOffer,
    StepItem,
    WorkerAPI,
)
from conveyor.errors import ContractError, ConveyorError, InvariantError, TransientError

log = logging.getLogger("conveyor.agent")

T = TypeVar("T")
R = TypeVar("R")
Item = TypeVar("Item", CompletionItem, CheckpointItem, StepItem)

NODES_REFRESH_S = 2.0
FAILURES_MAX = 3
SKIP_MAX_S = 30.0
CLUSTER_POLL_WAIT_MS = 2_000
MEMBER_RETRY_S = 3.0  # one node's retries of a call; then another node is tried (rule 3)
REPORT_RETRY_S = 60.0
IDLE_S = 1.0  # no node to poll: look again after this long


def split(free: int, nodes: Sequence[str], turn: int) -> dict[str, int]:
    """``free`` slots over ``nodes``: equal shares, the remainder one each from the
    ``turn``-th node on (so it goes round); a node whose share is 0 is left out. The shares
    add up to ``free`` (none when there is no node or no slot)."""
    if free <= 0 or not nodes:
        return {}
    share, extra = divmod(free, len(nodes))
    shares = {}
    for k in range(len(nodes)):
        node = nodes[(turn + k) % len(nodes)]
        n = share + (1 if k < extra else 0)
        if n > 0:
            shares[node] = n
    return shares


@dataclass(slots=True)
class Asks:
    """Rule 2's ledger: slots asked per node (polls out), offers answered not handed over."""

    asked: dict[str, int] = field(default_factory=dict)
    answered: list[tuple[str, LeaseOffer]] = field(default_factory=list)

    def free(self, capacity: int) -> int:
        return capacity - sum(self.asked.values()) - len(self.answered)

    def ask(self, node: str, slots: int, capacity: int) -> None:
        if node in self.asked or slots <= 0 or slots > self.free(capacity):
            raise InvariantError(f"asking {node} for {slots} of {self.free(capacity)} slots")
        self.asked[node] = slots

    def answer(self, node: str, offers: Sequence[LeaseOffer]) -> None:
        slots = self.asked.pop(node)
        if len(offers) > slots:  # a node MUST NOT answer more than it was asked (mailbox.py)
            log.error("node %s answered %d leases to a poll of %d", node, len(offers), slots)
        self.answered.extend((node, offer) for offer in offers)

    def hand_over(self) -> list[tuple[str, LeaseOffer]]:
        taken, self.answered = self.answered, []
        return taken

    def check(self, capacity: int) -> None:
        """Holds while the host's free slots do not shrink under polls already out (they may
        with an adaptive prefetch: then no new ask goes out until the answers are in)."""
        if any(n <= 0 for n in self.asked.values()) or self.free(capacity) < 0:
            raise InvariantError(f"asks {self.asked} + {len(self.answered)} over {capacity}")


@dataclass(slots=True)
class Member:
    url: str
    api: WorkerAPI
    registered: bool = False  # registration tried (``_ensure_registered``)
    failures: int = 0
    skip_until: float = 0.0
    poll: asyncio.Task[list[LeaseOffer]] | None = None
    signals: asyncio.Task[list[tuple[str, int]]] | None = None
    pushes: bool = True  # has the signals call (agents/signals.py)


Discover = Callable[[str], Awaitable[list[str] | None]]


class ClusterWorkerAPI:
    """``WorkerAPI`` over every node of the cluster ``seed`` belongs to (rules 1-4)."""

    def __init__(
        self,
        seed: str,
        api_key: str,
        *,
        connect: Callable[[str], WorkerAPI] | None = None,
        discover: Discover | None = None,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self.seed = seed.rstrip("/")
        self._connect = connect or (
            lambda url: HttpWorkerAPI(url, api_key, retry_for_s=MEMBER_RETRY_S)
        )
        self._discover = discover or self._nodes_of
        self._now = now
        self.members: dict[str, Member] = {self.seed: Member(self.seed, self._connect(self.seed))}
        self.asks = Asks()
        self.origin: dict[str, str] = {}  # task id -> url of the node that granted its lease
        self._register: dict[str, Any] | None = None
        self._refresh_at = 0.0
        self._turn = itertools.count()
        self._answered = asyncio.Event()

    # -- nodes (rule 1) -------------------------------------------------------------------------

    async def _nodes_of(self, url: str) -> list[str] | None:
        api = self.members[url].api
        listing = getattr(api, "nodes", None)
        return None if listing is None else list(await listing())

    async def refresh(self) -> None:
        """Follow the directory: add the nodes it lists (registered first), drop the others."""
        self._refresh_at = self._now() + NODES_REFRESH_S
        listed: list[str] | None = None
        for member in self._live() or list(self.members.values()):
            try:
                listed = await self._discover(member.url)
                break
            except ConveyorError as exc:
                log.info("asking %s for the cluster's nodes failed: %s", member.url, exc)
        if listed is None:
            return
        urls = {u.rstrip("/") or self.seed for u in listed} or {self.seed}
        for url in urls - set(self.members):
            self.members[url] = Member(url, self._connect(url))
            log.info("polling node %s too", url)
        for url in set(self.members) - urls:
            member = self.members[url]
            if member.poll is None:  # a poll still out ends first (its offers count)
                if member.signals is not None:
                    member.signals.cancel()
                del self.members[url]
                await member.api.close()
                log.info("node %s leads nothing now: not polled any more", url)
        for member in list(self.members.values()):
            await self._ensure_registered(member)

    def _any(self) -> Member:
        """A node to send to when the one wanted is gone (the seed while it is known)."""
        live = self._live()
        return self.members.get(self.seed) or (live or list(self.members.values()))[0]

    def _live(self) -> list[Member]:
        """The nodes not left out; when every node is, the one due back first (rule 1b)."""
        now = self._now()
        live = [m for m in self.members.values() if m.skip_until <= now]
        if live or not self.members:
            return live
        return [min(self.members.values(), key=lambda m: m.skip_until)]

    def _failed(self, member: Member, exc: BaseException) -> None:
        member.failures += 1
        if member.failures >= FAILURES_MAX:
            skip_s = min(SKIP_MAX_S, 2.0 ** (member.failures - FAILURES_MAX + 1))
            member.skip_until = self._now() + skip_s
            log.warning(
                "node %s failed %d calls (%s): left out for %.0f s",
                member.url,
                member.failures,
                exc,
                skip_s,
            )

    async def _ensure_registered(self, member: Member) -> None:
        """Register with a node found later, once: where the node keeps the registry in the
        log, one node answers for the cluster and the others may refuse for now (503)."""
        if member.registered or self._register is None:
            return
        member.registered = True  # tried: not again on every refresh
        try:
            await member.api.register(**self._register)
        except ConveyorError as exc:
            log.info("registering with %s: %s", member.url, exc)

    # -- the protocol ---------------------------------------------------------------------------

    async def register(
        self,
        *,
        agent_id: str,
        app: str,
        version: str,
        task_types: Sequence[str],
        pinned: Sequence[str] = (),
        deploy: int | None = None,
        definitions: Sequence[dict[str, Any]] = (),
    ) -> None:
        """With the seed first (its refusal, say of the key, stops the agent; if it cannot take
        it now, with another node), then once with every node as it is found (a node that
        keeps its registry to itself refuses enqueues of types no agent registered there)."""
        self._register = {
            "agent_id": agent_id,
            "app": app,
            "version": version,
            "task_types": list(task_types),
            "pinned": list(pinned),
            "deploy": deploy,
            "definitions": list(definitions),
        }
        seed = self.members[self.seed]
        try:
            await seed.api.register(**self._register)
        except TransientError:  # the seed cannot take it now: another node may
            await self.refresh()
            if not await self._register_elsewhere():
                raise
        seed.registered = True
        with contextlib.suppress(ConveyorError):
            await self.refresh()

    async def _register_elsewhere(self) -> bool:
        for member in self.members.values():
            if member.url == self.seed:
                continue
            try:
                await member.api.register(**(self._register or {}))
            except TransientError:
                continue
            member.registered = True
            return True
        return False

    async def poll(
        self,
        *,
        agent_id: str,
        app: str,
        queues: Sequence[str],
        capacity: int,
        wait_ms: int,
        lease_ms: int,
        version: str | None = None,
        task_types: Sequence[str] | None = None,
        open_breakers: Sequence[str] = (),
    ) -> list[LeaseOffer]:
        """Rule 2: polls for the free slots, to the nodes not being polled; the offers of the
        polls answered by then (at least one, unless ``wait_ms`` passes)."""
        if self._now() >= self._refresh_at:
            await self.refresh()
        idle = [m for m in self._live() if m.poll is None]
        if len(self.members) > 1:
            wait_ms = min(wait_ms, CLUSTER_POLL_WAIT_MS)
        shares = split(self.asks.free(capacity), [m.url for m in idle], next(self._turn))
        for url, slots in shares.items():
            self.asks.ask(url, slots, capacity)
            body = {
                "agent_id": agent_id,
                "app": app,
                "queues": queues,
                "capacity": slots,
                "wait_ms": wait_ms,
                "lease_ms": lease_ms,
                "version": version,
                "task_types": task_types,
                "open_breakers": open_breakers,
            }
            self._start_poll(self.members[url], body)
        if not self.asks.answered:
            await self._wait_answer(wait_ms / 1000 + MEMBER_RETRY_S + 30.0)
        offers = []
        for url, offer in self.asks.hand_over():
            self.origin[offer.task_id] = url
            offers.append(offer)
        return offers

    def _start_poll(self, member: Member, body: dict[str, Any]) -> None:
        task = asyncio.create_task(member.api.poll(**body), name=f"poll {member.url}")
        member.poll = task

        def done(t: asyncio.Task[list[LeaseOffer]]) -> None:
            member.poll = None
            offers: list[LeaseOffer] = []
            if not t.cancelled():
                exc = t.exception()
                if exc is None:
                    offers = t.result()
                    member.failures = 0
                else:
                    log.warning("poll of %s failed: %s", member.url, exc)
                    self._failed(member, exc)
            self.asks.answer(member.url, offers)
            self._answered.set()

        task.add_done_callback(done)

    async def _wait_answer(self, timeout_s: float) -> None:
        if not any(m.poll is not None for m in self.members.values()):
            await asyncio.sleep(IDLE_S)  # nothing out: every node left out, or none known
            return
        self._answered.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._answered.wait(), timeout_s)

    async def signals(self, *, agent_id: str, app: str, wait_ms: int) -> list[tuple[str, int]]:
        """The cancels pushed by any node (``agents/signals.py``): one signals call out to
        each node at a time, the signals of those answered first. A node without the call
        (a ``ContractError``) is not asked again; when no node has it, the error is raised."""
        for member in self._live():
            if member.signals is None and member.pushes and hasattr(member.api, "signals"):
                call = member.api.signals(agent_id=agent_id, app=app, wait_ms=wait_ms)
                member.signals = asyncio.create_task(call, name=f"signals {member.url}")
        out = [m.signals for m in self.members.values() if m.signals is not None]
        if not out:
            raise ContractError("no node of the cluster pushes cancels")
        await asyncio.wait(out, return_when=asyncio.FIRST_COMPLETED)
        got: list[tuple[str, int]] = []
        for member in self.members.values():
            task = member.signals
            if task is None or not task.done():
                continue
            member.signals = None
            exc = None if task.cancelled() else task.exception()
            if exc is None and not task.cancelled():
                got += task.result()
            elif isinstance(exc, ContractError):
                member.pushes = False
            elif exc is not None:
                log.info("signals of %s failed: %s", member.url, exc)
        return got

    async def heartbeat(self, leases: Sequence[tuple[str, int]]) -> dict[str, str]:
        async def send(api: WorkerAPI, part: list[tuple[str, int]]) -> dict[str, str]:
            return await api.heartbeat(part)

        replies = await self._by_origin(list(leases), lambda lease: lease[0], send)
        return {t: action for _, reply in replies for t, action in reply.items()}

    async def complete(self, items: Sequence[CompletionItem]) -> list[ItemResult]:
        results = await self._results(items, lambda api, part: api.complete(part))
        for item in items:
            self.origin.pop(item.task_id, None)
        return results

    async def checkpoint(self, items: Sequence[CheckpointItem]) -> list[ItemResult]:
        return await self._results(items, lambda api, part: api.checkpoint(part))

    async def steps(self, items: Sequence[StepItem]) -> list[ItemResult]:
        return await self._results(items, lambda api, part: api.steps(part))

    async def _results(
        self,
        items: Sequence[Item],
        call: Callable[[WorkerAPI, list[Item]], Awaitable[list[ItemResult]]],
    ) -> list[ItemResult]:
        """Each item's result, in the order of ``items`` (every part answers in its order)."""
        index = {id(item): i for i, item in enumerate(items)}
        ordered: list[ItemResult | None] = [None] * len(items)
        for part, results in await self._by_origin(list(items), lambda i: i.task_id, call):
            for item, result in zip(part, results, strict=True):
                ordered[index[id(item)]] = result
        return [r for r in ordered if r is not None]

    async def _by_origin(
        self,
        items: list[T],
        task_id: Callable[[T], str],
        send: Callable[[WorkerAPI, list[T]], Awaitable[R]],
    ) -> list[tuple[list[T], R]]:
        """Rule 3: one call per origin node, concurrently; each part with its reply."""
        groups: dict[str, list[T]] = defaultdict(list)
        for item in items:
            url = self.origin.get(task_id(item), self.seed)
            groups[url if url in self.members else self._any().url].append(item)

        async def one(url: str, part: list[T]) -> tuple[list[T], R]:
            return part, await self._send_somewhere(url, lambda api: send(api, part))

        return list(await asyncio.gather(*(one(url, part) for url, part in groups.items())))

    async def _send_somewhere(self, url: str, call: Callable[[WorkerAPI], Awaitable[R]]) -> R:
        """To ``url``'s node; when it fails, to each other node in turn (they forward it),
        round after round until ``REPORT_RETRY_S`` passed."""
        give_up = self._now() + REPORT_RETRY_S
        while True:
            first = self.members.get(url) or self._any()
            others = [m for m in self._live() if m is not first]
            for member in (first, *others):
                try:
                    got = await call(member.api)
                except TransientError as exc:
                    self._failed(member, exc)
                    if self._now() > give_up:
                        raise
                    log.info("a report to %s failed (%s); trying another node", member.url, exc)
                    continue
                member.failures = 0
                return got
            await asyncio.sleep(IDLE_S)

    async def close(self) -> None:
        calls = [t for m in self.members.values() for t in (m.poll, m.signals) if t is not None]
        for task in calls:
            task.cancel()
        for task in calls:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for member in list(self.members.values()):
            await member.api.close()
