"""The per-tenant enqueue token bucket, on an injected clock."""

from __future__ import annotations

import pytest

from conveyor.errors import ContractError, RateLimited
from conveyor.streams.gateway.admission import Admission
from conveyor.streams.gateway.tenants import TenantSettings, parse_tenants


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_burst_passes_then_the_rate_refills_it() -> None:
    clock = Clock()
    gate = Admission(clock)
    limited = TenantSettings(enqueue_rate=10, enqueue_burst=20)
    gate.admit("a", limited, 20)  # the whole burst at once
    with pytest.raises(RateLimited) as err:
        gate.admit("a", limited, 5)
    assert err.value.retry_after_ms == 500  # five tokens at ten a second
    clock.now += 0.5
    gate.admit("a", limited, 5)
    clock.now += 3600  # a long idle refills to the burst, never beyond it
    gate.admit("a", limited, 20)
    with pytest.raises(RateLimited):
        gate.admit("a", limited, 1)


def test_a_refusal_takes_no_tokens_and_tenants_do_not_share_a_bucket() -> None:
    clock = Clock()
    gate = Admission(clock)
    limited = TenantSettings(enqueue_rate=1, enqueue_burst=3)
    gate.admit("a", limited, 2)
    with pytest.raises(RateLimited):
        gate.admit("a", limited, 3)
    gate.admit("a", limited, 1)  # the refused three took nothing
    gate.admit("b", limited, 3)  # b's bucket is its own
    gate.admit("c", TenantSettings(), 1_000_000)  # no rate: no limit


def test_a_batch_over_the_burst_is_a_clear_400() -> None:
    gate = Admission(Clock())
    with pytest.raises(ContractError, match="more than this tenant's enqueue burst of 5"):
        gate.admit("a", TenantSettings(enqueue_rate=5), 6)


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"enqueue_rate": 0}, "enqueue_rate must be a number above 0"),
        ({"enqueue_rate": "fast"}, "enqueue_rate must be a number above 0"),
        ({"enqueue_burst": 10}, "with an enqueue_rate"),
        ({"enqueue_rate": 1, "enqueue_burst": 2.5}, "must be a whole number"),
        ({"max_concurrent": 0}, "max_concurrent must be a number above 0"),
        ({"max_concurrent": 2.5}, "max_concurrent must be a whole number"),
    ],
)
def test_bad_settings_name_the_problem(entry: dict[str, object], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        parse_tenants({"tenants": {"t": entry}})
