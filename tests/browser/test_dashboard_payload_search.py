"""The task list's payload search in headless chromium against a real ``conveyor dev``: the box
takes ``payload.<field>=<value>`` pairs, keeps them in the URL, narrows the list beside the
other filters, refuses a malformed box without leaving the page, and turns the bulk cancel
off (a bulk operation does not take a payload search).

As in test_dashboard.py, each test uses its own queue, and the snapshot trails the processors
by the projection lag: the tests apply until the list shows it, with a deadline.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from dashboard_harness import Dev
from test_dashboard import apply_until_row, fresh_list, open_dashboard, queue_name

pytestmark = pytest.mark.timeout(240)


def _listed(page: Any, search: str) -> set[str]:
    page.fill("input[name=payload]", search)
    fresh_list(page, lambda: page.click("form.filters button[type=submit]"))
    rows = page.locator("table.tasks tbody tr")
    return {str(rows.nth(i).get_attribute("data-task-id")) for i in range(rows.count())}


def test_the_search_box_finds_tasks_by_payload_field(page: Any, dev: Dev) -> None:
    queue = queue_name()
    tag = secrets.token_hex(4)  # this run's customers: the dev node outlives one test
    acme, globex = f"acme-{tag}", f"globex-{tag}"
    a1 = dev.enqueue("double", {"n": 1, "customer": acme, "region": "eu"}, queue=queue)
    a2 = dev.enqueue("double", {"n": 2, "customer": acme, "region": "us"}, queue=queue)
    g1 = dev.enqueue("double", {"n": 3, "customer": globex, "region": "eu"}, queue=queue)
    spaced = dev.enqueue("double", {"n": 4, "customer": f"Acme Corp {tag}"}, queue=queue)

    open_dashboard(page, dev)
    page.fill("input[name=queue]", queue)
    page.fill("input[name=payload]", f"payload.customer={acme}")
    row = apply_until_row(page, a2)
    assert row.count() == 1
    rows = page.locator("table.tasks tbody tr")
    assert {rows.nth(i).get_attribute("data-task-id") for i in range(rows.count())} == {a1, a2}
    assert f"payload.customer={acme}" in page.evaluate("location.hash")
    assert page.is_disabled("#cancel-matching")  # it would cancel more than the list shows
    assert "payload search" in str(page.get_attribute("#cancel-matching", "title"))

    assert _listed(page, f"payload.customer={acme} payload.region=eu") == {a1}
    assert _listed(page, f"payload.customer={globex}") == {g1}
    assert _listed(page, "payload.n=3") == {g1}  # a number, compared as one
    assert _listed(page, f'payload.customer="Acme Corp {tag}"') == {spaced}
    assert _listed(page, f"payload.customer=nobody-{tag}") == set()
    assert page.is_visible(".results .empty")
    assert _listed(page, "") == {a1, a2, g1, spaced}  # cleared: the queue filter alone
    assert page.is_enabled("#cancel-matching")

    # Reloaded from the URL: the box shows the search and the list is narrowed.
    fresh_list(page, lambda: page.reload())
    page.fill("input[name=payload]", f"payload.customer={globex}")
    fresh_list(page, lambda: page.click("form.filters button[type=submit]"))
    fresh_list(page, lambda: page.reload())
    assert page.input_value("input[name=payload]") == f"payload.customer={globex}"
    rows = page.locator("table.tasks tbody tr")
    assert [rows.nth(i).get_attribute("data-task-id") for i in range(rows.count())] == [g1]


def test_a_malformed_search_is_refused_in_place(page: Any, dev: Dev) -> None:
    open_dashboard(page, dev)
    page.wait_for_selector(".results :is(table, .empty)")
    before = page.evaluate("location.hash")
    page.fill("input[name=payload]", "customer=acme")  # no payload. prefix
    page.click("form.filters button[type=submit]")
    message = page.evaluate("document.querySelector('input[name=payload]').validationMessage")
    assert "payload.<field>=<value>" in message
    assert page.evaluate("location.hash") == before
    # A field name the server refuses: its message, naming the field, is shown.
    page.fill("input[name=payload]", "payload.a,b=1")
    page.click("form.filters button[type=submit]")
    page.wait_for_selector("text=payload.a,b")
