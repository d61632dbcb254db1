"""Task-aware logs, as text or as one JSON object a line.

Every record logged while a handler runs carries the attempt's ``task_id``, ``attempt`` and
``task_type``: ``ctx.logger`` sets them, and ``TaskFields`` fills them in for any
other logger (a library's, ``logging.getLogger(__name__)``) from ``conveyor.current_task``,
which follows each thread and each asyncio task, so concurrent attempts in one guest keep
their own. The text format ends such a line with ``[task_type task_id attempt N]``; the JSON
format (``conveyor agent --log-json``, ``conveyor dev --log-json``, or ``CONVEYOR_LOG_JSON=1``)
writes each record as one object with those fields as keys, for a log pipeline to index.
Guests log as their agent does: the agent passes ``--log-json`` on to them.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import IO, Any

LOG_JSON_ENV = "CONVEYOR_LOG_JSON"
TASK_FIELDS = ("task_id", "attempt", "task_type")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_TRUE = frozenset({"1", "true", "yes", "on"})


def json_wanted(flag: bool = False) -> bool:
    """``flag``, or ``CONVEYOR_LOG_JSON`` set to 1/true/yes/on."""
    return flag or os.environ.get(LOG_JSON_ENV, "").strip().lower() in _TRUE


class TaskFields(logging.Filter):
    """Give a record logged while a handler runs the attempt's fields (unless it has them)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from conveyor.context import _current  # the running handler's Context, if any

        ctx = _current.get()
        if ctx is not None and not hasattr(record, "task_id"):
            record.task_id = ctx.task_id
            record.attempt = ctx.attempt
            record.task_type = ctx.task_type
        return True


class TextFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        task_id = getattr(record, "task_id", None)
        if task_id is None:
            return line
        head, sep, tail = line.partition("\n")  # after the message, before a traceback
        where = f" [{getattr(record, 'task_type', '?')} {task_id} attempt "
        return f"{head}{where}{getattr(record, 'attempt', '?')}]{sep}{tail}"


class JsonFormatter(logging.Formatter):
    """One JSON object a line: ``ts`` (UTC, ISO 8601 with milliseconds), ``level``, ``logger``,
    ``message``, the task fields when the record has them, and ``exc`` (the traceback)."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        entry: dict[str, Any] = {
            "ts": f"{stamp}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in TASK_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = record.stack_info
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure(level: str | int, *, as_json: bool, stream: IO[str] | None = None) -> None:
    """Log to ``stream`` (stderr) at ``level``, as JSON or text, with the task fields; the
    root logger's earlier handlers are replaced."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter())
    handler.addFilter(TaskFields())
    logging.basicConfig(
        level=level.upper() if isinstance(level, str) else level, handlers=[handler], force=True
    )
