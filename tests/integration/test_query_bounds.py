"""The snapshot's list queries against a real PostgreSQL, on rows from ``conveyor bench query``:
paging with every filter returns exactly the matching rows in listing order; a text search
that examines a bounded number of rows per page still finds every match across its (short)
pages; ``count`` is exact when cheap and an estimate, marked so, when not."""

from __future__ import annotations

import asyncio
import dataclasses
import random
from typing import Any

import pytest
from test_projection import _fresh_pool, pg_server  # noqa: F401  (a fixture)

from conveyor.store.postgres import queries
from conveyor.store.postgres.queries import TaskQuery
from conveyor_devtools.bench import query as bench

pytestmark = pytest.mark.timeout(300)
ROWS = 3_000


def matches(row: dict[str, Any], q: TaskQuery) -> bool:
    """The list filters, restated in Python."""

    def within(value: int | None, lo: int | None, hi: int | None) -> bool:
        if lo is None and hi is None:
            return True
        return value is not None and (lo is None or value >= lo) and (hi is None or value < hi)

    return (
        row["tenant"] == q.tenant
        and (not q.statuses or row["status"] in q.statuses)
        and all(
            getattr(q, name) is None or row[name] == getattr(q, name)
            for name in ("queue", "task_type", "error_class")
        )
        and within(row["created_ms"], q.created_from_ms, q.created_to_ms)
        and within(row["finished_ms"], q.finished_from_ms, q.finished_to_ms)
        and (
            not q.error_text or (row["error_message"] or "").lower().find(q.error_text.lower()) >= 0
        )
    )


def expected(rows: list[dict[str, Any]], q: TaskQuery) -> list[str]:
    hits = [r for r in rows if matches(r, q)]
    hits.sort(key=lambda r: (r["created_ms"], r["task_id"]), reverse=True)
    return [r["task_id"] for r in hits]


async def walk(pool: Any, q: TaskQuery, limit: int, **options: Any) -> tuple[list[str], int]:
    """Every id the pages of ``q`` list, and how many pages came back short but not last."""
    ids: list[str] = []
    short = 0
    after = None
    while True:
        page, after = await queries.list_page(pool, q, limit, after, **options)
        ids += [r["task_id"] for r in page]
        if after is None:
            return ids, short
        short += len(page) < limit


def random_query(rng: random.Random) -> TaskQuery:
    end, span = bench.T_END_MS, bench.SPAN_MS
    start = end - rng.randrange(span)
    fields: dict[str, Any] = {
        "statuses": tuple(rng.sample([s for s, _ in bench.STATUSES], rng.choice([1, 1, 2, 3]))),
        "queue": rng.choice(bench.QUEUES),
        "task_type": rng.choice(bench.TASK_TYPES[:4]),
        "error_class": rng.choice([e for e, _ in bench.ERRORS]),
        "error_text": rng.choice(["sku-1", "DB-", "denied", "by request"]),
        "created_from_ms": start,
        "created_to_ms": start + rng.randrange(span),
        "finished_from_ms": start,
        "finished_to_ms": start + rng.randrange(span // 4),
    }
    chosen = rng.sample(sorted(fields), rng.randrange(0, 4))
    return TaskQuery(tenant=rng.choice(["t0", "t1"]), **{k: fields[k] for k in chosen})


def test_pages_list_exactly_the_matching_rows(pg_server: Any) -> None:  # noqa: F811
    async def main() -> None:
        async with _fresh_pool(str(pg_server.get_uri())) as pool:
            await bench.load(pool, ROWS)
            rows = [dict(r) for r in await pool.fetch("SELECT * FROM tasks")]
            rng = random.Random(5)
            found = 0
            for _ in range(150):
                q = random_query(rng)
                ids, _ = await walk(pool, q, rng.choice([1, 7, 100]))
                assert ids == expected(rows, q), q
                found += bool(ids)
            assert found > 50  # the random filters are not mostly empty

    asyncio.run(main())


def test_text_search_examines_a_bounded_number_of_rows_per_page(pg_server: Any) -> None:  # noqa: F811
    async def main() -> None:
        async with _fresh_pool(str(pg_server.get_uri())) as pool:
            await bench.load(pool, ROWS)
            rows = [dict(r) for r in await pool.fetch("SELECT * FROM tasks")]
            rare = TaskQuery(tenant="t0", error_text="SKU-1")  # a few percent of error rows
            want = expected(rows, rare)
            assert 0 < len(want) < 100
            ids, short = await walk(pool, rare, 20, scan_rows_max=50)
            assert ids == want
            assert short > 0  # some pages came back short, with a cursor to go on
            # With room to examine every row in one page, nothing comes back short.
            assert await walk(pool, rare, 1_000, scan_rows_max=ROWS) == (want, 0)
            narrowed = dataclasses.replace(rare, statuses=("FAILED",), error_text="sku")
            assert (await walk(pool, narrowed, 5, scan_rows_max=40))[0] == expected(rows, narrowed)

    asyncio.run(main())


def test_count_is_exact_when_cheap_and_an_estimate_when_not(pg_server: Any) -> None:  # noqa: F811
    async def main() -> None:
        async with _fresh_pool(str(pg_server.get_uri())) as pool:
            await bench.load(pool, 200_000)
            q = TaskQuery(tenant="t0")
            exact = await queries.count_tasks(pool, q)
            assert await queries.count_or_estimate(pool, q, budget_ms=60_000) == (exact, True)
            estimate, is_exact = await queries.count_or_estimate(pool, q, budget_ms=1)
            assert not is_exact
            assert 0.5 * exact < estimate < 1.5 * exact

    asyncio.run(main())
