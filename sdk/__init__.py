"""Conveyor: durable background jobs and workflows for Python.

app = conveyor.App("shop")

@app.task(retry=conveyor.Retry(attempts=3), timeout="10m")
def resize(ctx, payload): ...

conveyor.Client(url, api_key).enqueue(resize, {"image": "a.png"}, delay="5m")
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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
    from conveyor import testing

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
    "current_task",
    "set_default_client",
    "testing",
]


def __getattr__(name: str) -> Any:
    # ``conveyor.testing`` composes the whole platform (RocksDB, the log): import it only when
    # a test asks for it, so ``import conveyor`` stays light for producers.
    if name == "testing":
        import importlib

        return importlib.import_module("conveyor.testing")
    raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
