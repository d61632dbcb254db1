"""Queue history: per (tenant, minute, queue, task type) counts and latency histograms, folded
from the events stream by the projector, read back over any window (``GET /v1/stats/history``).

Rules, and why:

1. Exactly once. Counts are added to a row, not replaced, so the per-row version guard of the
   task rows cannot protect them. Instead ``history_marks`` keeps, per record-log partition,
   the offset of the newest record whose events are counted, read and advanced inside the
   projector's transaction: an event whose ``version`` is at or below it is not counted again
   (a chunk re-read after a restart, rows held back by the projector, a batch the outbox
   shipped twice, a new leader shipping again what the old one had shipped).
2. Latencies need two events of a task: schedule-to-start is its lease's stamp minus the time
   it became ready (its TaskEnqueued, the ``run_at_ms`` of a delayed one, or its TaskRequeued);
   an attempt's duration is the stamp of the event ending it minus its lease's. The times are
   remembered per task between chunks (``Hints``, bounded); one that is not (the projector
   restarted in between, or forgot) is read from the task row, as it stood before the chunk,
   in the same transaction. A time this chunk used up (a lease took the ready time, an end
   the lease time) is not read back: the row's would be older still.
5. Cheap per event: the projector pays for the history in its own transaction, so a chunk is
   folded in one pass in memory (what each event kind counts is decided once, in
   ``_ACTION``), the task rows are read only for the latencies no hint remembers, and the
   rows and the marks go in one statement: two round trips a chunk in the common case.
3. Histograms over fixed buckets a factor of sqrt(2) apart (``BUCKET_BOUNDS_MS``): rows add
   element-wise, and a percentile of any window is the bucket it falls in, reported as the
   bucket's geometric middle (within 19 % of the true value). 54 buckets cover 1 ms to a day.
4. Depth is not stored: the depth at the end of a step is the number of unfinished tasks now
   minus the tasks that entered (enqueued) and plus those that left (finished) since. A dead
   letter retried (FAILED back to ENQUEUED) re-enters without an enqueue, so the depth drawn
   before such a retry is that many tasks short.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from conveyor.schemas.types import EventBatch, EventKind, TaskStatus

MINUTE_MS = 60_000
# Upper bounds of buckets 0..52 (bucket i holds values below BUCKET_BOUNDS_MS[i]); bucket 53
# holds the rest (from 2^26 ms, about 18.6 hours).
BUCKET_BOUNDS_MS = tuple(2 ** (i / 2) for i in range(53))
BUCKETS = len(BUCKET_BOUNDS_MS) + 1
HINTS_MAX = 200_000  # tasks whose ready or lease time is remembered between chunks

_COUNTED = {
    EventKind.TaskEnqueued: "enqueued",
    EventKind.TaskLeased: "started",
    EventKind.TaskSucceeded: "succeeded",
    EventKind.TaskFailed: "failed",
    EventKind.TaskCanceled: "canceled",
    EventKind.TaskExpired: "expired",
    EventKind.TaskRetryScheduled: "retried",
}
COUNTS = ("enqueued", "started", "succeeded", "failed", "canceled", "expired", "retried")
# Events that end the attempt under way (the projection's ATTEMPT_ENDS less TaskWaiting,
# which may end none) and so close its duration.
_RUN_ENDS = frozenset(
    {
        EventKind.TaskSucceeded,
        EventKind.TaskRetryScheduled,
        EventKind.TaskFailed,
        EventKind.TaskCanceled,
        EventKind.TaskExpired,
        EventKind.TaskSleeping,
    }
)
# A cancel or an expiry may end a task that was not leased: the lease time its row holds is
# then an older attempt's, so only a lease remembered since (any other event drops it) counts.
_MAY_END_NONE = frozenset({EventKind.TaskCanceled, EventKind.TaskExpired})
_READY = frozenset({EventKind.TaskEnqueued, EventKind.TaskRequeued})


def bucket_of(ms: int) -> int:
    return bisect_right(BUCKET_BOUNDS_MS, max(0, ms))


def percentile(hist: Sequence[int], q: float) -> int | None:
    """The value at quantile ``q`` of a histogram: its bucket's geometric middle (rule 3)."""
    total = sum(hist)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(hist):
        seen += n
        if n and seen >= rank:
            if i == 0:
                return 0
            low = BUCKET_BOUNDS_MS[i - 1]
            high = BUCKET_BOUNDS_MS[i] if i < len(BUCKET_BOUNDS_MS) else low * math.sqrt(2)
            return round(math.sqrt(low * high))
    return None  # unreachable: seen reaches total


