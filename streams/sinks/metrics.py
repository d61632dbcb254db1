"""Prometheus metrics: what the node, the gateway and the events stream tell an operator.

Rule: nothing here runs per task on a hot path. Node-side figures (processor lag, timer lag,
fsyncs) are read from the components when Prometheus scrapes (``NodeCollector``); figures
derived from events (schedule-to-start, dispatch share, lease expiries) are folded per event
batch by the projector, off the processors' path; the gateway observes once per request.

The golden signals of the design: schedule-to-start latency per partition and queue, timer
lag, lease-expiry rate, per-tenant dispatch share. Names follow Prometheus conventions: base
units (seconds), ``_total`` for counters (prometheus-client appends it).

Tenants: the dispatch counter is the only series that names one (queue names are labels too,
and are chosen by tenants: see ``TenantLabels``). Who may read ``/metrics`` at all is the
gateway's business (``app.py``: a key of its own).
"""

from __future__ import annotations

import hashlib
import time
from collections import Counter as Tally
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from enum import StrEnum
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from conveyor.schemas.types import TERMINAL, EventKind, TaskEvent, TaskStatus
from conveyor.streams.log.api import Log, LogRecord

if TYPE_CHECKING:
    from conveyor.streams.node import Node

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Tasks made ready but not yet leased whose ready time we remember for schedule-to-start;
# beyond this the oldest are forgotten (a backlog that large is visible in the depth gauges).
READY_REMEMBERED_MAX = 1_000_000
LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 3600,
)  # fmt: skip


class TenantLabels(StrEnum):
    """How ``conveyor_dispatched_total`` labels a tenant.

    - ``on``: its name. Right for ``conveyor dev`` (the developer's own tenants) and for a node
      whose tenants are one organisation's teams.
    - ``hashed``: a pseudonym, ``t`` and 12 hex digits of the name's SHA-256: stable across
      restarts and nodes, so per-tenant rates, the dispatch-share panel and the
      ``ConveyorDispatchUnfair`` alert work, and nobody reading the metrics (a dashboard
      viewer, a shared Prometheus) learns a customer's name from them. It hides a name, it
      does not make it secret: whoever can guess a name can hash it and find its series. The
      default of ``conveyor node``: fairness is a golden signal, and tenant names are
      customer data that an operator's tools do not need.
    - ``off``: no tenant at all (the label is empty, which Prometheus reads as absent): one
      series for the whole node; the fairness alert cannot fire.
    """

    ON = "on"
    HASHED = "hashed"
    OFF = "off"


def tenant_label(tenant: str, mode: TenantLabels) -> str:
    if mode is TenantLabels.ON:
        return tenant
    if mode is TenantLabels.OFF:
        return ""
    return "t" + hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()[:12]


