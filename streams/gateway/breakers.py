"""The circuit breakers agents report open, as the node learns them from their polls.

An agent whose breaker for a task type is open leaves the type out of its polls and names it in
``open_breakers`` (``agents/breaker.py``). The node acts on the types a poll names, never on
this list: it is kept only to be shown, on ``/metrics`` (``conveyor_agent_breakers_open``, per
tenant, app and task type: how many agents hold the type back) and in the dashboard's queues
view (``GET /v1/queues``, ``breakers``).

Rule: an agent's report stands until its next poll replaces it, or until ``REPORT_GRACE_MS``
after the poll it came with could have ended; an agent that stopped polling (stopped, or every
type of it held back) drops out after that.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from conveyor.frozen import frozen

REPORT_GRACE_MS = 10_000


@frozen(kw_only=True)
class _Report:
    task_types: tuple[str, ...]
    until_ms: float


class OpenBreakers:
    def __init__(self) -> None:
        self._reports: dict[tuple[str, str, str], _Report] = {}  # (tenant, app, agent) ->

    def report(
        self,
        tenant: str,
        app: str,
        agent_id: str,
        task_types: list[str],
        *,
        now_ms: float,
        wait_ms: int,
    ) -> None:
        """A poll of ``agent_id`` said which of its types its breakers hold back."""
        key = (tenant, app, agent_id)
        if task_types:
            until = now_ms + wait_ms + REPORT_GRACE_MS
            self._reports[key] = _Report(task_types=tuple(sorted(task_types)), until_ms=until)
        else:
            self._reports.pop(key, None)

    def counts(self, now_ms: float) -> dict[tuple[str, str, str], int]:
        """(tenant, app, task type) -> the agents holding it back now."""
        for key in [k for k, r in self._reports.items() if r.until_ms < now_ms]:
            del self._reports[key]
        out: dict[tuple[str, str, str], int] = {}
        for (tenant, app, _), report in self._reports.items():
            for task_type in report.task_types:
                out[(tenant, app, task_type)] = out.get((tenant, app, task_type), 0) + 1
        return out

    def of_tenant(self, tenant: str, now_ms: float) -> list[dict[str, Any]]:
        """The tenant's open breakers, for the API: ``[{"app", "task_type", "agents"}]``."""
        return [
            {"app": app, "task_type": task_type, "agents": n}
            for (t, app, task_type), n in sorted(self.counts(now_ms).items())
            if t == tenant
        ]


class BreakersCollector(Collector):
    """``conveyor_agent_breakers_open``, read when Prometheus scrapes."""

    def __init__(self, breakers: OpenBreakers, now_ms: Callable[[], float]) -> None:
        self._breakers = breakers
        self._now_ms = now_ms

    def collect(self) -> Iterator[Metric]:
        gauge = GaugeMetricFamily(
            "conveyor_agent_breakers_open",
            "Agents whose circuit breaker holds the task type back (guest crashes)",
            labels=["tenant", "app", "task_type"],
        )
        for (tenant, app, task_type), n in sorted(self._breakers.counts(self._now_ms()).items()):
            gauge.add_metric([tenant, app, task_type], n)
        yield gauge
