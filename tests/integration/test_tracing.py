"""OpenTelemetry through a real node and agent (``conveyor.tracing``): the trace context of
the span current at ``client.enqueue`` travels with the task, and the attempt runs in a child
span of it, named after the task type, with the task id, attempt and app as attributes. The
client's spans go to an in-memory exporter here; the guests' to one in their own process
(``tracing_app``), read back by a task."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tracing_app
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from test_agent import rig, run
from test_cli_edges import dev_key
from test_gateway import NodeProcess

import conveyor
from conveyor.agents.inline import InlineExecutor
from conveyor.errors import ContractError

pytestmark = pytest.mark.timeout(180)

HERE = Path(__file__).resolve().parent


@pytest.fixture
def tracer() -> Iterator[tuple[Any, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider.get_tracer("client"), exporter
    provider.shutdown()


def ids(span: Any) -> tuple[str, str]:
    context = span.get_span_context()
    return f"{context.trace_id:032x}", f"{context.span_id:016x}"


def attempt_of(spans: list[dict[str, Any]], task_id: str) -> dict[str, Any]:
    (span,) = [s for s in spans if s["attributes"].get("conveyor.task_id") == task_id]
    return span


def enqueue_when_registered(client: conveyor.Client, task: Any, payload: Any) -> Any:
    deadline = time.monotonic() + 60
    while True:
        try:
            return client.enqueue(task, payload)
        except ContractError as exc:
            if "is not registered" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_an_attempt_runs_in_a_child_span_of_the_enqueue(
    tmp_path: Path, tracer: tuple[Any, InMemorySpanExporter]
) -> None:
    client_tracer, exporter = tracer
    home = tmp_path / "home"
    home.mkdir()
    # One guest (one slot): the spans task reads the spans of the guest that ran the others.
    command = ("dev", "--app", "tracing_app:app", "--no-projection", "--concurrency", "1")
    proc = NodeProcess(home, command)
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONVEYOR_")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")])
    proc.start(cwd=HERE, env=env)
    try:
        with conveyor.Client(proc.base, api_key=dev_key(home)) as client:
            untraced = enqueue_when_registered(client, tracing_app.charge, "no span")
            with client_tracer.start_as_current_span("checkout"):
                traced = client.enqueue(tracing_app.charge, "order 7")
                refused = client.enqueue(tracing_app.refuse, "order 8")
            assert traced.result(timeout=60) == "order 7"
            assert untraced.result(timeout=60) == "no span"
            with pytest.raises(conveyor.TaskFailed):
                refused.result(timeout=60)
            spans = client.enqueue(tracing_app.finished_spans).result(timeout=60)
    finally:
        assert proc.stop(signal.SIGINT) == 0, proc.logs()
    (ended,) = exporter.get_finished_spans()  # the client's one span, in the client's process
    assert ended.name == "checkout"
    trace_id, checkout_id = ids(ended)
    attempt = attempt_of(spans, traced.id)
    assert (attempt["trace_id"], attempt["parent_id"]) == (trace_id, checkout_id)
    assert attempt["name"] == "charge" and attempt["kind"] == "CONSUMER"
    assert attempt["attributes"] == {
        "conveyor.task_id": traced.id,
        "conveyor.attempt": 1,
        "conveyor.task_type": "charge",
        "conveyor.app": "tracing-tests",
        "conveyor.outcome": "SUCCEEDED",
    }
    (inner,) = [s for s in spans if s["name"] == "charge the card" and s["trace_id"] == trace_id]
    assert inner["parent_id"] == attempt["span_id"]  # the handler's own span nests in it
    failed = attempt_of(spans, refused.id)
    assert (failed["trace_id"], failed["parent_id"]) == (trace_id, checkout_id)
    assert failed["status"] == "ERROR" and failed["attributes"]["conveyor.outcome"] == "FATAL"
    root = attempt_of(spans, untraced.id)
    assert root["parent_id"] is None and root["trace_id"] != trace_id  # no span at the enqueue


def test_concurrent_attempts_in_one_guest_each_run_in_their_own_span(
    tmp_path: Path, tracer: tuple[Any, InMemorySpanExporter]
) -> None:
    client_tracer, _ = tracer

    async def main() -> None:
        async with rig(tmp_path, app_ref="tracing_app:app", concurrency=4) as r:
            parents: dict[str, tuple[str, str]] = {}
            tasks: dict[str, str] = {}
            for name in ("a", "b", "c", "d"):
                with client_tracer.start_as_current_span(f"request {name}") as span:
                    tasks[name] = await r.enqueue(tracing_app.fetch, name)
                parents[name] = ids(span)
            for task_id in tasks.values():
                assert (await r.finished(task_id)).status == "SUCCEEDED"
            spans_task = await r.enqueue(tracing_app.finished_spans)
            spans = _result(await r.finished(spans_task))
            assert r.agent.executor.spawned == 1  # type: ignore[attr-defined]
            for name, task_id in tasks.items():
                attempt = attempt_of(spans, task_id)
                assert (attempt["trace_id"], attempt["parent_id"]) == parents[name]
                inner = [s for s in spans if s["name"] == f"fetch {name}"]
                assert len(inner) == 3
                assert all(s["parent_id"] == attempt["span_id"] for s in inner)

    run(main)


def _result(task: Any) -> Any:
    import json

    return json.loads(task.result) if isinstance(task.result, bytes) else task.result


def test_an_in_process_agent_runs_each_attempt_in_a_child_span_too(
    tmp_path: Path, tracer: tuple[Any, InMemorySpanExporter]
) -> None:
    """``conveyor agent --in-process`` (the InlineExecutor): the spans are made in this process,
    where ``tracing_app`` set up its exporter."""
    client_tracer, _ = tracer
    app = tracing_app.app

    async def main() -> None:
        async with rig(tmp_path, app_ref="tracing_app:app", executor=InlineExecutor(app)) as r:
            with client_tracer.start_as_current_span("request") as span:
                sync_id = await r.enqueue(tracing_app.charge, "inline")
                async_id = await r.enqueue(tracing_app.fetch, "inline")
            for task_id in (sync_id, async_id):
                assert (await r.finished(task_id)).status == "SUCCEEDED"
            spans = _result(await r.finished(await r.enqueue(tracing_app.finished_spans)))
            for task_id in (sync_id, async_id):
                attempt = attempt_of(spans, task_id)
                assert (attempt["trace_id"], attempt["parent_id"]) == ids(span)

    run(main)
