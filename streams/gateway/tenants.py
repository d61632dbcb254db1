"""Per-tenant settings, from the ``tenants`` object of ``$home/keys.json``::

    {"keys": {"<key>": {"tenant": "alpha"}},
     "tenants": {"alpha": {"show_payloads": false, "enqueue_rate": 500, "enqueue_burst": 5000,
                           "max_concurrent": 50}}}

Rule 1: a tenant without an entry (or an entry without a setting) gets the default; every
default keeps the behaviour of a node without the section.
Rule 2: an unknown setting or a wrong type is an error naming it, never ignored: a typo in
``show_payloads`` must not quietly show payloads the operator meant to hide.

``show_payloads`` (default true): false hides the task payload and checkpoint from the client
API (``GET /v1/tasks/{id}``, the task template of ``/v1/schedules``) and so from the dashboard,
because payloads often carry personal data. Those fields then hold ``HIDDEN`` instead of the
value. Agents still receive payloads (a handler needs its input), and results stay visible
(``handle.result()`` reads them).

``enqueue_rate`` (tasks per second, default none: unlimited) and ``enqueue_burst`` (tasks,
default one second of the rate): the tenant's admission token bucket (``admission.py``). Over
it an enqueue is a 429 ``rate_limited`` with Retry-After, and nothing is written; the clients
wait and resend. A batch counts one token per task.

``max_concurrent`` (default none: no cap): the most tasks the tenant may have running (LEASED)
at once; the node deals no slot to a tenant at its cap (``WaitingPool``), so its backlog waits
while other tenants' work goes on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from conveyor.frozen import frozen

HIDDEN_MARKER = "$hidden"
# The value a hidden payload is replaced with. Clients cannot send an object whose only key is
# "$hidden" (payloads.check_not_marker), so this shape always means "hidden by the server".
HIDDEN: dict[str, Any] = {HIDDEN_MARKER: "payloads are hidden for this tenant (show_payloads)"}


@frozen(kw_only=True)
class TenantSettings:
    show_payloads: bool = True
    enqueue_rate: float | None = None  # tasks/s; None: no limit
    enqueue_burst: int | None = None  # tasks; None: one second of the rate
    max_concurrent: int | None = None  # leases held at once; None: no cap


DEFAULT_SETTINGS = TenantSettings()
_SETTINGS = frozenset({"show_payloads", "enqueue_rate", "enqueue_burst", "max_concurrent"})


def parse_tenants(doc: Mapping[str, object]) -> dict[str, TenantSettings]:
    """tenant -> settings from a keys.json document; ValueError naming what is wrong."""
    tenants = doc.get("tenants", {})
    if not isinstance(tenants, dict):
        raise ValueError('"tenants" must be an object of tenant name -> settings')
    out: dict[str, TenantSettings] = {}
    for tenant, entry in tenants.items():
        if not isinstance(entry, dict):
            raise ValueError(f"tenants.{tenant} must be an object of settings")
        unknown = sorted(set(entry) - _SETTINGS)
        if unknown:
            known = ", ".join(sorted(_SETTINGS))
            raise ValueError(f"tenants.{tenant}.{unknown[0]}: unknown setting; known: {known}")
        show = entry.get("show_payloads", DEFAULT_SETTINGS.show_payloads)
        if not isinstance(show, bool):
            raise ValueError(f"tenants.{tenant}.show_payloads must be true or false")
        rate = _positive(entry, "enqueue_rate", tenant)
        burst = _positive(entry, "enqueue_burst", tenant)
        if burst is not None and (rate is None or burst != int(burst)):
            raise ValueError(
                f"tenants.{tenant}.enqueue_burst must be a whole number, with an enqueue_rate"
            )
        cap = _positive(entry, "max_concurrent", tenant)
        if cap is not None and cap != int(cap):
            raise ValueError(f"tenants.{tenant}.max_concurrent must be a whole number")
        out[tenant] = TenantSettings(
            show_payloads=show,
            enqueue_rate=rate,
            enqueue_burst=None if burst is None else int(burst),
            max_concurrent=None if cap is None else int(cap),
        )
    return out


def _positive(entry: Mapping[str, object], name: str, tenant: str) -> float | None:
    value = entry.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"tenants.{tenant}.{name} must be a number above 0, got {value!r}")
    return float(value)
