"""The dashboard's workflow, schedule and re-run pages in headless chromium, against a real
``conveyor dev``: a workflow waiting for an event shows the event and takes one from its page,
the workflows list filters and searches, schedules are created, run now and deleted, and a
finished task is re-run from its page. Each test sets up over the HTTP API and then works only
through the page.
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import pytest
from dashboard_harness import APP, Dev, http
from test_dashboard import fresh_list, open_dashboard, queue_name, until

pytestmark = pytest.mark.timeout(240)


def start_approval(dev: Dev, order: int) -> str:
    """An ``approval`` workflow, once it waits for its event."""
    body = {"task_type": "approval", "app": APP, "payload": {"order": order}}
    workflow_id = str(dev.call("POST", "/v1/workflows", {**body, "queue": queue_name()})["task_id"])
    dev.wait_status(workflow_id, "WAITING")
    return workflow_id


def test_waiting_workflow_shows_its_event_and_takes_one_from_the_page(page: Any, dev: Dev) -> None:
    workflow_id = start_approval(dev, 41)
    read = dev.call("GET", f"/v1/workflows/{workflow_id}")
    wait = read["workflow"]["waiting_for_event"]
    assert wait["name"] == "approved" and wait["step"] == "event:approved#0", wait
    assert wait["deadline_ms"] > read["workflow"]["created_ms"] + 3_000_000  # timeout="1h"
    assert "event 'approved'" in read["workflow"]["waiting_for"]
    assert {"identity": "event:approved#0", "kind": "event", "state": "WAITING"}.items() <= next(
        s for s in read["steps"] if s["kind"] == "event"
    ).items()
    task = dev.call("GET", f"/v1/tasks/{workflow_id}")  # the task read says it too
    assert task["waiting_for_event"] == wait, task

    open_dashboard(page, dev, f"#/workflow/{workflow_id}")
    page.wait_for_selector("#waiting-for:has-text(\"event 'approved'\")")
    page.wait_for_selector(".waiting-event:has-text('approved')")
    assert page.input_value("input[name=event-name]") == "approved"  # filled in for it
    page.fill("textarea[name=event-payload]", "not json")
    page.click("form.send-event button[type=submit]")
    page.wait_for_selector(".flash.error:has-text('not JSON')")
    assert dev.call("GET", f"/v1/tasks/{workflow_id}")["status"] == "WAITING"  # nothing sent
    page.fill("textarea[name=event-payload]", '{"by": "ops"}')
    page.click("form.send-event button[type=submit]")
    page.wait_for_selector(".flash.ok:has-text('Event approved sent')")
    done = dev.wait_status(workflow_id, "SUCCEEDED")
    assert done["result"] == {"order": 41, "decision": {"by": "ops"}}, done
    page.wait_for_selector(".title-row .badge:has-text('SUCCEEDED')")
    assert page.locator("form.send-event").count() == 0  # a finished workflow takes none


def test_workflows_list_filters_by_state_and_searches_by_id_and_type(page: Any, dev: Dev) -> None:
    waiting = start_approval(dev, 1)
    body = {"task_type": "checkout", "app": APP, "payload": {"n": 2}, "queue": queue_name()}
    finished = str(dev.call("POST", "/v1/workflows", body)["task_id"])
    dev.wait_status(finished, "SUCCEEDED")
    plain = dev.enqueue("double", {"n": 1})  # no steps: not a workflow
    dev.wait_status(plain, "SUCCEEDED")

    open_dashboard(page, dev, "#/workflows?status=WAITING")
    row = page.locator(f"tr[data-workflow-id='{waiting}']")

    def listed(search: str = "") -> bool:
        page.fill("input[name=search]", search)
        fresh_list(page, lambda: page.click("form.filters button[type=submit]"))
        return bool(row.count())

    until(listed, f"workflow {waiting} in the list")
    assert "WAITING" in row.inner_text() and "approval" in row.inner_text()
    assert page.locator(f"tr[data-workflow-id='{finished}']").count() == 0  # not WAITING
    assert listed(waiting[:12])  # an id prefix
    assert page.locator("tbody tr").count() == 1
    assert listed("approval")  # a type
    assert not listed("checkout")  # a type with no WAITING workflow
    page.select_option("select[name=status]", "")
    until(
        lambda: (
            listed("checkout")
            or (True and bool(page.locator(f"tr[data-workflow-id='{finished}']").count()))
        ),
        f"workflow {finished}",
    )
    listed_ids = page.locator("tr[data-workflow-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.workflowId)"
    )
    assert plain not in listed_ids and waiting not in listed_ids, listed_ids
    page.fill("input[name=search]", waiting)  # a whole id opens it
    page.click("form.filters button[type=submit]")
    page.wait_for_selector(f"#workflow-id:has-text('{waiting}')")
    dev.call("POST", f"/v1/tasks/{waiting}/cancel")


def test_workflows_api_filters_by_created_range_and_refuses_bad_filters(dev: Dev) -> None:
    workflow_id = start_approval(dev, 3)
    created = dev.call("GET", f"/v1/tasks/{workflow_id}")["created_ms"]
    prefix = f"/v1/workflows?id_prefix={workflow_id}"
    inside = dev.call("GET", f"{prefix}&created_from_ms={created}&created_to_ms={created + 1}")
    assert [w["task_id"] for w in inside["workflows"]] == [workflow_id], inside
    assert inside["may_trail"] is False and inside["workflows"][0]["steps_committed"] >= 1
    after = dev.call("GET", f"{prefix}&created_from_ms={created + 1}")
    assert after["workflows"] == [] and after["next_cursor"] is None, after
    for query, field in (("id_prefix=xyz", "id_prefix"), ("queue=q", "queue")):
        status, reply = http(dev.base, "GET", f"/v1/workflows?{query}", key=dev.key)
        assert status == 400 and reply["error"]["field"] == field, (query, reply)
    dev.call("POST", f"/v1/tasks/{workflow_id}/cancel")


def test_schedule_is_created_run_now_and_deleted_from_the_page(page: Any, dev: Dev) -> None:
    schedule_id = f"ui-{secrets.token_hex(3)}"
    open_dashboard(page, dev, "#/schedules")
    page.click("details.create-schedule summary")
    page.fill("input[name=schedule_id]", schedule_id)
    page.fill("input[name=cron]", "0 4 * * *")
    page.fill("input[name=app]", APP)
    page.fill("input[name=task_type]", "no-such-type")
    page.fill("textarea[name=payload]", '{"n": 21}')
    page.click("details.create-schedule button[type=submit]")
    page.wait_for_selector(".flash.error:has-text('no-such-type')")  # refused, nothing stored
    page.fill("input[name=task_type]", "double")
    page.click("details.create-schedule button[type=submit]")
    row = page.locator(f"tr[data-schedule-id='{schedule_id}']")
    row.wait_for()
    stored = dev.call("GET", f"/v1/schedules/{schedule_id}")
    assert stored["task"]["payload"] == {"n": 21} and stored["next_fire_ms"], stored

    row.locator("button.run-now").click()
    page.wait_for_selector(".flash.ok:has-text('ran now')")
    task_id = page.locator(".flash.ok a").inner_text()
    assert dev.wait_status(task_id, "SUCCEEDED")["result"] == {"twice": 42}
    after = dev.call("GET", f"/v1/schedules/{schedule_id}")
    assert after["next_fire_ms"] == stored["next_fire_ms"] and after["fired"] == 0, after

    page.once("dialog", lambda dialog: dialog.accept())
    row.locator("button.delete").click()
    row.wait_for(state="detached")
    assert http(dev.base, "GET", f"/v1/schedules/{schedule_id}", key=dev.key)[0] == 404


def test_schedule_run_with_the_same_key_runs_once(dev: Dev) -> None:
    schedule_id = f"api-{secrets.token_hex(3)}"
    template = {"task_type": "double", "app": APP, "payload": {"n": 5}}
    dev.call(
        "POST", "/v1/schedules", {"schedule_id": schedule_id, "cron": "0 4 * * *", "task": template}
    )
    path = f"/v1/schedules/{schedule_id}/run"
    first = dev.call("POST", path, {"idempotency_key": "click-1"})
    again = dev.call("POST", path, {"idempotency_key": "click-1"})
    other = dev.call("POST", path, {"idempotency_key": "click-2"})
    assert first["created"] and not again["created"] and other["created"]
    assert first["task_id"] == again["task_id"] != other["task_id"]
    assert dev.wait_status(first["task_id"], "SUCCEEDED")["result"] == {"twice": 10}


def test_finished_task_is_rerun_from_its_page(page: Any, dev: Dev) -> None:
    queue = queue_name()
    task_id = dev.enqueue("double", {"n": 8}, queue=queue, priority=3)
    dev.wait_status(task_id, "SUCCEEDED")
    open_dashboard(page, dev, f"#/task/{task_id}")
    page.wait_for_selector("#rerun-task:not([disabled])")
    page.click("#rerun-task")
    page.wait_for_selector(f"#task-id:not(:has-text('{task_id}'))")
    new_id = page.inner_text("#task-id")
    again = dev.wait_status(new_id, "SUCCEEDED")
    assert (again["queue"], again["priority"], again["payload"]) == (queue, 3, {"n": 8})
    assert again["result"] == {"twice": 16}
    assert dev.call("GET", f"/v1/tasks/{task_id}")["status"] == "SUCCEEDED"  # left as it was

    running = start_approval(dev, 2)  # not finished: no re-run
    page.goto(f"{dev.base}/ui/#/task/{running}")  # signed in already
    page.wait_for_selector("#rerun-task[disabled]")
    status, reply = http(dev.base, "POST", f"/v1/tasks/{running}/rerun", {}, key=dev.key)
    assert status == 409 and "WAITING" in reply["error"]["message"], reply
    dev.call("POST", f"/v1/tasks/{running}/cancel")
    canceled = dev.wait_status(running, "CANCELED")
    rerun = dev.call("POST", f"/v1/tasks/{running}/rerun", {"idempotency_key": "k"})
    assert rerun["created"] and dev.call(
        "POST", f"/v1/tasks/{running}/rerun", {"idempotency_key": "k"}
    ) == {**rerun, "created": False}
    assert canceled["status"] == "CANCELED"
    deadline = time.monotonic() + 30
    while dev.call("GET", f"/v1/tasks/{rerun['new_task_id']}")["status"] != "WAITING":
        assert time.monotonic() < deadline, "the re-run workflow never reached its wait"
        time.sleep(0.1)
    dev.call("POST", f"/v1/tasks/{rerun['new_task_id']}/cancel")


def test_workflow_page_draws_its_steps_and_children_on_a_time_axis(page: Any, dev: Dev) -> None:
    body = {"task_type": "checkout", "app": APP, "payload": {"n": 3}, "queue": queue_name()}
    workflow_id = str(dev.call("POST", "/v1/workflows", body)["task_id"])
    dev.wait_status(workflow_id, "SUCCEEDED")

    def timed() -> bool:  # the times come from the snapshot, which may trail
        steps = dev.call("GET", f"/v1/workflows/{workflow_id}")["steps"]
        return all(s["started_ms"] and s["ended_ms"] for s in steps)

    until(timed, "the step times in the snapshot")
    read = dev.call("GET", f"/v1/workflows/{workflow_id}")
    run = next(s for s in read["steps"] if s["kind"] == "run")
    fan = next(s for s in read["steps"] if s["kind"] == "parallel")
    assert read["workflow"]["created_ms"] <= run["started_ms"] <= run["ended_ms"], run
    assert run["ended_ms"] <= fan["started_ms"] <= fan["ended_ms"], (run, fan)
    children = read["parallel"][0]["children"]
    assert len(children) == 3
    for child in children:
        assert child["created_ms"] <= child["started_ms"] <= child["finished_ms"], child
        assert fan["started_ms"] <= child["created_ms"] and child["finished_ms"] <= fan["ended_ms"]

    open_dashboard(page, dev, f"#/workflow/{workflow_id}")
    bars = page.locator("svg.waterfall g.bar")
    bars.first.wait_for()
    keys = bars.evaluate_all("gs => gs.map(g => g.dataset.bar)")
    assert keys == [run["identity"], fan["identity"], *(c["task_id"] for c in children)], keys
    # Bars start where their times say: the fan-out starts after the run step began.
    x = {
        key: float(page.locator(f"g[data-bar='{key}'] rect").get_attribute("x") or "nan")
        for key in keys
    }
    assert x[run["identity"]] <= x[fan["identity"]] <= min(x[c["task_id"]] for c in children)
    assert page.locator("svg.waterfall g.open").count() == 0  # everything ended


def test_task_page_and_list_follow_the_events_stream(page: Any, dev: Dev) -> None:
    streams: list[Any] = []
    page.on("request", lambda r: streams.append(r) if "/v1/events" in r.url else None)
    queue = queue_name()
    task_id = dev.enqueue("double", {"n": 5}, queue=queue, delay_ms=2_500)
    open_dashboard(page, dev, f"#/task/{task_id}")
    page.wait_for_selector(".title-row .badge:has-text('ENQUEUED')")
    # The page never polls the task: only an event of it can repaint it.
    page.wait_for_selector(".title-row .badge:has-text('SUCCEEDED')", timeout=30_000)
    assert page.locator(".card.result pre").inner_text().replace(" ", "").find('"twice":10') >= 0
    assert streams, "the page opened no events stream"
    for request in streams:  # the key travels in the header, never in the URL
        assert request.headers.get("authorization") == f"Bearer {dev.key}"
        assert dev.key not in request.url and "text/event-stream" in request.headers["accept"]

    page.goto(f"{dev.base}/ui/#/tasks?queue={queue}")
    page.locator(f"tr[data-task-id='{task_id}']").wait_for()
    later = dev.enqueue("double", {"n": 6}, queue=queue)  # no click: the list follows events
    page.locator(f"tr[data-task-id='{later}']").wait_for(timeout=30_000)
    page.locator(f"tr[data-task-id='{later}'] .badge:has-text('SUCCEEDED')").wait_for(
        timeout=30_000
    )
