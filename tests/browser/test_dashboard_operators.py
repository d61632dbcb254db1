"""The operator's pages in headless chromium against a real ``conveyor dev``: the queues page's
delayed tasks and history charts (from the server), and the agents page.

As in test_dashboard.py, each test uses its own queue, and the snapshot trails the processors
by the projection lag: the tests reload until the page shows it, with a deadline.
"""

from __future__ import annotations

from typing import Any

import pytest
from dashboard_harness import Dev
from test_dashboard import open_dashboard, queue_name, until

pytestmark = pytest.mark.timeout(240)


def _card(page: Any, dev: Dev, queue: str, ready: Any, what: str, hash_: str = "#/queues") -> Any:
    """The queue's card once ``ready(card)`` holds, reloading the page until it does."""
    open_dashboard(page, dev, hash_)
    card = page.locator(f"section.queue[data-queue='{queue}']")

    def shown() -> bool:
        if card.count() and ready(card):
            return True
        page.reload()
        page.wait_for_selector("div.queues")
        return False

    until(shown, what)
    return card


def test_a_delayed_task_is_counted_as_delayed_not_as_an_old_ready_one(page: Any, dev: Dev) -> None:
    queue = queue_name()
    dev.enqueue("double", {"n": 1}, queue=queue, delay_ms=90 * 60_000)
    card = _card(page, dev, queue, lambda c: c.locator(".delayed").count() > 0, "the delayed count")
    assert card.locator(".delayed").inner_text() == "1"
    assert card.locator(".next-due").inner_text().startswith("1 h 29 m") or (
        card.locator(".next-due").inner_text().startswith("1 h 30 m")
    )
    assert card.locator(".age").inner_text() == "—"  # nothing is due: no oldest ready task


def test_history_charts_come_from_the_server_for_the_window_and_task_type(
    page: Any, dev: Dev
) -> None:
    queue = queue_name()
    done = [dev.enqueue("double", {"n": n}, queue=queue) for n in range(3)]
    failed = dev.enqueue("explode", {"order": 9}, queue=queue, retry={"attempts_max": 2,
                         "backoff_base_ms": 50, "backoff_cap_ms": 100})  # fmt: skip
    for task_id in done:
        dev.wait_status(task_id, "SUCCEEDED")
    dev.wait_status(failed, "FAILED")

    def charted(card: Any) -> bool:
        finished = card.locator("figure[data-chart^='finished'] .max")
        return bool(finished.count()) and finished.inner_text() != "max 0"

    # Opened fresh: the history is there at once, not collected while the page is open.
    card = _card(page, dev, queue, charted, "the finished chart of the queue")
    charts = card.locator(".charts")
    assert charts.get_attribute("data-window") == "1h"
    assert charts.get_attribute("data-points") == "60"
    names = [f.get_attribute("data-chart") for f in card.locator("figure.chart").all()]
    assert names == [
        "finished / 1 min", "error rate", "retries / 1 min", "schedule to start", "run time",
        "depth",
    ]  # fmt: skip
    assert card.locator("figure[data-chart='error rate'] .max").inner_text() != "max 0.0 %"
    assert card.locator("figure[data-chart^='retries'] .max").inner_text() == "max 1"
    assert card.locator("figure[data-chart='run time'] .max").inner_text() != "max —"

    # One task type: the explode task is the one that failed, its error rate is 100 %.
    card.locator("select[name=task_type]").select_option("explode")
    page.wait_for_selector(
        f"section.queue[data-queue='{queue}'] figure[data-chart='error rate'] .max"
        ":has-text('max 100.0 %')"
    )
    page.click("button[data-window='24h']")
    page.wait_for_selector(f"section.queue[data-queue='{queue}'] .charts[data-window='24h']")
    day = page.locator(f"section.queue[data-queue='{queue}'] .charts")
    assert day.get_attribute("data-points") == "96"
    assert "window=24h" in page.url


def test_agents_page_lists_the_dev_agent_with_its_running_task(page: Any, dev: Dev) -> None:
    queue = queue_name()
    napping = dev.enqueue("nap", {"s": 6}, queue=queue)
    open_dashboard(page, dev, "#/agents")
    page.wait_for_selector("h1:has-text('Agents')")
    task = page.locator(f"table.agents li[data-task-id='{napping}']")

    def running() -> bool:
        if task.count():
            return True
        page.reload()
        page.wait_for_selector("main .results")
        return False

    until(running, f"task {napping} running on an agent")
    row = page.locator("table.agents tr", has=page.locator(f"li[data-task-id='{napping}']"))
    assert row.locator(".state").inner_text() == "connected"
    assert "dashboard-tests" in row.locator("td").nth(2).inner_text()
    used, _, total = row.locator(".slots").inner_text().partition(" / ")
    assert int(used) >= 1 and int(total) >= int(used)
    assert row.locator(".last-poll").inner_text().endswith("ago")
    assert "nap" in task.inner_text() and queue in task.inner_text()
    assert page.locator("#nav a[data-view='agents']").get_attribute("class") == "active"
    dev.wait_status(napping, "SUCCEEDED")


def test_pause_and_resume_a_queue_from_its_card(page: Any, dev: Dev) -> None:
    queue = queue_name()
    first = dev.enqueue("double", {"n": 1}, queue=queue)
    dev.wait_status(first, "SUCCEEDED")
    card = _card(page, dev, queue, lambda c: c.locator(".pause-toggle").count() > 0, "the card")
    assert card.locator(".pause-toggle").inner_text() == "Pause"
    card.locator(".pause-toggle").click()
    page.wait_for_selector(f"#flash:has-text('Queue {queue} paused.')")
    page.wait_for_selector(f"section.queue[data-queue='{queue}'][data-paused='true'] .paused")

    held = dev.enqueue("double", {"n": 2}, queue=queue)  # accepted, and not run
    other = dev.enqueue("double", {"n": 3}, queue=queue_name())
    # The agent runs another queue's task enqueued after it: the held one, older and first in
    # line, was passed over.
    dev.wait_status(other, "SUCCEEDED")
    assert dev.call("GET", f"/v1/tasks/{held}")["status"] == "ENQUEUED"
    paused = page.locator(f"section.queue[data-queue='{queue}']")
    assert paused.locator(".pause-toggle").inner_text() == "Resume"
    paused.locator(".pause-toggle").click()
    page.wait_for_selector(f"#flash:has-text('Queue {queue} resumed.')")
    dev.wait_status(held, "SUCCEEDED")
    page.wait_for_selector(f"section.queue[data-queue='{queue}'][data-paused='false']")
