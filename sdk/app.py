"""``App`` and the ``@app.task`` decorator: task types, their default options, their handlers.

A decorated function stays callable directly (unit tests of user code need no Conveyor) and
gains ``.name``, ``.options`` and ``.enqueue(payload, **opts)``. Options are validated when the
decorator runs, so a bad duration fails at import time.
"""

from __future__ import annotations

import dataclasses
import inspect
import sys
from collections.abc import Awaitable, Callable
from dataclasses import field
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, Protocol, TypeVar, overload

from conveyor import typed
from conveyor.durations import Duration, to_ms, to_ms_or_none
from conveyor.errors import ContractError
from conveyor.frozen import frozen
from conveyor.schemas import limits
from conveyor.schemas.resume import RESUME_POLICIES

if TYPE_CHECKING:
    from conveyor.client import TaskHandle
    from conveyor.codecs import PayloadCodec
    from conveyor.context import Context

P = ParamSpec("P")
R = TypeVar("R")

PRIORITY_MAX = 9
CONCURRENCY_MAX = 1000  # attempts of one async task type side by side in one guest


@frozen
class Retry:
    """Retry policy: exponential backoff with full jitter, capped; some errors never retry.

    ``non_retryable`` takes exception classes (a raised subclass counts too) or class names.
    """

    attempts: int = 5
    base: Duration = 1
    factor: float = 2.0
    cap: Duration = "1h"
    non_retryable: tuple[type[BaseException] | str, ...] = ()

    def __post_init__(self) -> None:
        if isinstance(self.attempts, bool) or not isinstance(self.attempts, int):
            raise ContractError("retry.attempts must be an int", field="retry.attempts")
        if self.attempts < 1:
            raise ContractError("retry.attempts must be >= 1", field="retry.attempts")
        if self.factor < 1:
            raise ContractError("retry.factor must be >= 1", field="retry.factor")
        to_ms(self.base, field="retry.base")
        to_ms(self.cap, field="retry.cap")

    def class_names(self) -> list[str]:
        """The ``non_retryable`` classes by name, as the platform matches them."""
        return [c if isinstance(c, str) else c.__name__ for c in self.non_retryable]

    def matches(self, exc: BaseException) -> bool:
        """Whether ``exc`` is one of the non-retryable errors (by class or by name)."""
        names = {type(exc).__name__}
        names.update(c.__name__ for c in type(exc).__mro__)
        for entry in self.non_retryable:
            if isinstance(entry, str):
                if entry in names:
                    return True
            elif isinstance(exc, entry):
                return True
        return False

    def to_wire(self) -> dict[str, Any]:
        """The policy as an enqueue body carries it (milliseconds)."""
        return {
            "attempts_max": self.attempts,
            "backoff_base_ms": to_ms(self.base, field="retry.base"),
            "backoff_factor": float(self.factor),
            "backoff_cap_ms": to_ms(self.cap, field="retry.cap"),
            "non_retryable": self.class_names(),
        }


@frozen(kw_only=True)
class TaskOptions:
    """A task type's defaults; every enqueue may override them."""

    queue: str = "default"
    priority: int = 0
    retry: Retry = field(default_factory=Retry)
    start_to_close_ms: int | None = None
    schedule_to_start_ms: int | None = None
    schedule_to_close_ms: int | None = None
    cancel_grace_ms: int = 30_000
    resume: str = "latest"  # workflows only: "latest" | "pinned" (``App.workflow``)
    concurrency: int = 1  # async handlers: attempts one guest runs at once (``App.task``)

    def timeouts(self) -> dict[str, int | None]:
        """The timeouts an enqueue body carries, in milliseconds (None: no limit)."""
        return {
            "schedule_to_start_ms": self.schedule_to_start_ms,
            "start_to_close_ms": self.start_to_close_ms,
            "schedule_to_close_ms": self.schedule_to_close_ms,
        }


