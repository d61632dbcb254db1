"""Real processes on 127.0.0.1 and a nemesis that kill -9s them.

``ChaosCluster`` reuses the bench's ``Cluster`` (spawn with output in files, stop by pid: TERM
then KILL) and adds what a fault run needs: restart a role on the same home and port, kill a
role with SIGKILL (an agent together with its guests, found as its children), and a health
wait that only watches the node (an agent may be down on purpose while the node starts).

``Nemesis`` kills a seeded random role at seeded random intervals and restarts it after a
seeded delay: the supervisor of tests/PLAN.md. Every kill and restart goes into the history.
It only ever signals pids it spawned (``Cluster.procs``) and their children. Its strikes:

    node, agent, guest   kill -9 of one process (an agent with its guests) (P1, P6)
    crash-loop           kill -9 of the node again and again while it recovers (P4)

and with ``failpoints`` the node also kills itself at the armed points (``streams/failpoints``,
P5); a watchdog restarts it, as it restarts anything that died without the nemesis.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import IO

import httpx
import psutil

from conveyor_devtools.bench.e2e import START_TIMEOUT_S, Cluster, _dev_key, _free_port
from conveyor_devtools.chaos.history import History

APP_REF = "conveyor_devtools.chaos.app:app"
# tests/PLAN.md: time compression, so a killed agent's leases lapse within the run.
# The chaos app's handlers append each execution to a history file on the host's disk, which a
# sandboxed guest cannot write (by design): its agents run the trusted harness code unsandboxed.
# The sandbox itself is tried by the escape tests.
TRUSTED = ("--sandbox", "none")
AGENT_TIMES = ["--lease-s", "2", "--heartbeat-s", "0.5", "--poll-wait-s", "2", "--drain-s", "1"]
STRIKES = ("node", "agent", "guest", "crash-loop")
WATCH_S = 0.2  # how often the supervisor looks for processes that died on their own


class ChaosCluster(Cluster):
    """A node (``--no-projection``: the embedded PostgreSQL is a daemon, not a child, so a
    kill -9 of the node would leave it running and a restart would wait on it) and agents.
    ``failpoints``: the node's ``CONVEYOR_FAILPOINTS`` (empty: none armed)."""

    failpoints: str = ""
    APP_NAME = "chaos"

    async def start(self) -> None:
        self.port = _free_port()
        self.mint_agent_key()
        self.spawn_node()
        await self.wait_healthy()
        self.key = _dev_key(self.node_home)
        for k in range(self.agents):
            self.spawn_agent(k)

    def spawn_node(self) -> None:
        home, port = str(self.node_home), str(self.port)
        args = ["node", "--home", home, "--port", port, "--partitions", str(self.partitions)]
        env = {"CONVEYOR_FAILPOINTS": self.failpoints}
        self._spawn("node", [*args, "--no-projection"], env=env)

    def spawn_agent(self, k: int) -> None:
        name = f"agent-{k}"
        self.root.mkdir(parents=True, exist_ok=True)
        args = ["agent", "--app", APP_REF, "--url", self.url, "--api-key", self.agent_key, *TRUSTED]
        slots = ["--concurrency", str(self.concurrency), "--prefetch", str(self.prefetch)]
        command = [sys.executable, "-m", "conveyor.cli", *args, *slots, *AGENT_TIMES]
        with open(self.root / f"{name}.out", "ab") as out:
            self.procs[name] = _popen(command, out)

    def respawn(self, name: str) -> None:
        if name == "node":
            self.spawn_node()
        else:
            self.spawn_agent(int(name.split("-")[1]))

    def alive(self, name: str) -> bool:
        return self.procs[name].poll() is None

    def agent_names(self) -> list[str]:
        return [n for n in self.procs if n.startswith("agent-")]

    def guests(self, name: str) -> list[psutil.Process]:
        with contextlib.suppress(psutil.Error):
            return psutil.Process(self.procs[name].pid).children(recursive=True)
        return []

    def kill9(self, name: str) -> int:
        """SIGKILL ``name`` and (for an agent) its guests, collected first so none is missed
        once the parent is gone. Returns how many processes got the signal."""
        victims = [self.procs[name].pid, *(g.pid for g in self.guests(name))]
        hit = 0
        for pid in victims:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                hit += 1
        self.procs[name].wait()
        return hit

    async def wait_healthy(self, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(base_url=self.url, timeout=2.0) as http:
            while time.monotonic() < deadline:
                if not self.alive("node"):
                    raise RuntimeError(f"the node exited\n{self.logs()}")
                with contextlib.suppress(httpx.HTTPError):
                    if (await http.get("/healthz")).status_code == 200:
                        return
                await asyncio.sleep(0.05)
        raise RuntimeError(f"the node was not healthy after {timeout_s}s\n{self.logs()}")


def _popen(
    argv: list[str], out: IO[bytes], env: dict[str, str] | None = None
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env
    )


@dataclass
class NemesisConfig:
    interval_s: tuple[float, float] = (1.5, 4.0)  # between kills
    restart_s: tuple[float, float] = (0.0, 1.0)  # down time before the supervisor restarts
    weights: tuple[float, float, float, float] = (0.4, 0.4, 0.2, 0.0)  # per STRIKES
    loop_kills: tuple[int, int] = (2, 4)  # kills of one crash loop
    failpoints: str = ""  # armed in the node during the fault window


class Nemesis:
    def __init__(
        self, cluster: ChaosCluster, history: History, rng: random.Random, config: NemesisConfig
    ) -> None:
        self.cluster = cluster
        self.history = history
        self.rng = rng
        self.config = config
        self.down: set[str] = set()  # down on purpose: not the watchdog's to restart

    async def run(self, until: float) -> None:
        """Kill and restart until the monotonic deadline ``until``; everything is up after."""
        watchdog = asyncio.create_task(self._watch())
        try:
            while True:
                await asyncio.sleep(self.rng.uniform(*self.config.interval_s))
                if time.monotonic() >= until:
                    return
                await self.strike()
        finally:
            watchdog.cancel()
            await asyncio.gather(watchdog, return_exceptions=True)

    async def _watch(self) -> None:
        while True:
            await asyncio.sleep(WATCH_S)
            self.restart_exited()

    async def strike(self) -> None:
        strike = self.rng.choices(STRIKES, weights=self.config.weights)[0]
        if strike == "node":
            await self._kill_and_restart("node", "node")
        elif strike == "agent":
            await self._kill_and_restart(self.rng.choice(self.cluster.agent_names()), "agent")
        elif strike == "guest":
            self._kill_guest()
        else:
            await self._crash_loop()

    async def strike_now(self, role: str) -> None:
        """A kill -9 of ``role`` ("node" or "agent") now, then its restart, as in ``strike``:
        for runs that need a fault at a known moment."""
        name = "node" if role == "node" else self.rng.choice(self.cluster.agent_names())
        await self._kill_and_restart(name, role)

    async def _kill_and_restart(self, name: str, role: str) -> None:
        self._kill(name, role)
        await asyncio.sleep(self.rng.uniform(*self.config.restart_s))
        self._start(name, role)
        if role == "node":  # the next fault lands on a running node, not on a booting one
            await self._healthy()

    def _kill(self, name: str, role: str, **detail: object) -> None:
        self.down.add(name)
        hit = self.cluster.kill9(name)
        self.history.nemesis("kill", {"role": role, "name": name, "processes": hit, **detail})

    def _start(self, name: str, role: str) -> None:
        self.cluster.respawn(name)
        self.down.discard(name)
        self.history.nemesis("start", {"role": role, "name": name})

    async def _crash_loop(self) -> None:
        """P4: the node is killed, and killed again while it recovers: at a random moment of
        its start (import, log open, replay) or the instant it answers its first health
        check. Then it is left to recover for good."""
        self._kill("node", "node", phase="running")
        for _ in range(self.rng.randint(*self.config.loop_kills)):
            self._start("node", "node")
            if self.rng.random() < 0.5:
                await asyncio.sleep(self.rng.uniform(0.05, 1.5))
                phase = "starting"
            else:
                await self._healthy()
                phase = "recovered"
            self._kill("node", "node", phase=phase)
        self._start("node", "node")
        await self._healthy()

    async def _healthy(self) -> None:
        """Wait for the node; with failpoints armed it may crash at one meanwhile, and is then
        restarted (and recorded) like any other death."""
        for _ in range(10):
            try:
                await self.cluster.wait_healthy()
                return
            except RuntimeError:
                if not self.cluster.failpoints:
                    raise
                self.restart_exited()
        await self.cluster.wait_healthy()

    def _kill_guest(self) -> None:
        """A guest alone: its agent sees the crash and fails the attempt, which retries."""
        name = self.rng.choice(self.cluster.agent_names())
        guests = self.cluster.guests(name)
        if not guests:
            return
        victim = self.rng.choice(guests)
        with contextlib.suppress(psutil.Error):
            victim.kill()
            self.history.nemesis("kill", {"role": "guest", "name": name, "pid": victim.pid})

    def restart_exited(self) -> None:
        """A process that died without the nemesis is a finding: record it, then restart it.
        A node that died by SIGKILL with failpoints armed crashed at one: a kill of the node."""
        for name in sorted(self.cluster.procs):
            if name in self.down or self.cluster.alive(name):
                continue
            code = self.cluster.procs[name].returncode
            if name == "node" and self.cluster.failpoints and code == -signal.SIGKILL:
                self.history.nemesis("kill", {"role": "node", "name": name, "failpoint": True})
            else:
                self.history.nemesis("exited", {"name": name, "returncode": code})
            self.cluster.respawn(name)

    async def heal(self) -> None:
        """Disarm the failpoints, restart whatever is down (a role may also have died on its
        own: that is recorded), wait for the node, and mark the heal instant in the history."""
        self.restart_exited()
        if self.cluster.failpoints:
            self.cluster.failpoints = ""
            self._kill_and_restart_now()
        await self._healthy()
        self.history.nemesis("heal", {})

    def _kill_and_restart_now(self) -> None:
        """The node again, without its failpoints: the drain must not crash it. Cleanup, not
        a fault: recorded as a restart, so it never counts towards a run's kills."""
        if self.cluster.alive("node"):
            self.down.add("node")
            self.cluster.kill9("node")
        self._start("node", "node")
        self.history.nemesis("restart", {"role": "node", "why": "disarm the failpoints"})
