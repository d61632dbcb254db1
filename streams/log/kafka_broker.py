"""A real Apache Kafka on 127.0.0.1, for development and tests: fetch, format, start, kill, stop.

Standard library only, so that CI can fetch the jars with a bare ``python3`` before the venv
exists (``tools/kafka.py fetch``). The broker is the plain Maven Central artifacts run with
``java -cp 'libs/*'``; nothing of it is ever committed.

    ${XDG_CACHE_HOME:-~/.cache}/conveyor/kafka-4.1.1/
      libs/              the jars (``mvn dependency:copy-dependencies`` of a generated pom)
      libs/.complete     written last: a cache without it is fetched again
    root/                one cluster, chosen by the caller (a tmp dir in tests)
      node-0/
        server.properties
        data/            KRaft metadata and partition logs
        out-0.log        stdout+stderr of the node's first launch, out-1.log of its restart...

Rules, and why:

1. Every node is a combined broker+controller in one static KRaft quorum
   (``controller.quorum.voters``), so one process per node and no ZooKeeper.
2. Replication follows the size: 3 nodes give replication factor 3 and min.insync.replicas 2
   everywhere (data, offsets, transaction state); 1 node gives 1 everywhere -- a transaction
   state log asking for more replicas than there are brokers makes every transaction hang.
3. Ports are free ports of 127.0.0.1 picked at start and kept across ``restart(i)``, so a
   client's bootstrap list stays valid through a node's restart.
4. A node is ready when its log says ``Kafka Server started``: KRaft brokers print it only after
   the controller unfenced them, so a topic can be created at once.
5. Processes are stopped by PID: SIGTERM, then SIGKILL after ``stop_s``.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

KAFKA_VERSION = "4.1.1"
SLF4J_VERSION = "1.7.36"  # the slf4j-api that kafka 4.1.1 pulls; slf4j-simple must match it
ARTIFACTS = (
    ("org.apache.kafka", "kafka_2.13", KAFKA_VERSION),
    ("org.apache.kafka", "kafka-server", KAFKA_VERSION),
    ("org.apache.kafka", "kafka-tools", KAFKA_VERSION),
    ("org.slf4j", "slf4j-simple", SLF4J_VERSION),
)
READY_LINE = "Kafka Server started"
HEAP = ("-Xms128m", "-Xmx512m")
JVM_FLAGS = ("-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")
JAVA_MAJOR_MIN = 17
START_S_MAX = 90.0
STOP_S = 10.0  # a node whose quorum went first waits for it in vain


class KafkaUnavailable(RuntimeError):
    """Java, mvn or the jars are missing, or a broker did not come up; the message says why."""


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "conveyor" / f"kafka-{KAFKA_VERSION}"


def libs_dir() -> Path:
    return cache_dir() / "libs"


def is_fetched() -> bool:
    return (libs_dir() / ".complete").exists()


def java() -> str:
    """The java binary (``$JAVA_HOME/bin/java`` first), checked to be Java 17 or newer."""
    home = os.environ.get("JAVA_HOME")
    binary = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not binary or not Path(binary).exists():
        raise KafkaUnavailable(
            "java not found: install Java 17 (apt-get install -y openjdk-17-jre-headless)"
        )
    out = subprocess.run([binary, "-version"], capture_output=True, text=True, check=False)
    major = _java_major(out.stderr + out.stdout)
    if major < JAVA_MAJOR_MIN:
        raise KafkaUnavailable(f"{binary} is Java {major}; Kafka {KAFKA_VERSION} needs Java 17+")
    return binary


def _java_major(version_text: str) -> int:
    # 'openjdk version "17.0.15" 2025-04-15' or 'java version "1.8.0_392"'
    quoted = version_text.split('"')[1] if '"' in version_text else "0"
    parts = quoted.split(".")
    return int(parts[1]) if parts[0] == "1" and len(parts) > 1 else int(parts[0] or 0)


def _pom() -> str:
    deps = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in ARTIFACTS
    )
    return (
        '<project xmlns="http://maven.apache.org/POM/4.0.0">\n'
        "  <modelVersion>4.0.0</modelVersion>\n"
        "  <groupId>dev.conveyor</groupId><artifactId>kafka-broker</artifactId>"
        "<version>1</version>\n"
        f"  <dependencies>\n{deps}\n  </dependencies>\n</project>\n"
    )


def fetch() -> Path:
    """Fetch the broker's jars into the cache unless they are there; return the libs dir."""
    if is_fetched():
        return libs_dir()
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaUnavailable("mvn not found: install Maven (apt-get install -y maven)")
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir(), prefix="fetch-") as work:
        (Path(work) / "pom.xml").write_text(_pom())
        staged = Path(work) / "libs"
        cmd = [mvn, "-q", "-B", "dependency:copy-dependencies", "-DincludeScope=runtime"]
        cmd.append(f"-DoutputDirectory={staged}")
        done = subprocess.run(cmd, cwd=work, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise KafkaUnavailable(f"mvn could not fetch Kafka {KAFKA_VERSION}:\n{done.stdout}")
        (staged / ".complete").write_text(KAFKA_VERSION + "\n")
        shutil.rmtree(libs_dir(), ignore_errors=True)
        staged.rename(libs_dir())
    return libs_dir()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def random_cluster_id() -> str:
    """What ``StorageTool random-uuid`` prints (Kafka's Uuid: url-safe base64, no padding,
    never starting with '-'), without starting a JVM for it."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


@dataclass
class _Node:
    index: int
    home: Path
    port: int
    controller_port: int
    launches: int = 0
    proc: subprocess.Popen[bytes] | None = None

    @property
    def config(self) -> Path:
        return self.home / "server.properties"

    @property
    def output(self) -> Path:
        return self.home / f"out-{self.launches - 1}.log"


def _properties(node: _Node, nodes: list[_Node]) -> str:
    rf = 3 if len(nodes) >= 3 else 1
    min_isr = 2 if rf == 3 else 1
    voters = ",".join(f"{n.index + 1}@127.0.0.1:{n.controller_port}" for n in nodes)
    settings = {
        "process.roles": "broker,controller",
        "node.id": node.index + 1,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://127.0.0.1:{node.port},CONTROLLER://127.0.0.1:"
        f"{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://127.0.0.1:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": node.home / "data",
        "auto.create.topics.enable": "false",  # the Log creates its topics, with their settings
        "default.replication.factor": rf,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": 3,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": 3,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": min_isr,
        "group.initial.rebalance.delay.ms": 0,
        # A node may ask for a session timeout down to 3 s (conveyor node --session-timeout-s):
        # the broker's floor is 6 s unless lowered, and it bounds how soon a dead node's
        # partitions move.
        "group.min.session.timeout.ms": 3000,
        "num.partitions": 1,
        "log.flush.interval.messages": 9223372036854775807,  # durability is replication
    }
    return "".join(f"{key}={value}\n" for key, value in settings.items())


@dataclass
class KafkaCluster:
    """1 or 3 local Kafka nodes. ``KafkaCluster.start(n, root)``; ``.bootstrap`` for clients."""

    root: Path
    nodes: list[_Node] = field(default_factory=list)
    java_bin: str = "java"

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    @property
    def replication_factor(self) -> int:
        return 3 if len(self.nodes) >= 3 else 1

    @classmethod
    def start(cls, n: int, root: Path) -> KafkaCluster:
        if n not in (1, 3):
            raise ValueError(f"a local cluster has 1 or 3 nodes, not {n}")
        if not is_fetched():
            raise KafkaUnavailable(
                f"the Kafka {KAFKA_VERSION} jars are not in {libs_dir()}: "
                "run `python3 tools/kafka.py fetch` first"
            )
        cluster = cls(root=Path(root), java_bin=java())
        for i in range(n):
            home = cluster.root / f"node-{i}"
            cluster.nodes.append(_Node(i, home, free_port(), free_port()))
        cluster._format()
        try:
            for node in cluster.nodes:
                cluster._launch(node)
            for node in cluster.nodes:
                cluster._wait_started(node)
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _java(self, *args: str | Path) -> list[str]:
        return [self.java_bin, *HEAP, *JVM_FLAGS, "-cp", f"{libs_dir()}/*", *map(str, args)]

    def _format(self) -> None:
        cluster_id = random_cluster_id()
        for node in self.nodes:
            (node.home / "data").mkdir(parents=True, exist_ok=True)
            node.config.write_text(_properties(node, self.nodes))
        procs = [
            subprocess.Popen(
                self._java(
                    "kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", node.config
                ),
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
            for node in self.nodes
        ]
        for node, proc in zip(self.nodes, procs, strict=True):
            out, _ = proc.communicate(timeout=START_S_MAX)
            if proc.returncode != 0:
                raise KafkaUnavailable(f"formatting node {node.index} failed:\n{out.decode()}")

    def _launch(self, node: _Node) -> None:
        node.launches += 1
        with open(node.output, "wb") as out:
            node.proc = subprocess.Popen(
                self._java("kafka.Kafka", node.config),
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def _wait_started(self, node: _Node) -> None:
        deadline = time.monotonic() + START_S_MAX
        assert node.proc is not None
        while time.monotonic() < deadline:
            if READY_LINE in node.output.read_text(errors="replace"):
                return
            if node.proc.poll() is not None:
                raise KafkaUnavailable(
                    f"Kafka node {node.index} exited with {node.proc.returncode}; "
                    f"its output is in {node.output}"
                )
            time.sleep(0.1)
        raise KafkaUnavailable(
            f"Kafka node {node.index} did not start in {START_S_MAX:.0f} s; see {node.output}"
        )

    def kill(self, i: int) -> None:
        """SIGKILL node ``i`` (a crash: no controlled shutdown)."""
        proc = self.nodes[i].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()

    def restart(self, i: int) -> None:
        """Start node ``i`` again on its ports and data (after ``kill(i)`` or on its own)."""
        node = self.nodes[i]
        if node.proc is not None and node.proc.poll() is None:
            _terminate([node.proc], STOP_S)
        self._launch(node)
        self._wait_started(node)

    def stop(self, stop_s: float = STOP_S) -> None:
        procs = [n.proc for n in self.nodes if n.proc is not None]
        _terminate(procs, stop_s)

    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.nodes if n.proc is not None and n.proc.poll() is None]


def _terminate(procs: list[subprocess.Popen[bytes]], stop_s: float) -> None:
    """SIGTERM all at once (a quorum shuts down together), then SIGKILL those left."""
    live = [p for p in procs if p.poll() is None]
    for proc in live:
        proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + stop_s
    for proc in live:
        try:
            proc.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