@dataclass(slots=True)
class Row:
    counts: list[int] = field(default_factory=lambda: [0] * len(COUNTS))  # in COUNTS' order
    wait: list[int] = field(default_factory=lambda: [0] * BUCKETS)
    run: list[int] = field(default_factory=lambda: [0] * BUCKETS)


class Hints:
    """Per task, when it became ready and when its attempt under way was leased (rule 2).
    Bounded: past ``HINTS_MAX`` the oldest half is forgotten (read back from the row)."""

    def __init__(self, size_max: int = HINTS_MAX) -> None:
        self.ready: dict[str, int] = {}
        self.leased: dict[str, int] = {}
        self._size_max = size_max

    def put(self, table: dict[str, int], task_id: str, ms: int) -> None:
        table.pop(task_id, None)
        table[task_id] = ms
        if len(table) > self._size_max:
            for old in list(table)[: len(table) // 2]:
                del table[old]


_Key = tuple[str, int, str, str]  # tenant, minute, queue, task type
# What the fold does with an event, decided once per kind: its count's index in COUNTS (or
# None), and whether it starts a wait (a lease) or ends a run.
_LEASE, _RUN_END, _RUN_END_MAYBE, _OTHER = 1, 2, 3, 0
_ACTION = {
    kind: (
        COUNTS.index(_COUNTED[kind]) if kind in _COUNTED else None,
        _LEASE
        if kind == EventKind.TaskLeased
        else (_RUN_END_MAYBE if kind in _MAY_END_NONE else _RUN_END)
        if kind in _RUN_ENDS
        else _OTHER,
    )
    for kind in EventKind
}


class HistoryFold:
    """The history of one chunk of events, counted from ``history_marks`` (rule 1)."""

    def __init__(self, batches: Iterable[EventBatch], hints: Hints) -> None:
        self.batches = list(batches)
        self.hints = hints
        self.rows: dict[_Key, Row] = {}
        self.marks: dict[int, int] = {}
        # Latencies whose start no hint remembers (rule 2), read from the task rows after the
        # pass: (row, the event's stamp, its task, whether it is a lease).
        self._unknown: list[tuple[Row, int, str, bool]] = []

    async def write(self, conn: asyncpg.Connection) -> None:
        """Count the chunk's events past the marks and add them; inside a transaction. Two
        statements in the common case (the marks, then the rows with the new marks), a third
        when a latency needs a time no hint remembers."""
        if not self.batches:
            return
        marks = {
            int(r["partition"]): int(r["record_offset"])
            for r in await conn.fetch(
                "SELECT partition, record_offset FROM history_marks FOR UPDATE"
            )
        }
        self._fold(marks)
        if self._unknown:
            await self._read_unknown(conn)
        if self.rows or self.marks:
            await conn.execute(
                UPSERT, *self._columns(), list(self.marks), list(self.marks.values())
            )

    def _fold(self, marks: dict[int, int]) -> None:
        """One pass: count what is past the marks, and remember ready and lease times. A
        latency whose start is not remembered waits in ``_unknown`` for its task row."""
        hints = self.hints
        ready_of, leased_of, put = hints.ready, hints.leased, hints.put
        rows, unknown, bounds = self.rows, self._unknown, BUCKET_BOUNDS_MS
        # Times this chunk used up (a lease took the ready time, an end the lease time): what
        # comes after has none, and the task row's would be older still.
        ready_spent: set[str] = set()
        lease_spent: set[str] = set()
        action, enqueued, leased_status = _ACTION, TaskStatus.ENQUEUED, TaskStatus.LEASED
        leased_kind, ready_kinds = EventKind.TaskLeased, _READY
        for batch in self.batches:
            mark = marks.get(batch.partition, -1)
            for e in batch.events:
                kind, task_id, ts = e.kind, e.task_id, e.ts_ms
                if e.version > mark:
                    index, latency = action[kind]
                    if index is not None or latency:
                        key = (e.tenant, ts - ts % MINUTE_MS, e.queue, e.task_type)
                        row = rows.get(key)
                        if row is None:
                            row = rows[key] = Row()
                        if index is not None:
                            row.counts[index] += 1
                        if latency == _LEASE:
                            ready = ready_of.get(task_id)
                            if ready is not None:
                                row.wait[bisect_right(bounds, max(0, ts - ready))] += 1
                            elif task_id not in ready_spent:
                                unknown.append((row, ts, task_id, True))
                        elif latency:
                            started = leased_of.get(task_id)
                            if started is not None:
                                if started <= ts:
                                    row.run[bisect_right(bounds, ts - started)] += 1
                            elif latency == _RUN_END and task_id not in lease_spent:
                                unknown.append((row, ts, task_id, False))
                if kind in ready_kinds and e.status == enqueued:
                    put(ready_of, task_id, ts if e.run_at_ms is None else e.run_at_ms)
                elif kind == leased_kind:
                    if ready_of.pop(task_id, None) is not None:
                        ready_spent.add(task_id)
                    put(leased_of, task_id, ts)
                # Not leased: the attempt under way, if any, ended.
                elif e.status != leased_status and leased_of.pop(task_id, None) is not None:
                    lease_spent.add(task_id)
            if batch.offset > mark:
                marks[batch.partition] = batch.offset
                self.marks[batch.partition] = batch.offset

    async def _read_unknown(self, conn: asyncpg.Connection) -> None:
        """The latencies of ``_unknown`` from the rows of their tasks as they stood before the
        chunk (rule 2): ready_ms for a lease, leased_ms for an end."""
        wanted = list({task_id for _, _, task_id, _ in self._unknown})
        stored = {
            r["task_id"]: (r["ready_ms"], r["leased_ms"])
            for r in await conn.fetch(
                "SELECT task_id, ready_ms, leased_ms FROM tasks WHERE task_id = ANY($1::text[])",
                wanted,
            )
        }
        for row, ts, task_id, lease in self._unknown:
            ready, started = stored.get(task_id, (None, None))
            if lease:
                if ready is not None:
                    row.wait[bucket_of(ts - ready)] += 1
            elif started is not None and started <= ts:
                row.run[bucket_of(ts - started)] += 1
        self._unknown.clear()

    def _columns(self) -> list[list[Any]]:
        keys = list(self.rows)
        rows = [self.rows[k] for k in keys]
        out: list[list[Any]] = [[k[i] for k in keys] for i in range(4)]
        out += [[r.counts[i] for r in rows] for i in range(len(COUNTS))]
        out.append([_array(r.wait) for r in rows])
        out.append([_array(r.run) for r in rows])
        return out


def _array(hist: list[int]) -> str:
    return "{" + ",".join(map(str, hist)) + "}"


# The rows and the marks in one statement (one round trip; both CTEs run, whatever is read).
UPSERT = """
WITH counted AS (
INSERT INTO queue_history AS h (tenant, minute_ms, queue, task_type, enqueued, started,
    succeeded, failed, canceled, expired, retried, wait_hist, run_hist)
SELECT tenant, minute_ms, queue, task_type, enqueued, started, succeeded, failed, canceled,
       expired, retried, wait_hist::int8[], run_hist::int8[]
FROM unnest($1::text[], $2::int8[], $3::text[], $4::text[], $5::int8[], $6::int8[], $7::int8[],
            $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::text[], $13::text[])
     AS u(tenant, minute_ms, queue, task_type, enqueued, started, succeeded, failed, canceled,
          expired, retried, wait_hist, run_hist)
ON CONFLICT (tenant, minute_ms, queue, task_type) DO UPDATE SET
    enqueued = h.enqueued + EXCLUDED.enqueued,
    started = h.started + EXCLUDED.started,
    succeeded = h.succeeded + EXCLUDED.succeeded,
    failed = h.failed + EXCLUDED.failed,
    canceled = h.canceled + EXCLUDED.canceled,
    expired = h.expired + EXCLUDED.expired,
    retried = h.retried + EXCLUDED.retried,
    wait_hist = ARRAY(SELECT COALESCE(a, 0) + COALESCE(b, 0)
                      FROM unnest(h.wait_hist, EXCLUDED.wait_hist) AS x(a, b)),
    run_hist = ARRAY(SELECT COALESCE(a, 0) + COALESCE(b, 0)
                     FROM unnest(h.run_hist, EXCLUDED.run_hist) AS x(a, b))
), marked AS (
INSERT INTO history_marks (partition, record_offset)
SELECT * FROM unnest($14::int4[], $15::int8[])
ON CONFLICT (partition) DO UPDATE SET record_offset = GREATEST(history_marks.record_offset,
                                                               EXCLUDED.record_offset)
)
SELECT 1
"""


# -- reading ---------------------------------------------------------------------------------

WINDOWS_MS = {"1h": (3_600_000, 60_000), "24h": (86_400_000, 900_000)}  # span, step


@dataclass(frozen=True, slots=True, kw_only=True)
class HistoryQuery:
    tenant: str
    window: str  # a key of WINDOWS_MS
    queue: str | None = None
    task_type: str | None = None


def _filters(q: HistoryQuery, args: list[Any]) -> str:
    sql = ""
    for column, value in (("queue", q.queue), ("task_type", q.task_type)):
        if value is not None:
            args.append(value)
            sql += f" AND {column} = ${len(args)}"
    return sql


async def read(
    conn: asyncpg.Connection | asyncpg.Pool, q: HistoryQuery, now_ms: int
) -> dict[str, Any]:
    """The window's points, oldest first: one per step, the last one holding now."""
    span_ms, step_ms = WINDOWS_MS[q.window]
    end_ms = now_ms - now_ms % step_ms + step_ms  # the end of the step holding now
    start_ms = end_ms - span_ms
    args: list[Any] = [q.tenant, start_ms, step_ms]
    where = f"tenant = $1 AND minute_ms >= $2{_filters(q, args)}"
    step = "(minute_ms - $2) / $3"
    counts = await conn.fetch(
        f"SELECT {step} AS i, "
        + ", ".join(f"sum({c}) AS {c}" for c in COUNTS)
        + f" FROM queue_history WHERE {where} GROUP BY 1",
        *args,
    )
    hists = await conn.fetch(
        f"SELECT {step} AS i, 'wait' AS h, b, sum(n) AS n FROM queue_history,"
        f" unnest(wait_hist) WITH ORDINALITY AS x(n, b) WHERE {where} AND n > 0 GROUP BY 1, 3"
        f" UNION ALL SELECT {step} AS i, 'run' AS h, b, sum(n) AS n FROM queue_history,"
        f" unnest(run_hist) WITH ORDINALITY AS x(n, b) WHERE {where} AND n > 0 GROUP BY 1, 3",
        *args,
    )
    types_args: list[Any] = [q.tenant, start_ms]
    of_queue = _filters(HistoryQuery(tenant=q.tenant, window=q.window, queue=q.queue), types_args)
    types = await conn.fetch(
        "SELECT DISTINCT task_type FROM queue_history WHERE tenant = $1 AND minute_ms >= $2"
        f"{of_queue} ORDER BY 1",
        *types_args,
    )
    depth_args: list[Any] = [q.tenant]
    depth = await conn.fetchval(
        f"SELECT count(*) FROM tasks WHERE tenant = $1 AND finished_ms IS NULL"
        f"{_filters(q, depth_args)}",
        *depth_args,
    )
    points = _points(span_ms // step_ms, counts, hists)
    _add_depth(points, int(depth))
    for i, p in enumerate(points):
        p["at_ms"] = start_ms + i * step_ms
        _rates(p, step_ms)
    return {
        "window": q.window,
        "step_ms": step_ms,
        "from_ms": start_ms,
        "to_ms": end_ms,
        "queue": q.queue,
        "task_type": q.task_type,
        "task_types": [r["task_type"] for r in types],
        "depth": int(depth),
        "points": points,
    }


def _points(steps: int, counts: Iterable[Any], hists: Iterable[Any]) -> list[dict[str, Any]]:
    points: list[dict[str, Any]] = [dict.fromkeys(COUNTS, 0) for _ in range(steps)]
    waits = [[0] * BUCKETS for _ in range(steps)]
    runs = [[0] * BUCKETS for _ in range(steps)]
    for r in counts:
        i = int(r["i"])
        if 0 <= i < steps:
            points[i].update({c: int(r[c]) for c in COUNTS})
    for r in hists:
        i = int(r["i"])
        if 0 <= i < steps:
            target = waits if r["h"] == "wait" else runs
            target[i][int(r["b"]) - 1] += int(r["n"])  # ORDINALITY counts from 1
    for p, wait, run in zip(points, waits, runs, strict=True):
        p["wait_p50_ms"], p["wait_p99_ms"] = percentile(wait, 0.5), percentile(wait, 0.99)
        p["run_p50_ms"], p["run_p99_ms"] = percentile(run, 0.5), percentile(run, 0.99)
    return points


def _add_depth(points: list[dict[str, Any]], now: int) -> None:
    """Unfinished tasks at the end of each step, from the number now (rule 4)."""
    depth = now
    for p in reversed(points):
        p["depth"] = max(0, depth)
        depth -= p["enqueued"] - (p["succeeded"] + p["failed"] + p["canceled"] + p["expired"])


def _rates(p: dict[str, Any], step_ms: int) -> None:
    finished = p["succeeded"] + p["failed"] + p["canceled"] + p["expired"]
    p["finished"] = finished
    p["finished_per_s"] = round(finished / (step_ms / 1000), 3)
    p["error_rate"] = round((finished - p["succeeded"]) / finished, 4) if finished else 0.0
