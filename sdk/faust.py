"""Faust (faust-streaming) over Conveyor's task events topics.

    pip install --no-deps faust-streaming mode-streaming aiohttp-cors \\
        intervaltree terminaltables venusian colorlog mypy-extensions six

faust-streaming pins croniter<6 and click<8.4, older than Conveyor's schedules need (their
daylight-saving rules), so it is installed beside Conveyor without its pins (``make test``
does the same); this module uses only its records and codecs.

A node started with ``conveyor node --kafka ... --task-events`` writes each tenant's task
events to ``<cluster>-task-events.<tenant>``: Avro ``TaskEvent`` records in Confluent's wire
format, keyed by task id, whose schema is in the tenant's registry (``<gateway>/registry``).
``task_events_topic`` is that topic for a Faust app, its values decoded into ``TaskEvent``
records::

    app = faust.App("billing", broker="kafka://HOST:9092")
    events = task_events_topic(app, cluster="prod", tenant="acme",
                               registry_url="https://node/registry", api_key=KEY)

    @app.agent(events)
    async def finished(stream):
        async for event in stream:
            if event.terminal:
                ...

Delivery is at least once: dedupe on (``task_id``, ``version``, ``kind``) where it matters
(``version`` is the log offset that caused the event). ``examples/task_events_faust.py`` is a
whole app.
"""

from __future__ import annotations

import io
import json
import re
import struct
import urllib.request
from typing import Any

try:
    import faust
    from faust.serializers import codecs
except ImportError:  # pragma: no cover - depends on the install
    raise ImportError(
        "conveyor.faust needs faust-streaming beside Conveyor, without its old pins: "
        "pip install --no-deps faust-streaming mode-streaming aiohttp-cors intervaltree "
        "terminaltables venusian colorlog mypy-extensions six"
    ) from None

from conveyor import extras

extras.require("server", "fastavro", what="conveyor.faust")  # the Avro of the events
from fastavro import parse_schema, schemaless_reader  # noqa: E402

__all__ = ["TERMINAL", "TaskEvent", "TaskEventCodec", "task_events_topic", "topic_of"]

TERMINAL = frozenset({"TaskSucceeded", "TaskFailed", "TaskCanceled", "TaskExpired"})
HEADER = struct.Struct(">bI")  # Confluent's wire format: magic byte 0, schema id
REQUEST_TIMEOUT_S = 10.0
_PLAIN = re.compile(r"[A-Za-z0-9.\-]")


def topic_of(cluster: str, tenant: str) -> str:
    """The tenant's task events topic: a character other than ``A-Z a-z 0-9 . -`` of the
    tenant's name is written ``_xx`` (its UTF-8 bytes in hex), as the node names it."""
    name = "".join(
        c if _PLAIN.fullmatch(c) else "".join(f"_{b:02x}" for b in c.encode()) for c in tenant
    )
    return f"{cluster}-task-events.{name}"


class TaskEvent(faust.Record, serializer="json"):  # type: ignore[misc, unused-ignore]
    """One task event (``schemas/events/TaskEvent.avsc``): a task changed."""

    kind: str
    task_id: str
    tenant: str
    app: str
    task_type: str
    queue: str
    status: str
    attempt: int
    ts_ms: int
    version: int
    agent_id: str | None = None
    error_class: str | None = None
    error_message: str | None = None

    @property
    def terminal(self) -> bool:
        """Whether the task ended here (succeeded, failed, canceled or expired)."""
        return self.kind in TERMINAL


class TaskEventCodec(codecs.Codec):  # type: ignore[misc, unused-ignore]
    """Decodes a task events topic's values: each names its schema by id, read once from the
    tenant's registry with the tenant's key. Conveyor writes these topics; encoding is not
    offered."""

    def __init__(self, registry_url: str, api_key: str, **kwargs: Any) -> None:
        super().__init__(registry_url=registry_url, api_key=api_key, **kwargs)
        self._url = registry_url.rstrip("/")
        self._key = api_key
        self._schemas: dict[int, Any] = {}

    def _loads(self, s: bytes) -> Any:
        if len(s) < HEADER.size or s[0] != 0:
            raise ValueError("not a value in Confluent's wire format (magic byte 0, schema id)")
        _, schema_id = HEADER.unpack_from(s)
        buf = io.BytesIO(s)
        buf.seek(HEADER.size)
        return schemaless_reader(buf, self._schema(schema_id), None)

    def _dumps(self, obj: Any) -> bytes:
        raise NotImplementedError("the task events topics are written by Conveyor's nodes")

    def _schema(self, schema_id: int) -> Any:
        if schema_id not in self._schemas:
            request = urllib.request.Request(
                f"{self._url}/schemas/ids/{schema_id}",
                headers={"Authorization": f"Bearer {self._key}"},
            )
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as reply:
                text = json.loads(reply.read())["schema"]
            self._schemas[schema_id] = parse_schema(json.loads(text))
        return self._schemas[schema_id]


def task_events_topic(
    app: faust.App, *, cluster: str, tenant: str, registry_url: str, api_key: str
) -> Any:
    """The tenant's task events topic of ``app``, its values ``TaskEvent`` records."""
    return app.topic(
        topic_of(cluster, tenant),
        key_type=str,
        key_serializer="raw",
        value_type=TaskEvent,
        value_serializer=TaskEventCodec(registry_url, api_key),
    )
