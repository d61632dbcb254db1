"""The processes of a fault run on Kafka (``failover.py``): three brokers in one quorum, the
nodes ``NODES`` of one cluster, each with its home and a port kept across restarts, and one
agent per node. Everything listens on 127.0.0.1 under the run's root; only pids spawned here
are ever signalled, and ``stop`` stops them all (SIGCONT first: a stopped process ignores
SIGTERM), the brokers last.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from conveyor.streams.cluster.signing import SECRET_ENV
from conveyor.streams.gateway.auth import agent_grant, client_grant, create_key
from conveyor.streams.log.kafka_broker import KafkaCluster, KafkaUnavailable
from conveyor_devtools.chaos.nemesis import AGENT_TIMES, APP_REF, TRUSTED, _popen

NODES = ("n1", "n2", "n3")
BROKER_STARTS = 2  # a quorum of three JVMs may miss its start deadline on a loaded machine


@dataclass
class Cluster:
    """The brokers, nodes and agents of one run; signals only pids it spawned."""

    root: Path
    partitions: int
    session_s: float
    concurrency: int
    prefetch: int
    name: str = "failover"
    # The nodes' shared secret (``cluster/signing.py``), passed in their environment.
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    brokers: KafkaCluster | None = None
    ports: dict[str, int] = field(default_factory=dict)
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    key: str = ""
    agent_key: str = ""

    def url(self, node: str) -> str:
        return f"http://127.0.0.1:{self.ports[node]}"

    def home(self, node: str) -> Path:
        return self.root / node

    def start_brokers(self) -> None:
        """Three brokers; tried again once on fresh data, as a quorum of three JVMs may miss
        its start deadline on a loaded machine."""
        for attempt in range(BROKER_STARTS):
            try:
                self.brokers = KafkaCluster.start(3, self.root / f"kafka-{attempt}")
                return
            except KafkaUnavailable:
                if attempt == BROKER_STARTS - 1:
                    raise

    @property
    def bootstrap(self) -> str:
        assert self.brokers is not None
        return self.brokers.bootstrap

    def mint_keys(self) -> None:
        """One client key and one agent key, the same in every node's home."""
        first = self.home(NODES[0])
        first.mkdir(parents=True, exist_ok=True)
        self.key = create_key(first, client_grant("default"))
        self.agent_key = create_key(first, agent_grant("default", "chaos"))
        keys = (first / "keys.json").read_bytes()
        for node in NODES[1:]:
            self.home(node).mkdir(parents=True, exist_ok=True)
            (self.home(node) / "keys.json").write_bytes(keys)
            (self.home(node) / "keys.json").chmod(0o600)

    def spawn_node(self, node: str) -> None:
        from conveyor_devtools.bench.e2e import _free_port

        port = self.ports.setdefault(node, _free_port())
        args = ["node", "--home", str(self.home(node)), "--port", str(port)]
        args += ["--partitions", str(self.partitions), "--no-projection", "--log-level", "info"]
        args += ["--kafka", self.bootstrap, "--node-id", node, "--cluster", self.name]
        args += ["--session-timeout-s", str(self.session_s)]
        self._spawn(node, [sys.executable, "-m", "conveyor.cli", *args])

    def spawn_agent(self, node: str) -> None:
        args = ["agent", "--app", APP_REF, "--url", self.url(node), "--api-key", self.agent_key]
        args += [*TRUSTED, "--concurrency", str(self.concurrency)]
        args += ["--prefetch", str(self.prefetch), *AGENT_TIMES]
        self._spawn(f"agent-{node}", [sys.executable, "-m", "conveyor.cli", *args])

    def _spawn(self, name: str, argv: list[str]) -> None:
        env = {**os.environ, SECRET_ENV: self.secret}
        with open(self.root / f"{name}.out", "ab") as out:
            self.procs[name] = _popen(argv, out, env)

    def output(self, name: str) -> Path:
        return self.root / f"{name}.out"

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def signal(self, name: str, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.procs[name].pid, sig)
        if sig == signal.SIGKILL:
            self.procs[name].wait()

    def logs(self) -> str:
        tails = []
        for name in self.procs:
            text = self.output(name).read_text(errors="replace")
            tails.append(f"--- {name}.out\n{text[-3000:]}")
        return "\n".join(tails)

    def stop_processes(self) -> None:
        """Agents, then nodes (SIGCONT first: a stopped process ignores SIGTERM), by pid."""
        from conveyor_devtools.bench.e2e import STOP_TIMEOUT_S

        order = sorted(self.procs, key=lambda n: not n.startswith("agent-"))
        for name in order:
            proc = self.procs[name]
            if proc.poll() is None:
                self.signal(name, signal.SIGCONT)
                self.signal(name, signal.SIGTERM)
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.signal(name, signal.SIGKILL)

    def stop(self) -> None:
        self.stop_processes()
        if self.brokers is not None:
            self.brokers.stop()
