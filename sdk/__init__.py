"""Conveyor: durable background jobs and workflows for Python."""

from conveyor.errors import (
    ContractError,
    ConveyorError,
    FatalError,
    RetryableError,
    TaskFailed,
)

__all__ = [
    "ContractError",
    "ConveyorError",
    "FatalError",
    "RetryableError",
    "TaskFailed",
]