class Metrics:
    """Every metric of one process, in its own registry (tests run several nodes at once)."""

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        tenant_labels: TenantLabels = TenantLabels.ON,
    ) -> None:
        self.registry = registry or CollectorRegistry()
        self.tenant_labels = tenant_labels
        self._tenant_label: dict[str, str] = {}
        r = self.registry
        self.enqueue_ack = Histogram(
            "conveyor_enqueue_ack_seconds",
            "Gateway enqueue request to durable acknowledgement",
            ["route"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.log_append = Histogram(
            "conveyor_log_append_seconds",
            "Log append call to durable (group commit included)",
            ["log"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.schedule_to_start = Histogram(
            "conveyor_schedule_to_start_seconds",
            "Ready (enqueued or requeued) to leased, per partition and queue",
            ["partition", "queue"],
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self.dispatched = Counter(
            "conveyor_dispatched",
            "Leases granted per tenant (dispatch share = rate / sum of rates)",
            ["tenant"],
            registry=r,
        )
        self.lease_expired = Counter(
            "conveyor_lease_expired", "Leases that lapsed without heartbeat", ["partition"],
            registry=r,
        )  # fmt: skip
        self.finished = Counter(
            "conveyor_tasks_finished", "Tasks that reached a terminal state", ["queue", "status"],
            registry=r,
        )  # fmt: skip
        self.projected_events = Counter(
            "conveyor_projection_events", "Events written to the Postgres snapshot", registry=r
        )
        self.projection_batch = Histogram(
            "conveyor_projection_write_seconds",
            "One projector transaction (fold + upserts + watermark)",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        # The projection's lag, read from it when scraped (``ProjectionCollector``).
        self.projection: ProjectionLag | None = None
        r.register(ProjectionCollector(self))
        self.tasks = Gauge(
            "conveyor_tasks", "Tasks by queue and state (from the snapshot)", ["queue", "status"],
            registry=r,
        )  # fmt: skip
        self._ready_ms: OrderedDict[str, int] = OrderedDict()
        self._children: dict[tuple[object, ...], Any] = {}
        self.dispatch_window = DispatchWindow()

    def watch(self, node: Node) -> None:
        """Expose the node's own figures, read at scrape time, and the event-derived ones, fed
        by its processors as they commit (once per event, none decoded again)."""
        self.registry.register(NodeCollector(node))
        node.on_events(self.observe_events)

    def watch_snapshots(self, snapshots: SnapshotFigures) -> None:
        """Expose the partition snapshots' age, size and duration, read at scrape time."""
        self.registry.register(SnapshotCollector(snapshots))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)

    def observe_events(self, partition: int, events: Sequence[TaskEvent]) -> None:
        """Fold one committed batch's events into the event-derived metrics: one pass over
        the events, then one update per label set (its child looked up once, and kept)."""
        leased: Tally[tuple[int, str]] = Tally()  # (minute bucket, tenant) -> leases
        finished: Tally[tuple[str, str]] = Tally()
        delays: dict[str, list[float]] = {}
        expired = 0
        ready_ms = self._ready_ms
        for e in events:
            kind = e.kind
            if kind is _LEASED:
                leased[e.ts_ms // DISPATCH_BUCKET_MS, e.tenant] += 1
                ready = ready_ms.pop(e.task_id, None)
                if ready is not None:
                    delays.setdefault(e.queue, []).append(max(0, e.ts_ms - ready) / 1000)
                continue
            if kind is _ENQUEUED or kind is _REQUEUED:
                if e.status == _READY:
                    ready_ms[e.task_id] = e.ts_ms
                if kind is _REQUEUED:
                    continue
            elif kind is _EXPIRED:
                expired += 1
            if e.status in _TERMINAL_NAMES:
                ready_ms.pop(e.task_id, None)
                finished[e.queue, e.status] += 1
        while len(ready_ms) > READY_REMEMBERED_MAX:
            ready_ms.popitem(last=False)
        label = str(partition)
        for queue, seconds in delays.items():
            histogram = self._child(self.schedule_to_start, label, queue)
            for delay_s in seconds:
                histogram.observe(delay_s)
        for (queue, status), n in finished.items():
            self._child(self.finished, queue, status).inc(n)
        for (_, tenant), n in leased.items():
            self._child(self.dispatched, self._label_of(tenant)).inc(n)
        if leased:
            self.dispatch_window.add(leased)
        if expired:
            self._child(self.lease_expired, label).inc(expired)

    def _label_of(self, tenant: str) -> str:
        label = self._tenant_label.get(tenant)
        if label is None:
            label = self._tenant_label[tenant] = tenant_label(tenant, self.tenant_labels)
        return label

    def _child(self, metric: Any, *labels: str) -> Any:
        """``metric.labels(*labels)``, kept: a child never changes once made."""
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def set_task_counts(self, counts: Iterable[tuple[str, str, int]]) -> None:
        self.tasks.clear()  # states that emptied must not keep their last value
        for queue, status, n in counts:
            self.tasks.labels(queue, status).set(n)


_TERMINAL_NAMES = frozenset(s.value for s in TERMINAL)
_LEASED, _ENQUEUED = EventKind.TaskLeased, EventKind.TaskEnqueued
_REQUEUED, _EXPIRED = EventKind.TaskRequeued, EventKind.LeaseExpired
_READY = TaskStatus.ENQUEUED.value
DISPATCH_BUCKET_MS = 60_000
DISPATCH_WINDOW_BUCKETS = 5


class DispatchWindow:
    """Leases granted per tenant over the last few minutes (``GET /v1/tenants/me/usage``):
    per-minute buckets keyed by the TaskLeased event time, folded per event batch like the
    ``conveyor_dispatched`` counter (whose cumulative totals cannot answer "recently")."""

    def __init__(self) -> None:
        self._buckets: dict[int, Tally[str]] = {}

    @property
    def window_ms(self) -> int:
        return DISPATCH_BUCKET_MS * DISPATCH_WINDOW_BUCKETS

    def add(self, leases: Mapping[tuple[int, str], int]) -> None:
        """``leases``: (minute bucket of the lease's time, tenant) -> leases granted."""
        for (bucket, tenant), n in leases.items():
            tally = self._buckets.get(bucket)
            if tally is None:
                tally = self._buckets[bucket] = Tally()
            tally[tenant] += n
        while len(self._buckets) > DISPATCH_WINDOW_BUCKETS + 1:
            del self._buckets[min(self._buckets)]  # partitions may interleave minutes

    def counts(self, now_ms: int) -> Tally[str]:
        """Leases per tenant in the whole minutes of the window ending at ``now_ms``."""
        first = now_ms // DISPATCH_BUCKET_MS - DISPATCH_WINDOW_BUCKETS + 1
        total: Tally[str] = Tally()
        for bucket, tally in self._buckets.items():
            if bucket >= first:
                total.update(tally)
        return total


class ProjectionLag(Protocol):
    def lag_records(self) -> dict[int, int]: ...

    def lag_s(self) -> float: ...


class ProjectionCollector(Collector):
    """The projection's lag behind the events log, read from the projector when scraped (so
    it is current between its writes); nothing while none runs."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics

    def collect(self) -> Iterator[Metric]:
        projection = self._metrics.projection
        if projection is None:
            return
        records = GaugeMetricFamily(
            "conveyor_projection_lag_records",
            "Events-log records not yet projected, per partition",
            labels=["partition"],
        )
        for p, lag in projection.lag_records().items():
            records.add_metric([str(p)], lag)
        yield records
        yield GaugeMetricFamily(
            "conveyor_projection_lag_seconds",
            "Age of the newest projected event while records wait (0 when caught up)",
            value=projection.lag_s(),
        )


class SnapshotFigures(Protocol):
    def figures(self) -> dict[int, tuple[float, int, float | None]]: ...


class SnapshotCollector(Collector):
    """Partition snapshots (``streams/cluster/snapshots.py``) of the partitions led here: the
    newest one's age and size, and how long the last one taken here took."""

    def __init__(self, snapshots: SnapshotFigures) -> None:
        self._snapshots = snapshots

    def collect(self) -> Iterator[Metric]:
        age = GaugeMetricFamily(
            "conveyor_snapshot_age_seconds",
            "Age of the newest snapshot of each partition led here",
            labels=["partition"],
        )
        size = GaugeMetricFamily(
            "conveyor_snapshot_bytes", "Size of that snapshot's archive", labels=["partition"]
        )
        took = GaugeMetricFamily(
            "conveyor_snapshot_duration_seconds",
            "How long the last snapshot taken here took (checkpoint, pack, upload)",
            labels=["partition"],
        )
        for p, (age_s, archive_bytes, duration_s) in self._snapshots.figures().items():
            age.add_metric([str(p)], age_s)
            size.add_metric([str(p)], archive_bytes)
            if duration_s is not None:
                took.add_metric([str(p)], duration_s)
        yield from (age, size, took)


class NodeCollector(Collector):
    """Processor lag, timer lag and log counters, read from the node when scraped."""

    def __init__(self, node: Node) -> None:
        self._node = node

    def collect(self) -> Iterator[Metric]:
        node = self._node
        lag = GaugeMetricFamily(
            "conveyor_processor_lag_records",
            "Log records appended but not yet applied, per partition",
            labels=["partition"],
        )
        timer = GaugeMetricFamily(
            "conveyor_timer_lag_seconds",
            "How late the last due timer was proposed, per partition",
            labels=["partition"],
        )
        lag_s = GaugeMetricFamily(
            "conveyor_processor_lag_seconds",
            "Age of the oldest log record not yet applied (0: caught up), per partition",
            labels=["partition"],
        )
        applied = CounterMetricFamily(
            "conveyor_processor_applied_records", "Records applied", labels=["partition"]
        )
        duty_failures = CounterMetricFamily(
            "conveyor_processor_duty_failures",
            "Leader duties that failed on an unexpected error (the processor led again)",
            labels=["partition"],
        )
        for proc in node.processors:
            p = str(proc.partition)
            lag.add_metric([p], proc.lag_records())
            lag_s.add_metric([p], proc.lag_s())
            timer.add_metric([p], proc.timers.lag_ms / 1000)
            applied.add_metric([p], proc.records_applied)
            duty_failures.add_metric([p], proc.duty_failures)
        yield from (lag, lag_s, timer, applied, duty_failures)
        yield from _log_counters([("records", node.log), ("events", node.events)])


def _log_counters(logs: Iterable[tuple[str, object]]) -> Iterator[Metric]:
    """fsyncs and records written of logs that count them (the local log does): their rates'
    ratio is the records per fsync that group commit achieves."""
    fsyncs = CounterMetricFamily("conveyor_log_fsyncs", "Group-commit fdatasyncs", labels=["log"])
    written = CounterMetricFamily(
        "conveyor_log_records_written", "Records made durable", labels=["log"]
    )
    for name, log_ in logs:
        count = getattr(log_, "fsync_count", None)
        records = getattr(log_, "records_written", None)
        if isinstance(count, int) and isinstance(records, int):
            fsyncs.add_metric([name], count)
            written.add_metric([name], records)
    yield from (fsyncs, written)


class TimedLog:
    """A Log that times each ``append`` (one observation per call, i.e. per batch)."""

    def __init__(self, inner: Log, histogram: Histogram, name: str) -> None:
        self.inner = inner
        self._observe = histogram.labels(name).observe

    @property
    def partitions(self) -> int:
        return self.inner.partitions

    async def append(
        self, partition: int, records: Sequence[bytes], epoch: int | None = None
    ) -> list[int]:
        started = time.perf_counter()
        offsets = await self.inner.append(partition, records, epoch)
        self._observe(time.perf_counter() - started)
        return offsets

    def read(
        self, partition: int, from_offset: int, *, follow: bool = False, max_batch: int = 1024
    ) -> AsyncIterator[list[LogRecord]]:
        return self.inner.read(partition, from_offset, follow=follow, max_batch=max_batch)

    async def seal(self, partition: int, epoch: int) -> None:
        await self.inner.seal(partition, epoch)

    async def trim(self, partition: int, up_to: int) -> None:
        await self.inner.trim(partition, up_to)

    def end_offset(self, partition: int) -> int:
        return self.inner.end_offset(partition)

    @property
    def ends_known(self) -> bool:
        return self.inner.ends_known

    def start_offset(self, partition: int) -> int:
        return self.inner.start_offset(partition)

    def fence(self, partition: int) -> int:
        return self.inner.fence(partition)

    async def close(self) -> None:
        await self.inner.close()

    @property
    def fsync_count(self) -> int | None:
        return getattr(self.inner, "fsync_count", None)

    @property
    def records_written(self) -> int | None:
        return getattr(self.inner, "records_written", None)


def time_appends(node: Node, metrics: Metrics) -> None:
    """Route the node's record-log appends through ``TimedLog``; call before ``node.start``."""
    timed = TimedLog(node.log, metrics.log_append, "records")
    node.log = timed
    for proc in node.processors:
        proc.log = timed
