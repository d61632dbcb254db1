"""The error tree shared by the SDK and the platform. A leaf module: it imports nothing of ours.

ConveyorError
├── ContractError   the caller's fault; never retried; HTTP 4xx
├── FencedError     a newer epoch or lease exists; stop and drop
├── TransientError  retryable, carries retry_after_ms
└── InvariantError  a guard on state failed: a bug; the partition that hit it stops

User code raises RetryableError or FatalError to steer the retry policy.
"""

from __future__ import annotations

from typing import Any


class ConveyorError(Exception):
    """Base of every error Conveyor raises. ``code`` is stable and documented."""

    code = "conveyor_error"
    http_status = 500

    def to_json(self) -> dict[str, Any]:
        """The error as the API sends it: ``{"error": {"code", "message"}}``."""
        return {"error": {"code": self.code, "message": str(self)}}


class ContractError(ConveyorError):
    """The caller sent something invalid. Retrying the same request cannot succeed."""

    code = "invalid_request"
    http_status = 400

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

    def to_json(self) -> dict[str, Any]:
        """``ConveyorError.to_json`` with the field at fault, when there is one."""
        body = super().to_json()
        if self.field is not None:
            body["error"]["field"] = self.field
        return body


class NotFound(ContractError):
    """The named task, schedule, webhook or workflow does not exist (for this tenant)."""

    code = "not_found"
    http_status = 404


class Unauthorized(ContractError):
    """The request carried no API key, or one the node does not know."""

    code = "unauthorized"
    http_status = 401


class Forbidden(ContractError):
    """The key is valid but may not do this (a client key on the worker protocol, an agent key
    on the client API or on another app): another key can, the same one never will."""

    code = "forbidden"
    http_status = 403


class Conflict(ContractError):
    """The request contradicts the current state (the task still runs, the id is taken)."""

    code = "conflict"
    http_status = 409


class FencedError(ConveyorError):
    """A newer epoch or lease exists. The holder must stop and drop its work."""

    code = "fenced"
    http_status = 409


class NotLeader(FencedError):
    code = "not_leader"
    http_status = 503


class LeaseLost(FencedError):
    code = "lease_lost"


class TransientError(ConveyorError):
    """Retry later; ``retry_after_ms`` says when."""

    code = "unavailable"
    http_status = 503

    def __init__(self, message: str, *, retry_after_ms: int = 100) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class RateLimited(TransientError):
    """The tenant is over its enqueue rate (429): nothing was written; send it again after
    ``retry_after_ms``. The clients do, on their own."""

    code = "rate_limited"
    http_status = 429


class InvariantError(ConveyorError):
    """A guard on state failed: the platform has a bug, and the state it guards must not be
    written on. Raised by explicit checks, never ``assert``, so that ``python -O`` keeps them;
    the partition that raises it halts (nothing after the record is applied), the rest go on."""

    code = "internal_error"
    http_status = 500


# --- raised by user code --------------------------------------------------------------------


class RetryableError(Exception):
    """Raise from a handler to ask for a retry (the default for any exception)."""

    def __init__(self, message: str = "", *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class FatalError(Exception):
    """Raise from a handler to fail the task at once, without retries (a bad payload, a 4xx)."""


class TaskFailed(ConveyorError):
    """``handle.result()`` of a task that ended FAILED, CANCELED or EXPIRED."""

    code = "task_failed"

    def __init__(
        self, task_id: str, state: str, error_class: str | None, message: str | None
    ) -> None:
        super().__init__(f"task {task_id} ended {state}: {error_class or ''}: {message or ''}")
        self.task_id = task_id
        self.state = state
        self.error_class = error_class
        self.error_message = message
