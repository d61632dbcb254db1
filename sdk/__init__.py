"""Conveyor: durable background jobs and workflows for Python.

app = conveyor.App("shop")

@app.task(retry=conveyor.Retry(attempts=3), timeout="10m")
def resize(ctx, payload): ...

conveyor.Client(url, api_key).enqueue(resize, {"image": "a.png"}, delay="5m")
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from conveyor import codecs
    from conveyor import testing as testing  # an attribute, not in __all__
    from conveyor.aclient import AsyncClient, AsyncTaskHandle
    from conveyor.app import App, Retry, TaskOptions, TaskType
    from conveyor.client import Client, TaskHandle, set_default_client
    from conveyor.context import Cancelled, Context, current_task
    from conveyor.durations import Duration
    from conveyor.errors import (
        Conflict,
        ContractError,
        ConveyorError,
        FatalError,
        FencedError,
        Forbidden,
        NotFound,
        RateLimited,
        RetryableError,
        TaskFailed,
        TransientError,
        Unauthorized,
    )
    from conveyor.signals import CompensationFailed
    from conveyor.wire import Enqueue, ErrorInfo, TaskInfo, TaskPage
    from conveyor.workflows import ChildError, ChildFailed, EventTimeout, WorkflowRefused

__all__ = [
    "App",
    "AsyncClient",
    "AsyncTaskHandle",
    "Cancelled",
    "ChildError",
    "ChildFailed",
    "Client",
    "CompensationFailed",
    "Conflict",
    "Context",
    "ContractError",
    "ConveyorError",
    "Duration",
    "Enqueue",
    "ErrorInfo",
    "EventTimeout",
    "FatalError",
    "FencedError",
    "Forbidden",
    "NotFound",
    "RateLimited",
    "Retry",
    "RetryableError",
    "TaskFailed",
    "TaskHandle",
    "TaskInfo",
    "TaskOptions",
    "TaskPage",
    "TaskType",
    "TransientError",
    "Unauthorized",
    "WorkflowRefused",
    "codecs",
    "current_task",
    "set_default_client",
]  # not ``testing``: ``from conveyor import *`` must not load the node (the server extra)

# Every name is imported on first use (PEP 562), so that ``import conveyor`` imports nothing
# but this file. The package is shared: the node's state machine imports its leaf modules
# (``conveyor.errors``, ``conveyor.frozen``, ``conveyor.durations``, ``conveyor.schemas``),
# which must not load the SDK (the App, the task context, the codecs) with them; a guest process
# (it imports the app, hence ``conveyor``) never uses the clients and their HTTP libraries; and
# ``conveyor.testing`` composes the whole platform (RocksDB, the log), the server extra.
# tests/unit/test_import_boundaries.py checks what each side imports.
_LAZY: dict[str, tuple[str, str | None]] = {
    "App": ("conveyor.app", "App"),
    "Retry": ("conveyor.app", "Retry"),
    "TaskOptions": ("conveyor.app", "TaskOptions"),
    "TaskType": ("conveyor.app", "TaskType"),
    "Cancelled": ("conveyor.context", "Cancelled"),
    "Context": ("conveyor.context", "Context"),
    "current_task": ("conveyor.context", "current_task"),
    "Duration": ("conveyor.durations", "Duration"),
    "Conflict": ("conveyor.errors", "Conflict"),
    "ContractError": ("conveyor.errors", "ContractError"),
    "ConveyorError": ("conveyor.errors", "ConveyorError"),
    "FatalError": ("conveyor.errors", "FatalError"),
    "FencedError": ("conveyor.errors", "FencedError"),
    "Forbidden": ("conveyor.errors", "Forbidden"),
    "NotFound": ("conveyor.errors", "NotFound"),
    "RateLimited": ("conveyor.errors", "RateLimited"),
    "RetryableError": ("conveyor.errors", "RetryableError"),
    "TaskFailed": ("conveyor.errors", "TaskFailed"),
    "TransientError": ("conveyor.errors", "TransientError"),
    "Unauthorized": ("conveyor.errors", "Unauthorized"),
    "CompensationFailed": ("conveyor.signals", "CompensationFailed"),
    "Enqueue": ("conveyor.wire", "Enqueue"),
    "ErrorInfo": ("conveyor.wire", "ErrorInfo"),
    "TaskInfo": ("conveyor.wire", "TaskInfo"),
    "TaskPage": ("conveyor.wire", "TaskPage"),
    "ChildError": ("conveyor.workflows", "ChildError"),
    "ChildFailed": ("conveyor.workflows", "ChildFailed"),
    "EventTimeout": ("conveyor.workflows", "EventTimeout"),
    "WorkflowRefused": ("conveyor.workflows", "WorkflowRefused"),
    "AsyncClient": ("conveyor.aclient", "AsyncClient"),
    "AsyncTaskHandle": ("conveyor.aclient", "AsyncTaskHandle"),
    "Client": ("conveyor.client", "Client"),
    "TaskHandle": ("conveyor.client", "TaskHandle"),
    "set_default_client": ("conveyor.client", "set_default_client"),
    "codecs": ("conveyor.codecs", None),
    "testing": ("conveyor.testing", None),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    value = module if attr is None else getattr(module, attr)
    globals()[name] = value  # found once: later uses are a plain attribute
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
