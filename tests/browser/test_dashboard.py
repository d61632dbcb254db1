"""The dashboard in headless chromium against a real ``conveyor dev``.

Each test enqueues its own tasks over the HTTP API (in its own queue, so lists do not mix)
and then works only through the page: typing the key, filtering, clicking through.
The list and queue views read the Postgres snapshot, which trails the processors by the
projection lag: the tests re-apply filters until the rows show up, with a deadline.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable
from typing import Any

import pytest
from dashboard_harness import APP, Dev, http

pytestmark = pytest.mark.timeout(240)

FAST_RETRY = {"attempts_max": 2, "backoff_base_ms": 50, "backoff_cap_ms": 100}
SNAPSHOT_WAIT_S = 20.0
PAGE_SIZE = 50  # views/tasks.js
FILTERS = (
    "task_type", "error_class", "error_text",
    "created_from_ms", "created_to_ms", "finished_from_ms", "finished_to_ms",
)  # fmt: skip


def queue_name() -> str:
    return f"q-{secrets.token_hex(4)}"


def open_dashboard(page: Any, dev: Dev, hash_: str = "") -> None:
    """Load /ui, type the API key into the login form, land on ``hash_`` (or the tasks list)."""
    page.goto(f"{dev.base}/ui{'/' + hash_ if hash_ else ''}")
    page.fill("input[name=api-key]", dev.key)
    page.click("form.login button[type=submit]")
    page.wait_for_selector("#tenant:has-text('tenant default')")


def until(check: Callable[[], bool], what: str, timeout_s: float = SNAPSHOT_WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


FRESH_RESULTS = "main .view:not([data-stale]) .results :is(table, .empty)"


def fresh_list(page: Any, action: Callable[[], None]) -> None:
    """Run ``action`` (a click, a navigation) and wait for the list it renders, never for the
    list that was on the page before (a navigation renders a new view; the old one is marked)."""
    page.evaluate("document.querySelector('main .view')?.setAttribute('data-stale', '')")
    action()
    page.wait_for_selector(FRESH_RESULTS)


def apply_until_row(page: Any, task_id: str) -> Any:
    """Click Apply until the list shows ``task_id`` (the snapshot may trail); its row."""
    row = page.locator(f"tr[data-task-id='{task_id}']")

    def shown() -> bool:
        fresh_list(page, lambda: page.click("form.filters button[type=submit]"))
        return bool(row.count())

    until(shown, f"task {task_id} in the list")
    return row


def test_key_is_asked_once_and_kept(page: Any, dev: Dev) -> None:
    open_dashboard(page, dev)
    page.wait_for_selector("h1:has-text('Tasks')")
    page.reload()
    page.wait_for_selector("h1:has-text('Tasks')")  # no login form the second time
    assert page.evaluate("localStorage.getItem('conveyor.apiKey')") == dev.key
    page.click("#forget-key")
    page.wait_for_selector("form.login")
    assert page.evaluate("localStorage.getItem('conveyor.apiKey')") is None


def test_a_wrong_key_is_refused_with_the_servers_reason(page: Any, dev: Dev) -> None:
    page.goto(f"{dev.base}/ui/")
    page.fill("input[name=api-key]", "cvk_not-a-key")
    page.click("form.login button[type=submit]")
    page.wait_for_selector("form.login .error:has-text('unknown API key')")


def test_failed_task_filter_detail_and_retry(page: Any, dev: Dev) -> None:
    queue = queue_name()
    failed = dev.enqueue("explode", {"order": 17}, queue=queue, retry=FAST_RETRY)
    ok = dev.enqueue("double", {"n": 2}, queue=queue)
    dev.wait_status(failed, "FAILED")
    dev.wait_status(ok, "SUCCEEDED")

    open_dashboard(page, dev)
    page.fill("input[name=queue]", queue)
    page.select_option("select[name=status]", "FAILED")
    row = apply_until_row(page, failed)
    assert "status=FAILED" in page.url and f"queue={queue}" in page.url
    assert page.locator("table.tasks tbody tr").count() == 1  # the SUCCEEDED one is filtered out
    assert "card declined for order 17" in row.inner_text()

    row.locator(f"a:has-text('{failed}')").click()
    page.wait_for_selector(f"#task-id:has-text('{failed}')")
    assert "ValueError" in page.inner_text(".error-card")
    assert "card declined for order 17" in page.inner_text(".error-card pre.stack")
    attempts = page.locator("table.attempts tbody tr")
    assert attempts.count() == 2
    for i in range(2):
        assert "card declined for order 17" in attempts.nth(i).inner_text()
    assert json.loads(page.inner_text(".payload pre")) == {"order": 17}
    api_attempts = dev.call("GET", f"/v1/tasks/{failed}")["attempts"]
    if api_attempts[0].get("log_url"):  # the node keeps captured output: the page shows it
        attempts.nth(0).locator("button.show-log").click()
        page.wait_for_selector("table.attempts pre.log:has-text('charging order 17')")

    page.click("#retry-task")
    page.wait_for_function(
        "id => !location.hash.includes(id) && location.hash.startsWith('#/task/')", arg=failed
    )
    new_id = page.url.rsplit("/", 1)[-1]
    assert re.fullmatch(r"[0-9a-f]{32}", new_id), page.url
    page.wait_for_selector(f"#task-id:has-text('{new_id}')")
    assert "Retried" in page.inner_text("#flash")
    retried = dev.call("GET", f"/v1/tasks/{new_id}")
    assert (retried["task_type"], retried["queue"], retried["payload"]) == (
        "explode",
        queue,
        {"order": 17},
    )
    assert dev.call("GET", f"/v1/tasks/{failed}")["status"] == "FAILED"  # the original stays

    # The new task is listed too, next to the one it replaced.
    page.goto(f"{dev.base}/ui/#/tasks?queue={queue}&task_type=explode")
    apply_until_row(page, new_id)
    assert page.locator(f"tr[data-task-id='{failed}']").count() == 1


def test_each_filter_narrows_the_list(page: Any, dev: Dev) -> None:
    queue = queue_name()
    early = dev.enqueue("explode", {"order": 41}, queue=queue, retry=FAST_RETRY)
    dev.wait_status(early, "FAILED")
    time.sleep(1.1)  # the time filters have second resolution in the form
    boundary_ms = int(time.time() * 1000)
    late = dev.enqueue("explode", {"order": 42}, queue=queue, retry=FAST_RETRY)
    ok = dev.enqueue("double", {"n": 1}, queue=queue)
    dev.wait_status(late, "FAILED")
    dev.wait_status(ok, "SUCCEEDED")

    open_dashboard(page, dev)
    page.fill("input[name=queue]", queue)
    for task_id in (early, late, ok):
        apply_until_row(page, task_id)
    rows = page.locator("table.tasks tbody tr")

    def listed(**fields: str) -> set[str]:
        for name in FILTERS:
            page.fill(f"input[name={name}]", fields.get(name, ""))
        fresh_list(page, lambda: page.click("form.filters button[type=submit]"))
        return {str(rows.nth(i).get_attribute("data-task-id")) for i in range(rows.count())}

    assert listed(task_type="double") == {ok}
    assert listed(error_class="ValueError") == {early, late}
    assert listed(error_class="KeyError") == set()
    assert page.is_visible(".results .empty")
    assert listed(error_text="order 42") == {late}
    local = page.evaluate(
        "ms => new Date(ms - new Date(ms).getTimezoneOffset() * 60000).toISOString().slice(0, 19)",
        boundary_ms,
    )
    assert listed(created_from_ms=local) == {late, ok}
    assert listed(created_to_ms=local) == {early}
    assert listed(finished_to_ms=local) == {early}


def test_pages_forward_and_back(page: Any, dev: Dev) -> None:
    queue = queue_name()
    body = {"task_type": "double", "app": APP, "queue": queue, "delay_ms": 600_000}
    tasks = [{**body, "payload": {"n": n}} for n in range(PAGE_SIZE + 5)]
    ids = [r["task_id"] for r in dev.call("POST", "/v1/tasks:batch", {"tasks": tasks})["results"]]
    open_dashboard(page, dev)
    page.fill("input[name=queue]", queue)
    rows = page.locator("table.tasks tbody tr")

    def all_listed() -> bool:
        fresh_list(page, lambda: page.click("form.filters button[type=submit]"))
        return page.locator(".count").count() == 1 and page.inner_text(".count") == "55 matching"

    until(all_listed, "55 tasks in the snapshot")
    assert rows.count() == PAGE_SIZE
    first_page = [rows.nth(i).get_attribute("data-task-id") for i in range(PAGE_SIZE)]
    page.click("button:has-text('Next page')")
    page.wait_for_function("() => document.querySelectorAll('table.tasks tbody tr').length === 5")
    second_page = [rows.nth(i).get_attribute("data-task-id") for i in range(5)]
    assert sorted(first_page + second_page) == sorted(ids)  # every task once, newest first
    assert page.is_disabled("button:has-text('Next page')")
    page.click("button:has-text('Previous page')")
    page.wait_for_function("() => document.querySelectorAll('table.tasks tbody tr').length === 50")
    assert rows.nth(0).get_attribute("data-task-id") == first_page[0]


def test_cancel_from_the_detail_page(page: Any, dev: Dev) -> None:
    task_id = dev.enqueue("double", {"n": 1}, queue=queue_name(), delay_ms=600_000)
    open_dashboard(page, dev, f"#/task/{task_id}")
    page.wait_for_selector(f"#task-id:has-text('{task_id}')")
    assert page.inner_text(".title-row .badge") == "ENQUEUED"
    assert page.is_disabled("#retry-task")

    page.click("#cancel-task")
    page.wait_for_selector(".title-row .badge:has-text('CANCELED')")
    assert page.is_disabled("#cancel-task")
    assert "CANCELED" in page.inner_text("#flash")
    assert dev.call("GET", f"/v1/tasks/{task_id}")["status"] == "CANCELED"


def test_queues_view_shows_depth_by_state(page: Any, dev: Dev) -> None:
    queue = queue_name()
    for n in range(3):
        dev.enqueue("double", {"n": n}, queue=queue, delay_ms=600_000)
    failed = dev.enqueue("explode", {"order": 1}, queue=queue, retry=FAST_RETRY)
    dev.wait_status(failed, "FAILED")

    open_dashboard(page, dev, "#/queues")
    card = page.locator(f"section.queue[data-queue='{queue}']")

    def counted() -> bool:
        if not card.count() or card.locator(".total").inner_text() != "3":
            page.reload()
            page.wait_for_selector("div.queues")
            return False
        return True

    until(counted, f"queue {queue} with 3 waiting tasks")
    # The depth's own legend (each history chart below has one too, once it has loaded).
    assert "ENQUEUED 3" in card.locator(".depth-legend").inner_text()
    assert card.locator("svg.depth-bar rect").count() == 1  # one state: one segment
    windows = card.locator("table.windows tbody tr")
    assert windows.count() == 3
    # The failed task finished within the last minute: an error rate above zero.
    assert windows.nth(0).locator("td").nth(2).inner_text() != "0.0 %"


def test_dead_letters_bulk_retry_of_selected(page: Any, dev: Dev) -> None:
    queue = queue_name()
    failed = [dev.enqueue("explode", {"order": n}, queue=queue, retry=FAST_RETRY) for n in (1, 2)]
    for task_id in failed:
        dev.wait_status(task_id, "FAILED")

    open_dashboard(page, dev, f"#/dead?queue={queue}")
    for task_id in failed:
        apply_until_row(page, task_id)
    assert page.locator(".results tbody tr").count() == 2
    page.click("button:has-text('Select page')")
    page.click("#retry-selected")
    page.wait_for_selector("#flash:has-text('Retried 2 task(s)')")

    def four_tasks() -> bool:
        status, body = http(dev.base, "GET", f"/v1/tasks?queue={queue}", key=dev.key)
        return status == 200 and len(body["tasks"]) == 4

    until(four_tasks, "two new tasks next to the two failed ones")


def test_dead_letters_retry_all_matching_runs_an_operation(page: Any, dev: Dev) -> None:
    queue = queue_name()
    failed = [
        dev.enqueue("explode", {"order": n}, queue=queue, retry=FAST_RETRY) for n in (1, 2, 3)
    ]
    for task_id in failed:
        dev.wait_status(task_id, "FAILED")

    open_dashboard(page, dev, f"#/dead?queue={queue}")
    for task_id in failed:
        apply_until_row(page, task_id)
    page.click("#retry-matching")
    page.wait_for_selector("#flash:has-text('Bulk retry done: 3 task(s) retried')")

    def six_tasks() -> bool:
        status, body = http(dev.base, "GET", f"/v1/tasks?queue={queue}", key=dev.key)
        return status == 200 and len(body["tasks"]) == 6

    until(six_tasks, "three new tasks next to the three failed ones")


def test_cancel_all_matching_asks_for_confirmation(page: Any, dev: Dev) -> None:
    queue = queue_name()
    waiting = [dev.enqueue("double", {"n": n}, queue=queue, delay_ms=600_000) for n in (1, 2)]
    open_dashboard(page, dev)
    assert page.is_disabled("#cancel-matching")  # no filter: never "cancel everything"
    page.fill("input[name=queue]", queue)
    for task_id in waiting:
        apply_until_row(page, task_id)

    page.click("#cancel-matching")
    page.wait_for_selector("#cancel-matching:has-text('Confirm')")
    assert [dev.call("GET", f"/v1/tasks/{t}")["status"] for t in waiting] == ["ENQUEUED"] * 2
    page.click("#cancel-matching")
    page.wait_for_selector("#flash:has-text('Bulk cancel done: 2 task(s) canceled')")
    for task_id in waiting:
        dev.wait_status(task_id, "CANCELED")


def test_markup_in_task_data_is_shown_as_text(page: Any, dev: Dev) -> None:
    evil = "<img src=x onerror=window.__pwned=1><script>window.__pwned=2</script>"
    task_id = dev.enqueue("explode", {"order": evil}, queue=queue_name(), retry=FAST_RETRY)
    dev.wait_status(task_id, "FAILED")
    open_dashboard(page, dev, f"#/task/{task_id}")
    page.wait_for_selector(f"#task-id:has-text('{task_id}')")
    assert evil in page.inner_text(".error-card .error-line")
    assert evil in page.inner_text(".payload pre")
    assert page.locator("main img, main script").count() == 0
    assert page.evaluate("window.__pwned") is None


def test_hidden_payloads_show_the_marker(page: Any, dev: Dev) -> None:
    # A second tenant whose payloads are hidden; the node re-reads keys.json within a second.
    path = dev.home / "keys.json"
    doc = json.loads(path.read_text())
    key = "test-key-private-0123456789"
    doc["keys"][key] = {"tenant": "private"}
    doc["tenants"] = {"private": {"show_payloads": False}}
    path.write_text(json.dumps(doc))
    register = {"agent_id": "setup", "app": APP, "version": "1", "task_types": ["double"]}
    until(lambda: http(dev.base, "POST", "/worker/register", register, key=key)[0] == 200, "key")
    body = {"task_type": "double", "app": APP, "payload": {"ssn": "078-05-1120"}}
    status, reply = http(dev.base, "POST", "/v1/tasks", body, key=key)
    assert status == 201, reply
    task_id = reply["task_id"]

    page.goto(f"{dev.base}/ui/#/task/{task_id}")
    page.fill("input[name=api-key]", key)
    page.click("form.login button[type=submit]")
    page.wait_for_selector(".payload .hidden-payload")
    assert "078-05-1120" not in page.inner_text("main")
    assert "hidden" in page.inner_text(".payload").lower()


def test_workflow_view_without_the_endpoint_says_so(page: Any, dev: Dev) -> None:
    # An older node: its OpenAPI document lists no workflow paths.
    page.route("**/openapi.json", lambda route: route.fulfill(json={"paths": {}}))
    open_dashboard(page, dev, f"#/workflow/{'0' * 32}")
    page.wait_for_selector(".missing-endpoint:has-text('no workflow endpoint')")
    assert page.locator(".missing-endpoint a").get_attribute("href") == f"#/task/{'0' * 32}"


def test_workflow_view_shows_steps_and_children(page: Any, dev: Dev) -> None:
    # The children wait ten minutes: the workflow stays WAITING with its steps in view.
    body = {"task_type": "checkout", "app": APP, "payload": {"n": 7, "hold_s": 600}}
    workflow_id = str(dev.call("POST", "/v1/workflows", {**body, "queue": queue_name()})["task_id"])
    dev.wait_status(workflow_id, "WAITING")

    open_dashboard(page, dev, f"#/task/{workflow_id}")
    page.click("a.workflow-link")
    page.wait_for_selector(f"#workflow-id:has-text('{workflow_id}')")
    steps = page.locator("table.steps tbody tr")
    assert [steps.nth(i).get_attribute("data-step") for i in range(steps.count())] == [
        "price#0",
        "fan#0",
    ]
    assert "COMMITTED" in steps.nth(0).inner_text() and "WAITING" in steps.nth(1).inner_text()
    steps.nth(0).locator("summary").click()
    assert steps.nth(0).locator("pre").inner_text() == "70"
    graph = page.locator("svg.graph")
    assert graph.locator("g.node.child.st-enqueued").count() == 3
    assert "waiting for children" in page.inner_text("section.parallel")

    graph.locator("a").first.click()  # a child: its own task page
    page.wait_for_selector(".title-row .badge:has-text('ENQUEUED')")
    assert page.inner_text("#task-id") != workflow_id
    dev.call("POST", f"/v1/tasks/{workflow_id}/cancel")  # cascades to the children


def test_finished_workflow_keeps_its_parallel_steps(page: Any, dev: Dev) -> None:
    body = {"task_type": "checkout", "app": APP, "payload": {"n": 7}, "queue": queue_name()}
    workflow_id = str(dev.call("POST", "/v1/workflows", body)["task_id"])
    assert dev.wait_status(workflow_id, "SUCCEEDED")["result"] == {
        "price": 70,
        "doubled": [{"twice": 0}, {"twice": 2}, {"twice": 4}],
    }
    open_dashboard(page, dev, f"#/workflow/{workflow_id}")
    page.wait_for_selector(f"#workflow-id:has-text('{workflow_id}')")
    assert page.locator("svg.graph g.node.child.st-succeeded").count() == 3
    fan = page.inner_text("section.parallel")
    assert "3 children" in fan and "fan-in done" in fan
    assert page.is_visible("p.dropped")  # the memos of a finished task are gone, and it says so


def test_schedules_view_lists_the_tenants_schedules(page: Any, dev: Dev) -> None:
    body = {"schedule_id": "nightly-ui", "cron": "30 2 * * *", "timezone": "Europe/Paris"}
    body["task"] = {"task_type": "double", "app": APP, "payload": {"n": 1}}
    dev.call("POST", "/v1/schedules", body)
    open_dashboard(page, dev, "#/schedules")
    row = page.locator("tr[data-schedule-id='nightly-ui']")
    row.wait_for()
    text = row.inner_text()
    assert "30 2 * * *" in text and "Europe/Paris" in text and "double" in text

    row.locator("button.toggle:has-text('Pause')").click()
    row.locator(".state:has-text('PAUSED')").wait_for()
    assert dev.call("GET", "/v1/schedules/nightly-ui")["paused"] is True
    row.locator("button.toggle:has-text('Resume')").click()
    row.locator("button.toggle:has-text('Pause')").wait_for()
    assert dev.call("GET", "/v1/schedules/nightly-ui")["paused"] is False
