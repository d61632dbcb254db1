"""The Dramatiq actors of the comparison (imported by the workers and by the bench).

The broker is a RedisBroker on the URL in ``$PEERS_REDIS_URL``; ``stamp`` reports its start
to the bench on the UDP port in ``$PEERS_STAMP_PORT``. No retries: a no-op cannot fail, and
Conveyor's bench does not lean on retries either.
"""

from __future__ import annotations

import os

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from peerlib import send_stamp

broker = RedisBroker(url=os.environ["PEERS_REDIS_URL"])
dramatiq.set_broker(broker)
STAMP_PORT = int(os.environ.get("PEERS_STAMP_PORT", "0"))


@dramatiq.actor(max_retries=0)
def noop() -> None:
    return None


@dramatiq.actor(max_retries=0)
def stamp(key: str) -> None:
    send_stamp(STAMP_PORT, key)
