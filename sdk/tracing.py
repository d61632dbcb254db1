"""OpenTelemetry: an enqueue's trace context travels with its task; each attempt is a child span.

Only with ``opentelemetry-api`` installed (``pip install 'conveyor[otel]'``), imported lazily
and looked for once; without it nothing changes: no field is sent, no span is made.

1. ``client.enqueue`` (sync, async, each item of a batch) sends the W3C trace context of the
   span current at the call as the body's ``trace_context`` (``traceparent``, and
   ``tracestate`` if any; baggage is not sent); nothing when no valid span is current. The
   node keeps it with the task (``TaskSpec.trace_context``) and hands it to every lease.
2. A guest runs each attempt in a span named after the task type, a child of that context (a
   root span when the task has none), of kind CONSUMER, with the attributes
   ``conveyor.task_id``, ``conveyor.attempt``, ``conveyor.task_type``, ``conveyor.app`` and,
   at its end, ``conveyor.outcome``; its status is ERROR when the attempt FAILED or is FATAL.
   The span is current while the handler runs (each concurrent attempt's in its own
   coroutine), so the handler's own spans nest in it. Spans go where the app's OpenTelemetry
   SDK sends them: set it up in the app's module, which every guest imports.
3. Best effort: a context that does not parse starts a root span; tracing never fails an
   enqueue or an attempt.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

TRACER = "conveyor"
FAILED = frozenset({"FAILED", "FATAL"})


@functools.cache
def _otel() -> Any:
    """The OpenTelemetry API's modules, or None without it (a failed import is not cached by
    Python: each try would search the path again)."""
    try:
        from opentelemetry import context, trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
    except ImportError:
        return None
    return SimpleNamespace(
        context=context,
        trace=trace,
        w3c=TraceContextTextMapPropagator(),
    )


def current_context() -> dict[str, str] | None:
    """The W3C trace context of the current span, for an enqueue body (rule 1)."""
    otel = _otel()
    if otel is None or not otel.trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, str] = {}
    otel.w3c.inject(carrier)
    return carrier if "traceparent" in carrier else None


def attempt_span(
    task_type: str, *, task_id: str, attempt: int, app: str, carrier: Any, provider: Any = None
) -> contextlib.AbstractContextManager[Any]:
    """The attempt's span (rule 2), current inside; None without OpenTelemetry. ``provider``:
    the TracerProvider to make it with (the global one by default). While no provider is set
    up in this process (nothing would record the span) no span is made: the enqueue's
    context, if any, is made current instead, so what the handler calls still propagates it;
    without one either, nothing is done (a no-op costs a guest little per attempt)."""
    otel = _otel()
    if otel is None:
        return _NOTHING
    parent = None
    if isinstance(carrier, dict):
        with contextlib.suppress(Exception):  # rule 3
            parent = otel.w3c.extract(carrier)
    if provider is None and _unset(otel):
        return _NOTHING if parent is None else _current(otel, parent)
    attributes = {
        "conveyor.task_id": task_id,
        "conveyor.attempt": attempt,
        "conveyor.task_type": task_type,
        "conveyor.app": app,
    }
    tracer = _tracer() if provider is None else provider.get_tracer(TRACER)
    return tracer.start_as_current_span(  # type: ignore[no-any-return]
        task_type,
        context=parent if parent is not None else otel.context.Context(),
        kind=otel.trace.SpanKind.CONSUMER,
        attributes=attributes,
        record_exception=False,  # the attempt's outcome says how it ended (``ended``)
        set_status_on_exception=False,
    )


_NOTHING: contextlib.nullcontext[None] = contextlib.nullcontext()


def _unset(otel: Any) -> bool:
    """No tracer provider was set up in this process: the API's global is still unset (read
    directly: ``get_tracer_provider`` looks at the environment on every call)."""
    return getattr(otel.trace, "_TRACER_PROVIDER", False) is None


@contextlib.contextmanager
def _current(otel: Any, parent: Any) -> Iterator[None]:
    token = otel.context.attach(parent)
    try:
        yield None
    finally:
        otel.context.detach(token)


@functools.cache
def _tracer() -> Any:
    """The global provider's tracer, made once (it follows the provider set later)."""
    return _otel().trace.get_tracer(TRACER)


def ended(span: Any, outcome: str, error_class: str | None, error_message: str | None) -> None:
    """Put the attempt's outcome on its span (rule 2)."""
    if span is None:
        return
    span.set_attribute("conveyor.outcome", outcome)
    if outcome in FAILED:
        status = _otel().trace.Status(
            _otel().trace.StatusCode.ERROR, f"{error_class}: {error_message}"
        )
        span.set_status(status)
