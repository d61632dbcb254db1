"""An app whose guests record their OpenTelemetry spans in memory (``tracing_app:app``): the
tracing tests read them back with the ``finished_spans`` task, run in the same guest."""

from __future__ import annotations

import asyncio
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import conveyor

# What an app does to export its spans: set up the SDK in its module (every guest imports it).
exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
tracer = trace.get_tracer("tracing-tests")

app = conveyor.App("tracing-tests")


@app.task
def charge(ctx: conveyor.Context, payload: str) -> str:
    with tracer.start_as_current_span("charge the card"):  # nests in the attempt's span
        return payload


@app.task(retry=conveyor.Retry(attempts=1))
def refuse(ctx: conveyor.Context, payload: str) -> None:
    raise conveyor.FatalError(f"refused {payload}")


@app.task(concurrency=4)
async def fetch(ctx: conveyor.Context, payload: str) -> str:
    for _ in range(3):  # the attempts interleave: each keeps its own span current
        with tracer.start_as_current_span(f"fetch {payload}"):
            await asyncio.sleep(0.05)
    return payload


@app.task(concurrency=4)
async def finished_spans(ctx: conveyor.Context) -> list[dict[str, Any]]:
    """The spans this guest ended so far."""
    spans = []
    for span in exporter.get_finished_spans():
        context, parent = span.get_span_context(), span.parent
        spans.append(
            {
                "name": span.name,
                "trace_id": f"{context.trace_id:032x}",
                "span_id": f"{context.span_id:016x}",
                "parent_id": None if parent is None else f"{parent.span_id:016x}",
                "kind": span.kind.name,
                "status": span.status.status_code.name,
                "attributes": dict(span.attributes or {}),
            }
        )
    return spans
