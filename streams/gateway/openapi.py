"""The OpenAPI 3.1 documents, generated from the models and the table of operations.

``msgspec.json.schema_components`` writes the schema of every model the table names (fields
without a default are ``required``; ``Meta`` gives bounds, patterns, descriptions and
examples); a model's ``rules`` (what no type states: ``not``, ``oneOf``, ``if``/``then``) are
added to its component. A query model becomes one parameter per field, a path's ``{name}``
a parameter typed by ``PATH_PARAMETERS``. Every gateway operation answers its errors as
``ErrorReply`` with the statuses of ``errors.ERRORS``.
"""

from __future__ import annotations

import re
from functools import cache
from typing import Any

import msgspec

from conveyor.contract.replies import ErrorReply
from conveyor.streams.gateway.contract.operations import (
    JSON,
    OPERATIONS,
    PATH_PARAMETERS,
    REGISTRY_OPERATIONS,
    Operation,
)
from conveyor.streams.gateway.contract.requests import Model
from conveyor.streams.gateway.errors import ERRORS
from conveyor.streams.gateway.fields import BODY_BYTES_MAX

Schema = dict[str, Any]
REF = "#/components/schemas/{name}"
_PATH_PARAMETER = re.compile(r"\{(\w+)\}")
_SUCCESS = {200: "ok", 201: "created", 202: "accepted: a bulk operation started", 503: "halted"}


@cache
def document() -> Schema:
    """The gateway's document, served at ``/openapi.json``."""
    return _build(
        OPERATIONS,
        title="Conveyor gateway",
        description="Durable background jobs. Authorization: Bearer <api key>. Request bodies "
        f"up to {BODY_BYTES_MAX} bytes. Every error is {{error: {{code, message, field?}}}}: "
        "what was wrong and what to do, and the JSON path of the field at fault.",
        errors=True,
    )


@cache
def registry_document() -> Schema:
    """The schema registry's document (Confluent's REST API), at ``/registry/openapi.json``."""
    return _build(
        REGISTRY_OPERATIONS,
        title="Conveyor schema registry",
        description="Confluent's Schema Registry REST API over the tenant's task type schemas. "
        'Errors are {"error_code", "message"} with Confluent\'s codes. The API key is the '
        "bearer, or the password of Basic authentication.",
        errors=False,
    )


def _build(ops: tuple[Operation, ...], *, title: str, description: str, errors: bool) -> Schema:
    models = {m for op in ops for m in (op.body, *op.replies.values()) if m is not None}
    if errors:
        models.add(ErrorReply)
    queries = {op.query for op in ops if op.query is not None}
    ordered = sorted(models | queries, key=lambda m: m.__name__)
    _, components = msgspec.json.schema_components(ordered, ref_template=REF)
    for model in _models_with_rules():
        if model.__name__ in components:
            components[model.__name__].update(model.rules)
    for component in components.values():
        if component.get("required") == []:
            del component["required"]  # no field is required: say nothing
    parameters = {q.__name__: _query_parameters(components.pop(q.__name__)) for q in queries}
    paths: Schema = {}
    for op in ops:
        query = parameters[op.query.__name__] if op.query is not None else []
        paths.setdefault(op.path, {})[op.method] = _operation(op, query, errors=errors)
    return {
        "openapi": "3.1.0",
        "info": {"title": title, "version": "1", "description": description},
        "components": {
            "schemas": dict(sorted(components.items())),
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"apiKey": []}],
        "tags": [{"name": tag} for tag in dict.fromkeys(op.tag for op in ops)],
        "paths": paths,
    }


def _models_with_rules() -> list[type[Model]]:
    found, todo = [], [Model]
    while todo:
        model = todo.pop()
        todo.extend(model.__subclasses__())
        if model.rules:
            found.append(model)
    return found


def _ref(model: type[Any]) -> Schema:
    return {"$ref": REF.format(name=model.__name__)}


def _query_parameters(schema: Schema) -> list[Schema]:
    out = []
    for name, prop in schema.get("properties", {}).items():
        described = {k: prop[k] for k in ("description",) if k in prop}
        options = [s for s in prop.get("anyOf", [prop]) if s.get("type") != "null"]
        value = {k: v for k, v in options[0].items() if k != "default"}
        # A map (the task list's payload search): payload[<field>]=<value>, OpenAPI's deepObject
        style = {"style": "deepObject", "explode": True} if value.get("type") == "object" else {}
        out.append(
            {"name": name, "in": "query", "required": False, "schema": value, **style, **described}
        )
    return out


def _path_parameters(path: str) -> list[Schema]:
    return [
        {"name": name, "in": "path", "required": True, "schema": PATH_PARAMETERS[name]}
        for name in _PATH_PARAMETER.findall(path)
    ]


def _operation(op: Operation, query: list[Schema], *, errors: bool) -> Schema:
    responses: Schema = {}
    for status, model in sorted(op.replies.items()):
        responses[str(status)] = {
            "description": _SUCCESS.get(status, "ok"),
            "content": {op.content_type: {"schema": _ref(model)}},
        }
    if op.content_type != JSON:
        responses["200"] = {"description": "ok", "content": {op.content_type: {"schema": {}}}}
    if errors:
        for status in sorted({s for _, s, _ in ERRORS}):
            if str(status) in responses:
                continue
            codes = ", ".join(sorted({c for _, s, c in ERRORS if s == status}))
            responses[str(status)] = {
                "description": codes,
                "content": {JSON: {"schema": _ref(ErrorReply)}},
            }
    out: Schema = {
        "operationId": op.operation_id,
        "tags": [op.tag],
        "summary": op.summary,
        "responses": responses,
    }
    parameters = _path_parameters(op.path) + query
    if parameters:
        out["parameters"] = parameters
    if op.body is not None:
        media: Schema = {"schema": _ref(op.body)}
        if op.example is not None:
            media["example"] = op.example
        out["requestBody"] = {"required": not op.body_optional, "content": {JSON: media}}
    if op.public:
        out["security"] = []
    return out
