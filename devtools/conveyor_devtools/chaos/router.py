"""A client of a cluster for the fault runs: each request goes to the partition's owner.

A node of a cluster serves only the partitions it leads (``streams/cluster/ownership.py``):
anything else it refuses, or, for a partition it is handing over, answers from a state that
may trail the new owner's. So the router follows every node's ``/healthz`` (every
``POLL_S``) and sends a request to the node that lists the request's partition at the highest
epoch (as ``conveyor cluster status`` names owners). While no node leads the partition (a
failover) it waits for one, up to the request timeout.

A read must be one the owner made: a ``NotFound``, or a live status of a task already seen
terminal, is checked against the owner's ``/healthz`` right after; if the node no longer leads
the partition at that epoch the answer came from a former owner and is not an observation
(``Moved``: the history records it ``info``). An answer that survives the check stands, and
the checker judges it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import httpx

from conveyor.aclient import AsyncClient, AsyncTaskHandle
from conveyor.errors import NotFound
from conveyor.streams.routing import partition_for_key, partition_of
from conveyor.wire import TaskInfo
from conveyor_devtools.chaos import checker

APP = "chaos"
TENANT = "default"
POLL_S = 0.1
HEALTHZ_TIMEOUT_S = 1.5  # the box may be loaded: a slow answer is not a dead node
REQUEST_TIMEOUT_S = 5.0  # as runner.py's: a slower reply is indeterminate


class Moved(Exception):
    """The answer came from a node that no longer leads the partition."""


class NoOwner(Exception):
    """No node led the partition within the request timeout; nothing was sent."""


async def healthz(http: httpx.AsyncClient, url: str) -> dict[str, Any] | None:
    """A node's ``/healthz``, or None if it does not answer (dead, stopped, starting)."""
    with contextlib.suppress(httpx.HTTPError):
        reply = await http.get(f"{url}/healthz", timeout=HEALTHZ_TIMEOUT_S)
        if reply.status_code == 200:
            body: dict[str, Any] = reply.json()
            return body
    return None


class Router:
    """``enqueue`` and ``get`` as ``runner.Client``, over the nodes ``names``."""

    def __init__(
        self, url: Callable[[str], str], names: Iterable[str], partitions: int, key: str
    ) -> None:
        self.partitions = partitions
        self.names = list(names)
        self._url = url
        self._key = key
        self.http = httpx.AsyncClient()
        self.owners: dict[int, tuple[str, int]] = {}  # partition -> (node, epoch)
        self.cards: dict[str, dict[str, Any] | None] = {}  # node -> its last /healthz
        self._clients: dict[str, AsyncClient] = {}
        self._terminal: set[str] = set()
        self._followers: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Router:
        self._followers = [asyncio.create_task(self._follow(n)) for n in self.names]
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        for follower in self._followers:
            follower.cancel()
        await asyncio.gather(*self._followers, return_exceptions=True)
        for client in self._clients.values():
            await client.close()
        await self.http.aclose()

    def client(self, node: str) -> AsyncClient:
        if node not in self._clients:
            self._clients[node] = AsyncClient(
                self._url(node), self._key, app=APP, retries=0, timeout=REQUEST_TIMEOUT_S
            )
        return self._clients[node]

    # -- following the nodes ------------------------------------------------------------------

    async def _follow(self, name: str) -> None:
        """One loop per node, so a node that does not answer delays no other's card."""
        while True:
            self.cards[name] = await healthz(self.http, self._url(name))
            self._owners()
            await asyncio.sleep(POLL_S)

    async def refresh(self) -> None:
        cards = await asyncio.gather(*(healthz(self.http, self._url(n)) for n in self.names))
        self.cards = dict(zip(self.names, cards, strict=True))
        self._owners()

    def _owners(self) -> None:
        owners: dict[int, tuple[str, int]] = {}
        for name, card in self.cards.items():
            for p, info in (card or {}).get("leading", {}).items():
                epoch = int(info["epoch"])
                if int(p) not in owners or epoch > owners[int(p)][1]:
                    owners[int(p)] = (name, epoch)
        self.owners = owners

    async def settled(self, names: Iterable[str]) -> bool:
        """Every node answers, and each partition is led by exactly one of them, caught up."""
        await self.refresh()
        cards = [self.cards.get(n) for n in names]
        if any(card is None for card in cards):
            return False
        led = [(int(p), info) for card in cards if card for p, info in card["leading"].items()]
        return sorted(p for p, _ in led) == list(range(self.partitions)) and all(
            info["caught_up"] for _, info in led
        )

    async def wait_settled(
        self, names: Iterable[str], timeout_s: float, logs: Callable[[], str]
    ) -> None:
        names = list(names)
        deadline = time.monotonic() + timeout_s
        while not await self.settled(names):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not settle in {timeout_s:.0f} s\n{logs()}")
            await asyncio.sleep(POLL_S)

    async def owner(self, partition: int) -> tuple[str, int]:
        deadline = time.monotonic() + REQUEST_TIMEOUT_S
        while partition not in self.owners:
            if time.monotonic() > deadline:
                raise NoOwner(f"no node led partition {partition} for {REQUEST_TIMEOUT_S} s")
            await asyncio.sleep(POLL_S / 2)
        return self.owners[partition]

    async def _still_leads(self, node: str, partition: int, epoch: int) -> bool:
        card = await healthz(self.http, self._url(node))
        info = (card or {}).get("leading", {}).get(str(partition))
        return info is not None and int(info["epoch"]) == epoch

    # -- runner.Client ------------------------------------------------------------------------

    def partition_for_key(self, key: str) -> int:
        return partition_for_key(TENANT, key, self.partitions)

    async def enqueue(
        self, task: str, payload: Any, *, idempotency_key: str
    ) -> AsyncTaskHandle[Any]:
        node, _ = await self.owner(self.partition_for_key(idempotency_key))
        return await self.client(node).enqueue(task, payload, idempotency_key=idempotency_key)

    async def get(self, task_id: str) -> TaskInfo:
        p = partition_of(task_id, self.partitions)
        node, epoch = await self.owner(p)
        try:
            info = await self.client(node).get(task_id)
        except NotFound:
            if not await self._still_leads(node, p, epoch):
                raise Moved(f"{node} no longer leads partition {p}") from None
            raise
        if info.status in checker.TERMINAL:
            self._terminal.add(task_id)
        elif task_id in self._terminal and not await self._still_leads(node, p, epoch):
            raise Moved(f"{node} no longer leads partition {p}")
        return info
