"""Encoded payloads on the dashboard, in headless Chromium against a real ``conveyor dev`` and a
real ``conveyor codec-server``: without a codec endpoint the task page shows the envelope as
``encoded (conveyor/v1, ...)`` and never the plaintext; with the endpoint set (kept in
localStorage) it shows the payload decoded; an endpoint off this machine is refused by the
form; a stopped endpoint is reported, not hidden."""

from __future__ import annotations

import hashlib
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dashboard_harness import Dev, free_port
from test_dashboard import open_dashboard

from conveyor.codecs import Chain, Compression, Encryption, Keys, encode_value

pytestmark = pytest.mark.timeout(180)

HERE = Path(__file__).resolve().parent
# The user's codec: the codec server below imports this module for it (--codec).
CODEC = Chain(
    Compression(threshold_bytes=64),
    Encryption(
        Keys({"dash-1": hashlib.sha256(b"dashboard codec test").digest()}, current="dash-1")
    ),
)
SECRET = "card-4111-dashboard"
START_S = 30.0


@pytest.fixture(scope="module")
def codec_server(dev: Dev, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    out_path = tmp_path_factory.mktemp("codec-server") / "out"
    cmd = [sys.executable, "-m", "conveyor.cli", "codec-server", "--codec"]
    cmd += ["test_dashboard_codec:CODEC", "--port", str(port), "--allow-origin", dev.base]
    with open(out_path, "wb") as out:
        proc = subprocess.Popen(cmd, cwd=HERE, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_S
        while True:
            assert proc.poll() is None, out_path.read_text()
            try:
                with urllib.request.urlopen(f"{base}/healthz", timeout=2) as reply:
                    if reply.status == 200:
                        break
            except OSError:
                assert time.monotonic() < deadline, out_path.read_text()
                time.sleep(0.05)
        yield base
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def encoded_task(dev: Dev) -> str:
    """A task whose payload went through the user's codec; delayed, so no agent takes it."""
    payload = encode_value(CODEC, {"n": 4, "card": SECRET, "note": "x" * 100})
    return dev.enqueue("double", payload, delay_ms=3_600_000)


def payload_text(page: Any) -> str:
    return str(page.inner_text(".card.payload"))


def test_an_encoded_payload_shows_encoded_until_a_codec_endpoint_decodes_it(
    page: Any, dev: Dev, codec_server: str
) -> None:
    task_id = encoded_task(dev)
    open_dashboard(page, dev, f"#/task/{task_id}")
    page.wait_for_selector(".card.payload .notice.encoded")
    assert "encoded (conveyor/v1, zlib+aes-gcm)" in payload_text(page)
    assert SECRET not in page.content()
    # An endpoint off this machine is refused by the form (the page may not call it anyway).
    page.fill("#codec-endpoint", "http://codec.example.com:7410")
    page.click("#codec-save")
    page.wait_for_selector(".codec-note .error")
    assert "only call a codec endpoint on this machine" in page.inner_text(".codec-note")
    assert page.evaluate("localStorage.getItem('conveyor.codecEndpoint')") is None
    # The user's endpoint: the payload shows decoded.
    page.fill("#codec-endpoint", codec_server)
    page.click("#codec-save")
    page.wait_for_selector(".card.payload .notice.decoded")
    assert SECRET in payload_text(page) and '"n": 4' in payload_text(page)
    assert "stored encoded (conveyor/v1, zlib+aes-gcm)" in payload_text(page)
    # Kept in localStorage: a reload decodes again without asking.
    page.reload()
    page.wait_for_selector(".card.payload .notice.decoded")
    assert SECRET in payload_text(page)
    # A plain task's payload is untouched and no codec setting is offered for it.
    plain_id = dev.enqueue("double", {"n": 2}, delay_ms=3_600_000)
    page.goto(f"{dev.base}/ui/#/task/{plain_id}")
    page.wait_for_selector(f"#task-id:has-text('{plain_id}')")
    assert '"n": 2' in payload_text(page) and page.query_selector(".codec-settings") is None


def test_envelopes_inside_a_value_are_shown_in_place_and_decoded_together(
    page: Any, dev: Dev, codec_server: str
) -> None:
    """A value holding envelopes (a parallel step's results, an object of encoded parts)."""
    parts = [encode_value(CODEC, {"card": SECRET}), encode_value(CODEC, "second-part")]
    task_id = dev.enqueue("double", {"parts": parts, "plain": 7}, delay_ms=3_600_000)
    open_dashboard(page, dev, f"#/task/{task_id}")
    page.wait_for_selector(".card.payload .notice.encoded")
    text = payload_text(page)
    assert '"plain": 7' in text and text.count('"encoded (conveyor/v1, aes-gcm)"') == 2
    assert SECRET not in page.content()
    page.fill("#codec-endpoint", codec_server)
    page.click("#codec-save")
    page.wait_for_selector(".card.payload .notice.decoded")
    text = payload_text(page)
    assert SECRET in text and "second-part" in text and '"plain": 7' in text


def test_an_endpoint_that_does_not_answer_is_reported(page: Any, dev: Dev) -> None:
    task_id = encoded_task(dev)
    open_dashboard(page, dev, f"#/task/{task_id}")
    page.wait_for_selector(".card.payload .notice.encoded")
    page.fill("#codec-endpoint", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    page.click("#codec-save")
    page.wait_for_selector(".card.payload .codec-error")
    assert "did not answer" in payload_text(page)
    assert "encoded (conveyor/v1, zlib+aes-gcm)" in payload_text(page)
    assert SECRET not in page.content()
