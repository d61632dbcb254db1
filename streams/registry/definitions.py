"""The task type definitions an agent sends with ``/worker/register``.

    "definitions": [{"task_type": "charge", "queue": "payments", "priority": 5,
                     "retry": {...}, "timeouts": {...}, "cancel_grace_ms": 10000,
                     "resume": "pinned", "payload_schema": {<Avro>}, "result_schema": {<Avro>}}]

The options are checked by the enqueue's own validation (``gateway/validation.parse_task``),
so a definition can hold exactly what an enqueue could, within the same limits; only the
options it sets become defaults. A schema is registered in the tenant's schema registry
under the type's subject (``routes.subject_of``) before the registration is written, so an
invalid (422) or incompatible (409) one refuses the registration and writes nothing of it.
"""

from __future__ import annotations

import json
from typing import Any

from conveyor.schemas.types import TypeDefinition
from conveyor.streams.gateway.fields import Fields, invalid
from conveyor.streams.gateway.validation import parse_task
from conveyor.streams.registry.routes import subject_of
from conveyor.streams.registry.service import RegistryError, SchemaRegistry

DEFINITIONS_MAX = 1_000
_OPTION_FIELDS = {"queue", "priority", "retry", "timeouts", "cancel_grace_ms", "resume"}
_FIELDS = {"task_type", "payload_schema", "result_schema"} | _OPTION_FIELDS


async def parse_definitions(
    raw: Any, *, tenant: str, app: str, schemas: SchemaRegistry, path: str = "definitions"
) -> list[TypeDefinition]:
    if raw is None:
        return []
    items = Fields({"d": raw}, "", {"d"}).items("d", 0, DEFINITIONS_MAX)
    out = []
    for i, item in enumerate(items):
        at = f"{path}[{i}]"
        f = Fields(item, at, _FIELDS)
        task_type = f.req_name("task_type")
        options = {k: v for k, v in item.items() if k in _OPTION_FIELDS}
        req = parse_task({"task_type": task_type, "app": app, **options}, at)
        given: dict[str, Any] = {
            name: (list(value) if isinstance(value, tuple) else value)
            for name in req.sent
            if (value := getattr(req, name)) is not None
        }
        ids: dict[str, Any] = {}
        for field, part in (("payload_schema", "value"), ("result_schema", "result")):
            schema = f.raw(field)
            if schema is None:
                continue
            text = schema if isinstance(schema, str) else json.dumps(schema)
            subject = subject_of(app, task_type, part)
            try:
                ids[f"{field}_id"] = await schemas.register(tenant, subject, text)
            except RegistryError as exc:
                if exc.error_code == 409:
                    raise RegistryError(409, f"{f.at(field)}: {exc}") from None
                raise invalid(f.at(field), str(exc)) from None
        out.append(TypeDefinition(task_type=task_type, **given, **ids))
    return out
