"""Keep secrets out of the logs of the long-running commands (node, dev, agent).

A log line may quote what a client sent or what a library put in an exception: a header, a
URL, a dict of request options. ``RedactSecrets`` rewrites every record before it is written,
its message, its traceback and its stack alike, so that none of these is ever written out:

- the value of an ``Authorization`` header or field (``Authorization: Bearer <key>``);
- the token after ``Bearer`` wherever it appears;
- an API key in the form the node mints (``cvk_`` and what follows).

It sits on every handler of the root logger (so it sees the records of every logger that
propagates, ``conveyor.*`` and ``aiohttp.*`` included) and on the loggers named in
``GUARDED_LOGGERS`` themselves, in case one of them is given a handler of its own.
"""

from __future__ import annotations

import logging
import re

REDACTED = "[redacted]"
GUARDED_LOGGERS = ("conveyor", "aiohttp.server", "aiohttp.access", "aiohttp.web")
_SECRET = re.compile(
    r"(?P<header>\bauthorization['\"]?\s*[:=,]\s*['\"]?)[^'\"\r\n]+"
    r"|(?P<bearer>\bbearer[\s:=]+)[^\s'\"]+"
    r"|\bcvk_[A-Za-z0-9_\-]+",
    re.IGNORECASE,
)
_FORMATTER = logging.Formatter()


def _replace(match: re.Match[str]) -> str:
    prefix = match.group("header") or match.group("bearer") or "cvk_"
    return prefix + REDACTED


def redact(text: str) -> str:
    """``text`` with every secret the module names replaced by ``[redacted]``."""
    return _SECRET.sub(_replace, text)


class RedactSecrets(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = _FORMATTER.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def guard(root: logging.Logger | None = None) -> None:
    """Put one ``RedactSecrets`` on the root logger's handlers and on ``GUARDED_LOGGERS``."""
    secrets_filter = RedactSecrets()
    for handler in (root or logging.getLogger()).handlers:
        handler.addFilter(secrets_filter)
    for name in GUARDED_LOGGERS:
        logging.getLogger(name).addFilter(secrets_filter)
