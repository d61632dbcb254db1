"""Admission: a token bucket per tenant on enqueues (``enqueue_rate``, ``enqueue_burst`` in
the tenant's settings, ``tenants.py``).

Rule 1: an enqueue of n tasks takes n tokens or none; short of them, it is refused with the
wait until they will be there (429 ``rate_limited``, Retry-After), before anything is written.
Rule 2: a batch larger than the burst could never pass: it is a 400 naming the limit, not a
429 that would make the client wait forever.
Rule 3: a tenant without a rate has no bucket. The rate is enforced per gateway process: a
node is one gateway.

The dispatch side of fairness (a tenant's backlog costs that tenant latency, not others) is the
weighted round-robin of the processors; this only bounds how fast one tenant can write.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from conveyor.errors import ContractError, RateLimited
from conveyor.streams.gateway.tenants import TenantSettings


@dataclass(slots=True)
class _Bucket:
    rate: float
    burst: float
    tokens: float
    at: float  # monotonic seconds of the last refill


class Admission:
    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, tenant: str, settings: TenantSettings, n: int) -> None:
        """Take ``n`` tokens of ``tenant``'s bucket, or raise (rules 1 and 2)."""
        rate = settings.enqueue_rate
        if rate is None:
            self._buckets.pop(tenant, None)
            return
        burst = float(settings.enqueue_burst or max(1.0, rate))
        if n > burst:
            raise ContractError(
                f"a batch of {n} tasks is more than this tenant's enqueue burst of {burst:g}; "
                "send smaller batches",
                field="tasks",
            )
        now = self._clock()
        bucket = self._buckets.get(tenant)
        if bucket is None or (bucket.rate, bucket.burst) != (rate, burst):
            bucket = self._buckets[tenant] = _Bucket(rate, burst, burst, now)
        bucket.tokens = min(burst, bucket.tokens + (now - bucket.at) * rate)
        bucket.at = now
        if bucket.tokens >= n:
            bucket.tokens -= n
            return
        wait_ms = math.ceil((n - bucket.tokens) / rate * 1000)
        raise RateLimited(
            f"tenant {tenant!r} is over its enqueue rate of {rate:g} tasks/s (burst "
            f"{burst:g}); retry in {wait_ms} ms",
            retry_after_ms=wait_ms,
        )
