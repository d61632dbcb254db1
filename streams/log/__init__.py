"""The partitioned, fenced, append-only log."""

from conveyor.streams.log.api import Log, LogCorruption, LogRecord, LogSealed

__all__ = ["Log", "LogCorruption", "LogRecord", "LogSealed"]
