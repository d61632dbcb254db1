"""Fixtures for the dashboard tests: a real ``conveyor dev`` and Debian's headless chromium.

Rules:
- chromium comes from Debian (``apt-get install chromium chromium-driver``), never from
  ``playwright install`` (no downloads here). Without it the tests skip with the reason, except
  under ``CI=true``, where a missing browser is a failure: CI must not go green untested.
- A failing test leaves a screenshot of its page in ``.build/test-artifacts/``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_harness import Dev, free_port, wait_ready

CHROMIUM = Path(os.environ.get("CONVEYOR_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = ["--no-sandbox", "--disable-background-networking"]
ARTIFACTS = Path(__file__).resolve().parents[2] / ".build" / "test-artifacts"
HERE = Path(__file__).resolve().parent


def _unavailable(reason: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the browser tests need chromium under CI: {reason}")
    pytest.skip(f"{reason} (install it: apt-get install -y chromium chromium-driver)")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    report = yield
    item.stash.setdefault(_REPORTS, {})[report.when] = report
    return report


_REPORTS = pytest.StashKey[dict[str, pytest.TestReport]]()


@pytest.fixture(scope="module")
def dev() -> Iterator[Dev]:
    # Not under pytest's basetemp: every pytest run resets /tmp/pytest-of-<user> to 0700, which
    # locks out the PostgreSQL that pgserver runs as its own user when we run as root.
    root = Path(tempfile.mkdtemp(prefix="conveyor-dashboard-"))
    home = root / "home"
    port = free_port()
    cmd = [sys.executable, "-m", "conveyor.cli", "dev", "--app", "dashboard_app:app"]
    cmd += ["--home", str(home), "--port", str(port), "--partitions", "2", "--concurrency", "2"]
    with open(root / "dev.out", "wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=HERE)
    node = Dev(base=f"http://127.0.0.1:{port}", key="", home=home, proc=proc)
    try:
        wait_ready(node)
        yield node
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if ARTIFACTS.exists():  # a test failed and left a screenshot: keep the node's output too
            shutil.copy(root / "dev.out", ARTIFACTS / "dashboard-dev.out")
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Module scope, not session: playwright's sync API keeps an event loop running in this
    # thread while it is started, and every later test calling asyncio.run() would fail.
    if not CHROMIUM.exists():
        _unavailable(f"chromium not found at {CHROMIUM}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as exc:  # a dev dependency: its absence is a broken setup, not a skip
        pytest.fail(f"playwright is not installed ({exc}); run .venv/bin/pip install -e '.[dev]'")
    with sync_playwright() as pw:
        launched = pw.chromium.launch(
            executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS
        )
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A fresh page (its own localStorage). Uncaught script errors and CSP violations fail the
    test; a failed test leaves ``.build/test-artifacts/<test>.png``."""
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    context.set_default_timeout(15_000)
    tab = context.new_page()
    problems: list[str] = []
    tab.on("pageerror", lambda exc: problems.append(f"page error: {exc}"))
    tab.on(
        "console",
        lambda msg: (
            problems.append(f"console: {msg.text}")
            if "Content Security Policy" in msg.text
            else None
        ),
    )
    try:
        yield tab
        assert not problems, problems
    finally:
        reports = request.node.stash.get(_REPORTS, {})
        if any(r.failed for r in reports.values()) or problems:
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.nodeid.split("::")[-1])
            tab.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
        context.close()
