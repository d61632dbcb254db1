"""The dashboard's key given in the address, in headless chromium against a real ``conveyor dev``.

- the link ``conveyor dev`` prints (``/ui/#key=<client key>``) opens the dashboard signed in;
  the key leaves the address bar, stays in the browser's storage, and is in no request's URL
  (a fragment is never sent, so no server log holds it);
- a ``#key=`` link opened in a tab already on the login form signs it in too;
- a wrong key in the link shows the login form with the node's refusal, the address cleaned;
- the list the page first renders holds a task enqueued just before (the listing reads its
  writes: no retry needed, unlike a snapshot that trails).
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from dashboard_harness import Dev

pytestmark = pytest.mark.timeout(240)


def printed_link(dev: Dev) -> str:
    """The dashboard link from the banner of ``conveyor dev``."""
    found = re.search(r"^\s*ui\s+(\S+/ui/#key=\S+)", dev.logs(), re.MULTILINE)
    assert found is not None, dev.logs()
    return found.group(1)


def test_the_printed_link_opens_the_dashboard_signed_in(page: Any, dev: Dev) -> None:
    link = printed_link(dev)
    assert link == f"{dev.base}/ui/#key={dev.key}"
    urls: list[str] = []
    page.on("request", lambda request: urls.append(request.url))
    page.goto(link)
    page.wait_for_selector("#tenant:has-text('tenant default')")
    page.wait_for_selector("h1:has-text('Tasks')")
    assert "key=" not in page.url and dev.key not in page.url
    assert page.evaluate("localStorage.getItem('conveyor.apiKey')") == dev.key
    assert urls and not [u for u in urls if dev.key in u], urls
    page.go_back()  # the history entry was replaced: nothing with the key to go back to
    assert dev.key not in page.url


def test_a_key_link_opened_on_the_login_form_signs_in(page: Any, dev: Dev) -> None:
    page.goto(f"{dev.base}/ui/")
    page.wait_for_selector("form.login")
    page.evaluate("key => { location.hash = 'key=' + encodeURIComponent(key); }", dev.key)
    page.wait_for_selector("#tenant:has-text('tenant default')")
    page.wait_for_selector("h1:has-text('Tasks')")
    assert "key=" not in page.url


def test_a_wrong_key_in_the_link_shows_the_refusal(page: Any, dev: Dev) -> None:
    page.goto(f"{dev.base}/ui/#key=cvk_not-a-key-of-this-node")
    page.wait_for_selector("form.login .error")
    assert "key=" not in page.url
    assert page.evaluate("localStorage.getItem('conveyor.apiKey')") is None


def test_the_first_list_shows_a_task_enqueued_just_before(page: Any, dev: Dev) -> None:
    page.goto(printed_link(dev))
    page.wait_for_selector("#tenant:has-text('tenant default')")
    for n in range(3):
        task_id = dev.enqueue("double", {"n": n}, queue=f"fresh-{n}")
        page.evaluate("document.querySelector('main .view')?.setAttribute('data-stale', '')")
        page.goto(f"{dev.base}/ui/#/tasks?queue=fresh-{n}")
        page.wait_for_selector("main .view:not([data-stale]) .results :is(table, .empty)")
        # The first rendering, not a later refresh, holds it.
        assert page.locator(f"tr[data-task-id='{task_id}']").count() == 1, f"round {n}"
