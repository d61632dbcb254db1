"""The schema registry's REST API under ``/registry``, in Confluent's conventions.

Point a Confluent client at ``<gateway>/registry`` with the tenant's API key, as a bearer
token or as the password of HTTP Basic (``basic.auth.user.info: "<any>:<key>"``): a tenant
sees its own subjects only. Answers are ``application/vnd.schemaregistry.v1+json``; errors
are ``{"error_code": N, "message": ...}`` with Confluent's codes (40401 subject, 40402
version, 40403 schema not found; 409 incompatible; 42201 invalid schema, 42202 invalid
version, 42203 invalid compatibility level), and ``service.py`` says how ids are given.

A task type's schemas are the subjects ``<app>.<task_type>-value`` (its payload) and
``<app>.<task_type>-result`` (its result); any other subject name works as in any registry.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from conveyor.contract import replies as out
from conveyor.errors import ConveyorError, NotFound
from conveyor.streams.gateway import routes
from conveyor.streams.registry.service import RegistryError, SchemaRegistry

PREFIX = "/registry"
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
Handler = Callable[[web.Request], Awaitable[Any]]


def subject_of(app: str, task_type: str, part: str = "value") -> str:
    """The subject of a task type's payload (``value``) or result (``result``) schema."""
    return f"{app}.{task_type}-{part}"


def _answer(body: Any, status: int = 200) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type=CONTENT_TYPE)


def _route(handler: Handler) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def wrapped(request: web.Request) -> web.Response:
        try:
            return _answer(await handler(request))
        except RegistryError as exc:
            return _answer({"error_code": exc.error_code, "message": str(exc)}, exc.http_status)
        except ConveyorError as exc:  # a bad body, a partition not reachable now
            return _answer({"error_code": exc.http_status, "message": str(exc)}, exc.http_status)

    return wrapped


async def _registry(request: web.Request) -> tuple[SchemaRegistry, str]:
    gateway, tenant = routes.context(request)
    await gateway.registry.ready(tenant)
    return SchemaRegistry(gateway.registry.catalogs), tenant


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() == "true"


async def _schema_text(request: web.Request) -> str:
    body = await routes.read_body(request)
    if not isinstance(body, dict) or not isinstance(body.get("schema"), str):
        raise RegistryError(42201, 'Invalid schema: send {"schema": "<the schema as a string>"}')
    kind = body.get("schemaType", "AVRO")
    if kind != "AVRO":
        raise RegistryError(42201, f"Invalid schema: schemaType {kind!r}; only AVRO is served")
    if body.get("references"):
        raise RegistryError(42201, "Invalid schema: schema references are not supported")
    return str(body["schema"])


