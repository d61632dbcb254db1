"""The log filter of the long-running commands: no API key or Authorization value is written."""

from __future__ import annotations

import io
import logging

import pytest

from conveyor.cli.redact import RedactSecrets, redact

KEY = "cvk_Q7rVx2NwLk9ZpT4mHs8YdC1f"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"b'Authorization: Bearer {KEY}\\x00'", "b'Authorization: [redacted]'"),
        ("{'Authorization': 'Basic dXNlcjpwYXNz'}", "{'Authorization': '[redacted]'}"),
        ("got: b'Bearer opsToken-4f9a1c77...'", "got: b'Bearer [redacted]'"),
        (f"GET /v1/tasks?k={KEY} HTTP/1.1", "GET /v1/tasks?k=cvk_[redacted] HTTP/1.1"),
        ("tenant alpha enqueued 3 tasks", "tenant alpha enqueued 3 tasks"),
    ],
)
def test_redact_replaces_each_kind_of_secret(text: str, expected: str) -> None:
    assert redact(text) == expected


def test_a_record_is_written_without_the_key_in_its_message_or_traceback() -> None:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.addFilter(RedactSecrets())
    logger = logging.getLogger("test_redact")
    logger.addHandler(handler)
    logger.propagate = False
    try:
        try:
            raise ValueError(f"bad header b'Authorization: Bearer {KEY}'")
        except ValueError:
            logger.exception("request with %s failed", f"Bearer {KEY}")
        logger.warning("key %s", KEY, stack_info=True)
    finally:
        logger.removeHandler(handler)
    written = out.getvalue()
    assert "ValueError" in written and "request with Bearer [redacted] failed" in written
    assert KEY.removeprefix("cvk_")[:8] not in written, written