class TaskType(Generic[P, R]):
    """A registered handler. Call it like the function; ``enqueue`` it to run it durably."""

    def __init__(self, app: App, fn: Callable[P, R], name: str, options: TaskOptions) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.options = options
        self.binding = typed.bind(fn, name)  # how it takes ctx and payload (``typed.py``)
        self.takes_context = self.binding.context
        self.is_workflow = False  # registered with ``@app.workflow``
        self.is_async = inspect.iscoroutinefunction(fn)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<TaskType {self.app.name}.{self.name}>"

    def invoke(self, ctx: Context, payload: Any) -> Any:
        """Run the handler on ``payload`` decoded as its signature asks (``typed.py``); its
        result encoded as a JSON value (an awaitable of it, for an async handler)."""
        value = self.binding.call(ctx, payload)
        if inspect.isawaitable(value):
            return self._encoded(value)
        return self.binding.encode_result(value)

    async def _encoded(self, value: Awaitable[Any]) -> Any:
        return self.binding.encode_result(await value)

    def encode_payload(self, payload: Any) -> Any:
        """``payload`` as the JSON value an enqueue sends (``typed.py`` rule 4)."""
        if self.binding.style == "arguments" and isinstance(payload, tuple):
            payload = list(payload)
        return typed.encode(payload)

    def decode_result(self, value: Any) -> Any:
        """A SUCCEEDED task's JSON result as the handler's return annotation says."""
        return self.binding.decode_result(value)

    def enqueue(self, payload: Any = None, **opts: Any) -> TaskHandle[Any]:
        """Enqueue through the default client (``conveyor.set_default_client``)."""
        from conveyor.client import default_client

        handle: TaskHandle[Any] = default_client().enqueue(self, payload, **opts)
        return handle


class Register(Protocol):
    """What ``@app.task(...)`` returns: a decorator that keeps the handler's signature."""

    def __call__(self, fn: Callable[P, R], /) -> TaskType[P, R]: ...


