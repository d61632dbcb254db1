"""``Context``: what a handler knows about its attempt and how it talks back.

The context never holds a lease id or a credential. Its ``Channel`` forwards heartbeats and
checkpoints to whoever runs the handler: the guest stub (over the guest socket to the host
agent) or the in-process executor of ``conveyor.testing``. Both methods are non-blocking, so
sync and async handlers can call them alike.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Protocol

from conveyor.codecs import PayloadCodec, decode_value, encode_value
from conveyor.durations import Duration
from conveyor.errors import ContractError
from conveyor.steps import StepAck, StepContext

CHECKPOINT_BYTES_MAX = 64 * 1024


class Channel(Protocol):
    def heartbeat(self, progress: Any) -> None: ...

    def checkpoint(self, value: Any) -> None: ...

    def step(self, op: str, identity: str, position: int, value: Any) -> StepAck:
        """Record a step claim or commit under the attempt's lease; blocks until durable."""
        ...


class Cancelled(BaseException):
    """Raised by ``ctx.raise_if_cancelled()``. A BaseException so ``except Exception`` in user
    code cannot swallow it."""


class Context:
    """The handler's view of one attempt."""

    def __init__(
        self,
        *,
        task_id: str,
        task_type: str,
        attempt: int,
        checkpoint: Any,
        channel: Channel,
        steps: list[dict[str, Any]] | None = None,
        started_ms: int = 0,
        run_key: str | None = None,
        compensating: bool = False,
        cancel: threading.Event | None = None,
        codec: PayloadCodec | None = None,
    ) -> None:
        self.task_id = task_id
        self.task_type = task_type
        self.attempt = attempt
        # As the node holds it (encoded, with a codec); decoded when the handler reads it.
        self._checkpoint = checkpoint
        self._checkpoint_decoded = codec is None
        self._channel = channel
        self.codec = codec
        # Set by the runtime; a guest passes its own flag, which reads the agent's frames.
        self._cancel = cancel if cancel is not None else threading.Event()
        self.step = StepContext(
            task_id=task_id,
            run_key=run_key or task_id,
            started_ms=started_ms,
            recorded=steps or [],
            channel=channel,
            compensating=compensating,
            codec=codec,
        )
        # Its records carry the attempt's task id, attempt and task type (``conveyor.logs``).
        self.logger = logging.LoggerAdapter(
            logging.getLogger(f"conveyor.task.{task_type}"),
            {"task_id": task_id, "attempt": attempt, "task_type": task_type},
        )

    def version(self, name: str) -> bool:
        """Whether this task takes the new branch of a deliberate control-flow change
        (``StepContext.version`` has the rules)."""
        return self.step.version(name)

    def parallel(self, name: str, children: Iterable[Any], mode: str = "collect") -> list[Any]:
        """Fan out to child tasks and return their results in order: ``mode="collect"``
        returns a ``conveyor.ChildError`` in place of a child that did not succeed,
        ``mode="fail_fast"`` raises ``conveyor.ChildFailed`` at the first one and cancels the
        rest. The attempt ends while the children run (see ``conveyor.workflows``)."""
        return self.step.parallel(name, children, mode=mode)

    def wait_for_event(self, name: str, timeout: Duration | None = None) -> Any:
        """The payload of event ``name`` sent to this workflow (``client.send_event``); one
        sent before the wait is kept for it. Ends the attempt while it waits; raises
        ``conveyor.EventTimeout`` after ``timeout`` (see ``conveyor.workflows``)."""
        return self.step.wait_for_event(name, timeout=timeout)

    @property
    def cancelled(self) -> bool:
        """True once the platform asked this attempt to stop (a cancel or a timeout); a cancel
        gets here within about a second of its request. Finish cleanly and return soon: what
        the handler returns then is kept with the CANCELED task (say, how far it got); after
        the task's cancel grace the process is killed."""
        return self._cancel.is_set()

    def raise_if_cancelled(self) -> None:
        """Raise ``Cancelled`` (a BaseException) once a cancel has come; a no-op before."""
        if self._cancel.is_set():
            raise Cancelled(f"task {self.task_id} attempt {self.attempt} was cancelled")

    def wait_cancelled(self, timeout: float | None = None) -> bool:
        """Block up to ``timeout`` seconds for a cancel; True if it came. For sync handlers that
        sleep between units of work: ``if ctx.wait_cancelled(5): return``."""
        return self._cancel.wait(timeout)

    @property
    def last_checkpoint(self) -> Any:
        """The newest checkpoint of this task: from this attempt, or else the one a previous
        attempt saved (None if there was none)."""
        if not self._checkpoint_decoded:
            self._checkpoint = decode_value(self.codec, self._checkpoint)
            self._checkpoint_decoded = True
        return self._checkpoint

    def heartbeat(self, progress: Any = None) -> None:
        """Say the attempt is alive (the agent heartbeats leases on its own; this carries
        progress and is cheap)."""
        self._channel.heartbeat(progress)

    def checkpoint(self, value: Any) -> None:
        """Save ``value`` (JSON) with the task; the next attempt finds it in
        ``last_checkpoint``. Saved before the attempt's outcome is reported; with a codec,
        encoded, and the cap applies to what is stored."""
        try:
            stored = encode_value(self.codec, value)
            size = len(json.dumps(stored, separators=(",", ":"), allow_nan=False).encode())
        except (TypeError, ValueError) as exc:
            raise ContractError(f"a checkpoint must be JSON-serializable: {exc}") from exc
        if size > CHECKPOINT_BYTES_MAX:
            raise ContractError(
                f"a checkpoint is at most {CHECKPOINT_BYTES_MAX} bytes of JSON, got {size}; "
                "store big state elsewhere and checkpoint a reference to it"
            )
        self._checkpoint = value
        self._checkpoint_decoded = True
        self._channel.checkpoint(stored)

    def request_cancel(self) -> None:
        """Called by the runtime (never by handlers) when the agent learns CANCEL."""
        self._cancel.set()


_current: ContextVar[Context | None] = ContextVar("conveyor_current_task", default=None)


@contextmanager
def running(ctx: Context) -> Iterator[Context]:
    """Make ``ctx`` what ``conveyor.current_task`` answers while a handler runs (the
    runtime's job; a contextvar, so each thread and asyncio task sees its own)."""
    token = _current.set(ctx)
    try:
        yield ctx
    finally:
        _current.reset(token)


class CurrentTask:
    """``conveyor.current_task``: the running handler's ``Context``, from anywhere in its call
    stack (``conveyor.current_task.step.run(...)``) without passing ``ctx`` down."""

    def get(self) -> Context:
        ctx = _current.get()
        if ctx is None:
            raise ContractError("conveyor.current_task is only set while a task handler runs")
        return ctx

    def __getattr__(self, name: str) -> Any:
        return getattr(self.get(), name)

    def __repr__(self) -> str:
        ctx = _current.get()
        return "<current_task: none>" if ctx is None else f"<current_task {ctx.task_id}>"


current_task = CurrentTask()
