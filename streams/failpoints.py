"""Failpoints: crash the process at a named point of the code, for the chaos tests.

Off unless ``CONVEYOR_FAILPOINTS`` arms them, as ``name=probability`` pairs
(``lease-granted=0.05``): each pass through an armed point kills the process with SIGKILL, at
that probability. SIGKILL, not an exception: nothing is flushed, no ``finally`` runs, exactly
as a power cut or the OOM killer would leave it. A point costs one falsy test when none is
armed. The draws are this process's own and decide only *whether* to crash, never what any
state looks like, so they stay outside the deterministic core.

Points:
    lease-granted   the gateway holds leases that are durable in the log and not yet sent
                    to the agent that polled for them (tests/PLAN.md P5)
    message-shipped messages to other partitions are appended to their logs and not yet
                    deleted here: they are shipped again (``processor/messages.py``)
"""

from __future__ import annotations

import os
import random
import signal
import sys

ENV = "CONVEYOR_FAILPOINTS"
POINTS = frozenset({"lease-granted", "message-shipped"})


def parse(spec: str) -> dict[str, float]:
    """``name=p,name=p`` -> {name: p}; a clear error for an unknown point or a bad p."""
    armed: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in spec.split(","))):
        name, _, raw = part.partition("=")
        if name not in POINTS:
            raise ValueError(f"{ENV}: unknown failpoint {name!r}; known: {sorted(POINTS)}")
        try:
            p = float(raw)
        except ValueError:
            raise ValueError(f"{ENV}: {name}={raw!r} is not a probability") from None
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"{ENV}: {name}={p} is not a probability in 0..1")
        armed[name] = p
    return armed


_armed = parse(os.environ.get(ENV, ""))
_rng = random.Random()


def hit(name: str) -> None:
    """Crash here, if ``name`` is armed and the draw says so."""
    if _armed and _rng.random() < _armed.get(name, 0.0):
        print(f"failpoint {name}: SIGKILL", file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