class App:
    """A named set of task types; agents register and run one App (one version at a time)."""

    def __init__(
        self, name: str, *, version: str = "dev", codec: PayloadCodec | None = None
    ) -> None:
        _check_name(name, "app")
        self.name = name
        self.version = version
        # Applied by the guest to what its handlers take and give (``conveyor.codecs``).
        self.codec = codec
        self.tasks: dict[str, TaskType[Any, Any]] = {}
        # Where the App was created: lets agents find a "module:attr" for guest processes.
        self.module: str = sys._getframe(1).f_globals.get("__name__", "__main__")

    def __repr__(self) -> str:
        return f"<App {self.name} {self.version} tasks={sorted(self.tasks)}>"

    @overload
    def task(self, fn: Callable[P, R], /) -> TaskType[P, R]: ...

    @overload
    def task(
        self,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        schedule_to_start: Duration | None = None,
        schedule_to_close: Duration | None = None,
        cancel_grace: Duration = "30s",
        concurrency: int = 1,
    ) -> Register: ...

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        /,
        *,
        name: str | None = None,
        queue: str = "default",
        priority: int = 0,
        retry: Retry | None = None,
        timeout: Duration | None = None,
        schedule_to_start: Duration | None = None,
        schedule_to_close: Duration | None = None,
        cancel_grace: Duration = "30s",
        concurrency: int = 1,
    ) -> Any:
        """Register a handler, sync or async: ``def f(ctx, payload)``, ``def f(payload)``,
        ``def f(ctx)`` or Celery-style arguments ``def f(x: int, y: int)``; annotations type
        the payload and the result (the rules are in ``conveyor.typed``).

        ``timeout`` is start_to_close: the limit of one attempt.

        ``concurrency`` (async handlers only): how many attempts of this type one guest runs
        at once, side by side on its event loop, so I/O-bound work scales without more
        processes. Each attempt still holds its own lease and one of the agent's slots
        (``conveyor agent --concurrency`` counts attempts, not processes): raise both. Such
        attempts share the guest's CPU, memory and log (each attempt's log range covers the
        guest's output while it ran), and the agent's ``--cpu-s`` budget does not apply to
        them. A cancel reaches the one attempt's ``ctx.cancelled``; a kill (the cancel grace
        ran out, the lease was lost) cancels its coroutine at the await it is stopped at. One
        that still holds the loop ``ABORT_GRACE_S`` later (``conveyor.agents.pool``) gets its
        guest killed, and the attempts beside it fail as ``GuestCrashed`` and are retried per
        their policy.
        """
        options = TaskOptions(
            queue=_check_name(queue, "queue"),
            priority=check_priority(priority),
            retry=retry if retry is not None else Retry(),
            start_to_close_ms=to_ms_or_none(timeout, field="timeout"),
            schedule_to_start_ms=to_ms_or_none(schedule_to_start, field="schedule_to_start"),
            schedule_to_close_ms=to_ms_or_none(schedule_to_close, field="schedule_to_close"),
            cancel_grace_ms=to_ms(cancel_grace, field="cancel_grace"),
            concurrency=check_concurrency(concurrency),
        )

        def register(f: Callable[..., Any]) -> TaskType[Any, Any]:
            task_name = _check_name(name or f.__name__, "task name")
            if options.concurrency > 1 and not inspect.iscoroutinefunction(f):
                raise ContractError(
                    f"task {task_name!r}: concurrency={options.concurrency} runs attempts side "
                    "by side on one event loop, which only an async def handler can share; "
                    "make it async, or leave concurrency at 1 and raise the agent's "
                    "--concurrency to run more processes",
                    field="concurrency",
                )
            if task_name in self.tasks:
                raise ContractError(f"app {self.name!r} already has a task {task_name!r}")
            task: TaskType[Any, Any] = TaskType(self, f, task_name, options)
            self.tasks[task_name] = task
            return task

        return register(fn) if fn is not None else register

    @overload
    def workflow(self, fn: Callable[P, R], /) -> TaskType[P, R]: ...

    @overload
    def workflow(self, /, **options: Any) -> Register: ...

    def workflow(
        self, fn: Callable[..., Any] | None = None, /, *, resume: str = "latest", **options: Any
    ) -> Any:
        """Register a workflow: a task whose body orchestrates durable steps, sleeps and
        ``ctx.parallel`` fan-outs. It takes the options of ``task`` and runs like a task;
        ``POST /v1/workflows`` enqueues only task types registered this way.

        ``resume`` says where the attempts after the first run (after a sleep, a fan-in, an
        event or a retry). A workflow records the app version of the agent its first attempt
        was dealt to (``App(version=...)``; ``GET /v1/workflows/{id}`` shows it):

        - ``"latest"`` (default): on any agent of the app, whatever version it serves. The
          positional step check guards a new version against a changed step sequence.
        - ``"pinned"``: only on agents serving the recorded version. With none running, the
          workflow waits ENQUEUED (the API's ``waiting_for`` says for what) until one polls;
          it never moves to another version. Keep agents of a version up while pinned
          workflows of it are in flight. A dead-letter retry is a new task: it records the
          version it first runs on.
        """
        if resume not in RESUME_POLICIES:
            raise ContractError(
                f"@app.workflow(resume=...) must be one of {', '.join(map(repr, RESUME_POLICIES))}"
                f", got {resume!r}",
                field="resume",
            )

        def register(f: Callable[..., Any]) -> TaskType[Any, Any]:
            task: TaskType[Any, Any] = self.task(**options)(f)
            task.options = dataclasses.replace(task.options, resume=resume)
            task.is_workflow = True
            return task

        return register(fn) if fn is not None else register


def check_priority(priority: int) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ContractError("priority must be an int 0..9", field="priority")
    if not 0 <= priority <= PRIORITY_MAX:
        raise ContractError(f"priority must be 0..{PRIORITY_MAX}, got {priority}", field="priority")
    return priority


def check_concurrency(concurrency: int) -> int:
    if isinstance(concurrency, bool) or not isinstance(concurrency, int):
        raise ContractError(f"concurrency must be an int 1..{CONCURRENCY_MAX}", field="concurrency")
    if not 1 <= concurrency <= CONCURRENCY_MAX:
        raise ContractError(
            f"concurrency must be 1..{CONCURRENCY_MAX}, got {concurrency}", field="concurrency"
        )
    return concurrency


def _check_name(name: str, what: str) -> str:
    """``name`` if the gateway will take it (``conveyor.schemas.limits``), else the error it
    would answer, raised now: at import time, not at the first enqueue."""
    fault = limits.name_fault(name)
    if fault is not None:
        hint = " (pass name=... to name the task otherwise)" if what == "task name" else ""
        raise ContractError(f"{what} {fault}{hint}", field=what.partition(" ")[0])
    return name