async def register(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    text = await _schema_text(request)
    return {"id": await registry.register(tenant, request.match_info["subject"], text)}


async def lookup(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    text = await _schema_text(request)
    subject = request.match_info["subject"]
    return registry.lookup(tenant, subject, text, deleted=_flag(request, "deleted"))


async def subjects(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    return registry.subjects(tenant, deleted=_flag(request, "deleted"))


async def versions(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    subject = request.match_info["subject"]
    return registry.versions(tenant, subject, deleted=_flag(request, "deleted"))


async def version(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    subject, number = request.match_info["subject"], request.match_info["version"]
    return registry.version(tenant, subject, number, deleted=_flag(request, "deleted"))


async def version_schema(request: web.Request) -> Any:
    return json.loads((await version(request))["schema"])


async def schema_by_id(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    text = request.match_info["id"]
    if not text.isdigit():
        raise RegistryError(40403, f"Schema {text} not found.")
    return {"schema": registry.schema(tenant, int(text))}


async def schema_types(request: web.Request) -> Any:
    return ["AVRO"]


async def compatible(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    text = await _schema_text(request)
    subject, number = request.match_info["subject"], request.match_info.get("version")
    found = registry.check(tenant, subject, text, number)
    body: dict[str, Any] = {"is_compatible": not found}
    if _flag(request, "verbose"):
        body["messages"] = found
    return body


async def get_config(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    subject = request.match_info.get("subject")
    if subject is None:
        return {"compatibilityLevel": registry.level(tenant)}
    own = registry.own_level(tenant, subject)
    if own is None and not _flag(request, "defaultToGlobal"):
        raise RegistryError(
            40408, f"Subject '{subject}' does not have subject-level compatibility configured"
        )
    return {"compatibilityLevel": own or registry.level(tenant)}


async def put_config(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    body = await routes.read_body(request)
    level = body.get("compatibility") if isinstance(body, dict) else None
    if not isinstance(level, str):
        raise RegistryError(42203, 'Invalid compatibility level: send {"compatibility": "<level>"}')
    await registry.set_level(tenant, request.match_info.get("subject"), level.upper())
    return {"compatibility": level.upper()}


async def delete_config(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    subject = request.match_info["subject"]
    own = registry.own_level(tenant, subject)
    if own is None:
        raise RegistryError(
            40408, f"Subject '{subject}' does not have subject-level compatibility configured"
        )
    await registry.set_level(tenant, subject, None)
    return {"compatibilityLevel": own}


async def delete_subject(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    subject = request.match_info["subject"]
    return await registry.delete_subject(tenant, subject, permanent=_flag(request, "permanent"))


async def delete_version(request: web.Request) -> Any:
    registry, tenant = await _registry(request)
    subject, number = request.match_info["subject"], request.match_info["version"]
    permanent = _flag(request, "permanent")
    return await registry.delete_version(tenant, subject, number, permanent=permanent)


def add_routes(app: web.Application) -> None:
    r, p = app.router, PREFIX
    r.add_post(f"{p}/subjects/{{subject}}/versions", _route(register))
    r.add_post(f"{p}/subjects/{{subject}}", _route(lookup))
    r.add_get(f"{p}/subjects", _route(subjects), allow_head=False)
    r.add_get(f"{p}/subjects/{{subject}}/versions", _route(versions), allow_head=False)
    r.add_get(f"{p}/subjects/{{subject}}/versions/{{version}}", _route(version), allow_head=False)
    r.add_get(
        f"{p}/subjects/{{subject}}/versions/{{version}}/schema",
        _route(version_schema),
        allow_head=False,
    )
    r.add_get(f"{p}/schemas/ids/{{id}}", _route(schema_by_id), allow_head=False)
    r.add_get(f"{p}/schemas/types", _route(schema_types), allow_head=False)
    r.add_post(f"{p}/compatibility/subjects/{{subject}}/versions/{{version}}", _route(compatible))
    r.add_post(f"{p}/compatibility/subjects/{{subject}}/versions", _route(compatible))
    for config in (f"{p}/config", f"{p}/config/"):  # some clients send the slash
        r.add_get(config, _route(get_config), allow_head=False)
        r.add_put(config, _route(put_config))
    r.add_get(f"{p}/config/{{subject}}", _route(get_config), allow_head=False)
    r.add_put(f"{p}/config/{{subject}}", _route(put_config))
    r.add_delete(f"{p}/config/{{subject}}", _route(delete_config))
    r.add_delete(f"{p}/subjects/{{subject}}", _route(delete_subject))
    r.add_delete(f"{p}/subjects/{{subject}}/versions/{{version}}", _route(delete_version))


# -- the task types the node knows (Conveyor's API, not the registry's) -----------------------


async def task_types(request: web.Request) -> web.Response:
    gateway, tenant = routes.context(request)
    await gateway.registry.ready(tenant)
    return routes.reply(out.TaskTypes(task_types=gateway.registry.described(tenant)))


async def task_type(request: web.Request) -> web.Response:
    gateway, tenant = routes.context(request)
    await gateway.registry.ready(tenant)
    app, name = request.match_info["app"], request.match_info["task_type"]
    found = gateway.registry.describe(tenant, app, name)
    if found is None:
        raise NotFound(f"no task type {name!r} registered for app {app!r}", field="task_type")
    return routes.reply(found)


def add_type_routes(app: web.Application) -> None:
    app.router.add_get("/v1/task-types", task_types, allow_head=False)
    app.router.add_get("/v1/task-types/{app}/{task_type}", task_type, allow_head=False)
