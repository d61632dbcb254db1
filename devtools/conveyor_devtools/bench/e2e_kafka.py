"""``conveyor bench e2e --kafka --nodes N``: the e2e bench (``e2e.py``) on a cluster on Kafka.

The same phases and figures as on the local log, on local brokers started for the run (one
for a single node, three in one quorum for two nodes or more: replication factor 3,
min.insync.replicas 2) and ``N`` ``conveyor node --kafka`` processes of one cluster, each with
its agent (``--agents`` per node). The run waits until every partition is led, caught up, by
one node. The latency phases talk to the first node; the throughput's batch enqueuers go
round the nodes, and a node keeps an unkeyed batch on partitions it leads, so each batch is
awaited at the node that took it. The completion count is read from the first node's query
snapshot (a node of a cluster projects every partition), the final statuses from the state of
the node that led each partition when the run ended.

Beside the roles of the local run, the brokers' CPU is counted (``broker_cpu_s``: every
broker, read from ``/proc/<pid>/stat`` like the others), and every figure of CPU per task is
given per role and per process.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from conveyor.streams.cluster.signing import SECRET_ENV
from conveyor.streams.gateway.auth import agent_grant, client_grant, create_key
from conveyor.streams.log.kafka_broker import KafkaCluster, KafkaUnavailable
from conveyor_devtools.bench.e2e import Cluster, _free_port

SETTLE_S = 120.0  # every partition led (the JVMs and the nodes start on a shared box)
CLUSTER = "bench"
BROKER_STARTS = 2


@dataclass
class KafkaNodes(Cluster):
    """``nodes`` nodes of one cluster on local brokers, ``agents`` agents per node."""

    nodes: int = 1
    brokers: KafkaCluster | None = None
    ports: list[int] = field(default_factory=list)
    leading: dict[int, int] = field(default_factory=dict)  # partition -> node index
    cluster_secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))

    def names(self) -> list[str]:
        return [f"node-{i}" for i in range(self.nodes)]

    def home_of(self, i: int) -> Path:
        return self.root / f"node-{i}"

    @property
    def node_home(self) -> Path:
        return self.home_of(0)

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{port}" for port in self.ports]

    def node_homes(self) -> list[Path]:
        return [self.home_of(i) for i in range(self.nodes)]

    def other_pids(self) -> dict[str, int]:
        pids = self.brokers.pids() if self.brokers is not None else []
        return {f"broker-{i}": pid for i, pid in enumerate(pids)}

    async def start(self) -> None:
        size = 1 if self.nodes == 1 else 3
        for attempt in range(BROKER_STARTS):  # a quorum may miss its deadline on a loaded box
            try:
                root = self.root / f"kafka-{attempt}"
                self.brokers = await asyncio.to_thread(KafkaCluster.start, size, root)
                break
            except KafkaUnavailable:
                if attempt == BROKER_STARTS - 1:
                    raise
        assert self.brokers is not None
        self._mint_keys()
        self.ports = [_free_port() for _ in range(self.nodes)]
        self.port = self.ports[0]
        for i, port in enumerate(self.ports):
            args = ["node", "--home", str(self.home_of(i)), "--port", str(port)]
            args += ["--partitions", str(self.partitions), "--kafka", self.brokers.bootstrap]
            args += ["--node-id", f"n{i}", "--cluster", CLUSTER]
            env = {"CONVEYOR_METRICS_KEY": self.metrics_key, SECRET_ENV: self.cluster_secret}
            self._spawn(f"node-{i}", args, env=env)
        self.leading = await self._settled()
        for i, url in enumerate(self.urls()):
            for k in range(self.agents):
                self.spawn_agent_at(f"agent-{i}-{k}", url)

    def _mint_keys(self) -> None:
        """A client key and the agents' key, the same in every node's home."""
        first = self.home_of(0)
        first.mkdir(parents=True, exist_ok=True)
        self.key = create_key(first, client_grant("default"))
        self.agent_key = create_key(first, agent_grant("default", self.APP_NAME))
        for i in range(1, self.nodes):
            self.home_of(i).mkdir(parents=True, exist_ok=True)
            (self.home_of(i) / "keys.json").write_bytes((first / "keys.json").read_bytes())
            (self.home_of(i) / "keys.json").chmod(0o600)

    async def _settled(self) -> dict[int, int]:
        """Partition -> index of the node leading it, once each is led by one, caught up."""
        deadline = time.monotonic() + SETTLE_S
        async with httpx.AsyncClient(timeout=2.0) as http:
            while time.monotonic() < deadline:
                self.check_alive()
                led = await _leading(http, self.urls())
                # Every node in the group too: a node whose /healthz answers before it joined
                # leaves the first to lead everything until the rebalance it causes mid-run
                # moves half of it (and this map with it).
                if (
                    led is not None
                    and sorted(led) == list(range(self.partitions))
                    and len(set(led.values())) == min(self.nodes, self.partitions)
                ):
                    return led
                await asyncio.sleep(0.2)
        raise RuntimeError(f"the cluster did not settle in {SETTLE_S:.0f} s\n{self.logs()}")

    def led_stores(self) -> list[Path]:
        return [self.home_of(i) / "state" / f"p{p:04d}" for p, i in sorted(self.leading.items())]

    def stop(self) -> None:
        try:
            super().stop()
        finally:
            if self.brokers is not None:
                self.brokers.stop()


async def _leading(http: httpx.AsyncClient, urls: list[str]) -> dict[int, int] | None:
    """Partition -> node index from every node's ``/healthz``; None unless each partition is
    listed once, caught up."""
    led: dict[int, int] = {}
    for i, url in enumerate(urls):
        with contextlib.suppress(httpx.HTTPError):
            reply = await http.get(f"{url}/healthz")
            if reply.status_code != 200:
                return None
            for p, info in reply.json().get("leading", {}).items():
                if int(p) in led or not info["caught_up"]:
                    return None
                led[int(p)] = i
            continue
        return None
    return led
