"""Conveyor: durable background jobs and workflows for Python.

app = conveyor.App("shop")

@app.task(retry=conveyor.Retry(attempts=3), timeout="10m")
def resize(ctx, payload): ...

conveyor.Client(url, api_key).enqueue(resize, {"image": "a.png"}, delay="5m")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from conveyor.app import App, Retry, TaskOptions, TaskType
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

if TYPE_CHECKING:
    from conveyor import codecs, testing
    from conveyor.aclient import AsyncClient, AsyncTaskHandle
    from conveyor.client import Client, TaskHandle, set_default_client

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
    "testing",
]


# Imported on first use, so that ``import conveyor`` stays light: ``conveyor.testing`` composes
# the whole platform (RocksDB, the log), and the clients their HTTP libraries, which a guest
# process (it imports the app, hence ``conveyor``) never uses: they were most of its start-up.
_LAZY = {
    "testing": ("conveyor.testing", None),
    "codecs": ("conveyor.codecs", None),
    "AsyncClient": ("conveyor.aclient", "AsyncClient"),
    "AsyncTaskHandle": ("conveyor.aclient", "AsyncTaskHandle"),
    "Client": ("conveyor.client", "Client"),
    "TaskHandle": ("conveyor.client", "TaskHandle"),
    "set_default_client": ("conveyor.client", "set_default_client"),
}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
    import importlib

    module_name, attr = _LAZY[name]
    module = importlib.import_module(module_name)
    return module if attr is None else getattr(module, attr)
