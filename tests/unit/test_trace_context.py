"""``conveyor.tracing``: the W3C context of the current span goes into an enqueue body, the
gateway keeps a well-formed one and refuses a malformed one by field, and an attempt's span is
a child of the context it is given (a root span without one), ERROR when the attempt failed."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import conveyor
from conveyor import tracing
from conveyor.errors import ContractError
from conveyor.streams.gateway.validation import parse_task, to_spec
from conveyor.wire import Enqueue, enqueue_body

app = conveyor.App("tracing-unit")


@app.task
def noop(payload: Any) -> None:
    return None


@pytest.fixture
def provider() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def test_an_enqueue_body_carries_the_current_span_and_nothing_without_one(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    assert "trace_context" not in enqueue_body(Enqueue(noop, 1), None)
    with provider[0].get_tracer("t").start_as_current_span("request") as span:
        body = enqueue_body(Enqueue(noop, 1), None)
    c = span.get_span_context()
    parent = f"00-{c.trace_id:032x}-{c.span_id:016x}-{c.trace_flags:02x}"
    assert body["trace_context"] == {"traceparent": parent}


def test_the_gateway_keeps_a_trace_context_and_refuses_a_malformed_one() -> None:
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    body = {"task_type": "noop", "app": "a", "payload": 1}
    req = parse_task({**body, "trace_context": {"traceparent": parent, "tracestate": "k=v"}})
    spec = to_spec(req, task_id="0" * 32, tenant="t", payload=req.payload, now_ms=0)
    assert json.loads(spec.trace_context or "") == {"traceparent": parent, "tracestate": "k=v"}
    assert (
        to_spec(
            parse_task(body), task_id="0" * 32, tenant="t", payload=b"1", now_ms=0
        ).trace_context
        is None
    )
    for bad, field in (
        ({"traceparent": "not one"}, "trace_context.traceparent"),
        ({"tracestate": "k=v"}, "trace_context.traceparent"),
        ({"traceparent": parent, "x": "y" * 4096}, "trace_context"),  # too long
    ):
        with pytest.raises(ContractError) as caught:
            parse_task({**body, "trace_context": bad})
        assert (caught.value.field or "").startswith(field), caught.value
    with pytest.raises(ContractError) as caught:
        parse_task({**body, "trace_context": "00-aa"})
    assert (caught.value.field or "").startswith("trace_context")


def test_an_attempt_span_is_a_child_of_its_context_and_says_how_it_ended(
    provider: tuple[TracerProvider, InMemorySpanExporter],
) -> None:
    tracer_provider, exporter = provider
    parent = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    spans = {}
    for name, carrier, outcome in (
        ("child", {"traceparent": parent}, "SUCCEEDED"),
        ("root", None, "FATAL"),
        ("garbled", {"traceparent": "00-zz"}, "FAILED"),
    ):
        with tracing.attempt_span(
            name, task_id=name, attempt=2, app="a", carrier=carrier, provider=tracer_provider
        ) as span:
            tracing.ended(span, outcome, "E", "went wrong")
    for span in exporter.get_finished_spans():
        spans[span.name] = span
    child = spans["child"]
    assert child.parent is not None and child.parent.span_id == int("b" * 16, 16)
    assert child.get_span_context().trace_id == int("a" * 32, 16)
    assert child.attributes == {
        "conveyor.task_id": "child",
        "conveyor.attempt": 2,
        "conveyor.task_type": "child",
        "conveyor.app": "a",
        "conveyor.outcome": "SUCCEEDED",
    }
    assert child.status.status_code is StatusCode.UNSET
    for name in ("root", "garbled"):
        assert spans[name].parent is None
        assert spans[name].status.status_code is StatusCode.ERROR
        assert spans[name].status.description == "E: went wrong"
