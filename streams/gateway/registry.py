"""Known task types per (tenant, app), fed by ``/worker/register``, kept as records in the log.

A registration is a ``RegisterTypes`` record on the tenant's registry partition
(``streams/registry/catalog.py``: which partition, and how every node of a cluster reads
it); the machine applies the rules below to the app's row (``machine/handlers/types.py``),
so they hold on every node and survive restarts and fail-overs. This module reads those rows.

Rule 1 (rolling deploys): registration adds types. An agent registering fewer types than are
known removes nothing unless rule 2 says so.
Rule 2 (a deploy removes handlers): deploy order is declared, never inferred from arrival. An
agent declares its deploy number (``conveyor agent --deploy N``, ``$CONVEYOR_DEPLOY``): one
number per rollout, higher for each newer one (a CI build number, a release counter). Only a
registration whose deploy number is higher than the newest known is the deploy: a known type
it does not serve is removed by it, and enqueues of it are refused (the first deploy number
an app sees removes nothing: there is nothing older to compare it with). An agent of an older or
the same deploy, or one that declares none, removes nothing, whatever the order in which the
agents of a rollout start: an old agent restarting after the new version registered leaves
the new version's types alone. (Versions are names, and the first agent of a version to
register may be the old one, so neither names nor arrival can say which is newer.) Tasks of a
removed type already queued stay ENQUEUED: polls name the types their agents serve
(``processor/pool.py``), so such a task is dealt to an agent still running an older deploy
that has its handler, or to none; its details say so (``unserved``). Only a later deploy that
serves the type again brings it back.

Rule 3 (resume policies): the workflow types an agent declares ``pinned`` are the default
policy of enqueues of them that do not name one. The newest deploy's agents decide (an agent of
an older deploy changes nothing; without deploy numbers, the agents of the newest version
registered); an agent that declares nothing changes nothing.

Rule 4 (definitions): a type's definition (default queue, priority, retry policy, timeouts,
cancel grace, resume policy, payload and result schema ids) is the one its newest deploy's
agents registered. Every enqueue path (``POST /v1/tasks`` and its batch, so the CLI, a
schedule's template, a workflow's children) goes through ``resolve``: an option the enqueue
does not set takes the type's default, then the server's; a schedule takes them when it is
created or replaced (its firings enqueue the template as stored). A payload of a type with a
payload schema must fit it (``streams/registry/payloads.py``), or the enqueue is refused
(400) naming the field and the type expected, and nothing is enqueued.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.contract import replies as out
from conveyor.errors import ContractError
from conveyor.schemas.resume import RESUME_LATEST, RESUME_PINNED
from conveyor.schemas.types import RegisterTypes, TypeDefinition
from conveyor.store.catalog import Catalog
from conveyor.streams.gateway.errors import UnknownTaskType
from conveyor.streams.gateway.files import read_json
from conveyor.streams.gateway.validation import DEFAULTABLE, EnqueueRequest
from conveyor.streams.machine.handlers.types import register
from conveyor.streams.registry.catalog import Catalogs, LocalCatalogs, NodeCatalogs
from conveyor.streams.registry.payloads import mismatch

if TYPE_CHECKING:
    from conveyor.streams.node import Node

HINT_TYPES_MAX = 20  # task types an unknown-type error lists
LEGACY_FILE = "registry.json"  # where versions before the catalog kept the registry


class Registry:
    def __init__(self, legacy: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.catalogs: Catalogs = LocalCatalogs()  # until ``bind``: in memory (tests, tools)
        # An app's row from the registry.json of an older version, until the app registers.
        self._legacy = dict(legacy or {})
        self._views: dict[str, _View] = {}  # decoded rows per tenant, by its catalog's stamp

    @classmethod
    def load(cls, home: str | Path) -> Registry:
        """The registry of the node whose home is ``home``: its rows are in the node's log,
        read once the gateway binds it to the node (``bind``). A ``registry.json`` an older
        version wrote answers for the apps it lists until each registers again: that first
        registration writes its row to the log before its own (``register``)."""
        doc = read_json(Path(home) / LEGACY_FILE) or {}
        legacy = {
            (tenant, app): entry
            for tenant, apps in doc.get("tenants", {}).items()
            for app, entry in apps.items()
        }
        return cls(legacy)

    def bind(self, node: Node) -> None:
        if isinstance(self.catalogs, LocalCatalogs):
            self.catalogs = NodeCatalogs(node)

    async def ready(self, tenant: str) -> None:
        """Call before the reads of a request: a node reading the tenant's catalog from its
        log (a partition it does not lead) finishes that first (``registry/catalog.py``)."""
        await self.catalogs.ready(tenant)

    def _catalog(self, tenant: str) -> Catalog:
        return self.catalogs.read(tenant)

    def _view(self, tenant: str) -> _View:
        """The tenant's rows as last decoded, while no catalog record changed them: every
        enqueue item reads its type's rows, and reading and decoding them each time cost
        ~60x a lookup in memory. Checked by the offset applied (no read at all while it
        stays, as within one batch), then by the catalog's stamp (one read)."""
        applied = self.catalogs.applied(tenant)
        view = self._views.get(tenant)
        if view is not None and view.applied == applied:
            return view
        catalog = self._catalog(tenant)
        stamp = catalog.stamp(tenant)
        if view is None or view.stamp != stamp:
            view = self._views[tenant] = _View(stamp)
        view.catalog, view.applied = catalog, applied
        return view

    def _entry(self, tenant: str, app: str) -> dict[str, Any]:
        view = self._view(tenant)
        if app not in view.apps:
            view.apps[app] = view.catalog.app(tenant, app) if view.catalog else None
        found = view.apps[app]
        if found is None:
            legacy: dict[str, Any] = self._legacy.get((tenant, app), {})
            return legacy
        return found

    async def register(
        self,
        tenant: str,
        app: str,
        task_types: list[str],
        version: str | None = None,
        pinned: list[str] | None = None,
        *,
        deploy: int | None = None,
        definitions: list[TypeDefinition] | None = None,
    ) -> list[str]:
        """Record an agent's types (and their definitions); the types it removed (rule 2)."""
        await self.ready(tenant)
        given = {d.task_type: d for d in definitions or []}
        types = [given.get(name) or TypeDefinition(task_type=name) for name in task_types]
        before = self._entry(tenant, app)
        _, removed = register(before, set(task_types), version, pinned, deploy)
        old = self._legacy.pop((tenant, app), None)
        if old is not None and self._catalog(tenant).app(tenant, app) is None:
            await self.catalogs.submit(tenant, _from_legacy(tenant, app, old))
        record = RegisterTypes(
            tenant=tenant, app=app, version=version, deploy=deploy, pinned=pinned, types=types
        )
        await self.catalogs.submit(tenant, record)
        return removed

    def resume_of(self, tenant: str, app: str, task_type: str) -> str:
        """The resume policy of an enqueue of ``task_type`` that names none (rule 3)."""
        if task_type in self._entry(tenant, app).get("pinned", ()):
            return RESUME_PINNED
        return RESUME_LATEST

    def task_types(self, tenant: str, app: str) -> frozenset[str]:
        return frozenset(self._entry(tenant, app).get("task_types", ()))

    def definition(self, tenant: str, app: str, task_type: str) -> dict[str, Any] | None:
        view = self._view(tenant)
        key = (app, task_type)
        if key not in view.definitions:
            catalog = view.catalog
            view.definitions[key] = catalog.definition(tenant, app, task_type) if catalog else None
        return view.definitions[key]

    def described(self, tenant: str) -> list[out.TaskType]:
        """Every task type of the tenant: app, name, its definition and where it came from."""
        catalog = self._catalog(tenant)
        out = []
        for app, entry in catalog.apps(tenant):
            docs = dict(catalog.definitions(tenant, app))
            for task_type in entry.get("task_types", []):
                out.append(self._describe(tenant, app, task_type, entry, docs.get(task_type)))
        return out

    def describe(self, tenant: str, app: str, task_type: str) -> out.TaskType | None:
        entry = self._entry(tenant, app)
        if task_type not in entry.get("task_types", []):
            return None
        doc = self.definition(tenant, app, task_type)
        return self._describe(tenant, app, task_type, entry, doc)

    def _describe(
        self,
        tenant: str,
        app: str,
        task_type: str,
        entry: dict[str, Any],
        doc: dict[str, Any] | None,
    ) -> out.TaskType:
        doc = dict(doc or {})
        origin = doc.pop("origin", None)
        defaults = {k: v for k, v in doc.items() if not k.endswith("_schema_id")}
        if task_type in entry.get("pinned", []):
            defaults["resume"] = RESUME_PINNED
        return out.TaskType(
            app=app,
            task_type=task_type,
            defaults=defaults,  # a dict: the options a registration may declare are open-ended
            payload_schema_id=doc.get("payload_schema_id"),
            result_schema_id=doc.get("result_schema_id"),
            removed_by=entry.get("removed", {}).get(task_type),
            origin=None if origin is None else out.TypeOrigin(**origin),
            app_version=entry.get("version"),
            deploy=deploy if isinstance(deploy := entry.get("deploy"), int) else None,
        )

    def removed_by(self, tenant: str, app: str, task_type: str) -> str | None:
        """The version whose deploy removed ``task_type``, if one did."""
        removed: dict[str, str] = self._entry(tenant, app).get("removed", {})
        return removed.get(task_type)

    def unserved(self, tenant: str, app: str, task_type: str) -> str | None:
        """What a queued task of a removed type waits for (rule 2), or None."""
        version = self.removed_by(tenant, app, task_type)
        if version is None:
            return None
        return (
            f"an agent serving task type {task_type!r}: version {version!r} of app {app!r} "
            "removed its handler, so only an agent of an older deploy still running takes it; "
            "deploy a version with the handler, or cancel the task"
        )

    def require(self, tenant: str, app: str, task_type: str, field: str) -> None:
        """Nothing when ``task_type`` may be enqueued, else what to do (every enqueue item
        asks: one read of the app's entry, no set built unless it is refused)."""
        entry = self._entry(tenant, app)
        version = entry.get("removed", {}).get(task_type)
        if version is not None:
            raise UnknownTaskType(
                f"{field}: task type {task_type!r} was removed from app {app!r} by its version "
                f"{version!r}; deploy a version that has the handler to enqueue it again",
                field=field,
            )
        known = entry.get("task_types", ())
        if task_type in known:
            return
        raise UnknownTaskType(
            f"{field}: task type {task_type!r} is not registered for app {app!r}; "
            + self._hint(tenant, task_type, set(known)),
            field=field,
        )

    def resolve(self, tenant: str, req: EnqueueRequest) -> EnqueueRequest:
        """``req`` with its type's defaults (rule 4), once the type is known and its payload
        fits the type's payload schema; UnknownTaskType or ContractError otherwise."""
        self.require(tenant, req.app, req.task_type, req.field("task_type"))
        doc = self.definition(tenant, req.app, req.task_type) or {}
        changes: dict[str, Any] = {
            name: tuple(doc[name]) if name == "non_retryable" else doc[name]
            for name in DEFAULTABLE
            if name in doc and name not in req.sent
        }
        if changes.get("backoff_base_ms", req.backoff_base_ms) > changes.get(
            "backoff_cap_ms", req.backoff_cap_ms
        ):
            changes.pop("backoff_base_ms", None)  # a request's own cap below the type's base
        if changes:
            req = dataclasses.replace(req, **changes)
        schema_id = doc.get("payload_schema_id")
        if schema_id is not None:
            self._check_payload(tenant, req, int(schema_id))
        return req

    def _check_payload(self, tenant: str, req: EnqueueRequest, schema_id: int) -> None:
        schema = self._catalog(tenant).schema(tenant, schema_id)
        if schema is None:  # its schema was deleted permanently: nothing left to check
            return
        found = mismatch(schema, req.payload)
        if found is not None:
            raise ContractError(
                f"{req.field('payload')}{found.removeprefix('(the payload)')}: the payload does "
                f"not fit the payload schema of task type {req.task_type!r} (schema id "
                f"{schema_id}); fix the payload and send it again",
                field=req.field("payload"),
            )

    def _hint(self, tenant: str, task_type: str, known: set[str]) -> str:
        """What to do about a type the app does not have (``known`` are those it has): the name
        it may have meant, the tenant's app that has it, or how an app's types get
        registered."""
        if known:
            close = difflib.get_close_matches(task_type, known, n=1)
            meant = f"did you mean {close[0]!r}? " if close else ""
            listed = ", ".join(sorted(known)[:HINT_TYPES_MAX])
            more = " ..." if len(known) > HINT_TYPES_MAX else ""
            return f"{meant}its agents registered: {listed}{more}"
        elsewhere = sorted(
            app
            for app, entry in self._catalog(tenant).apps(tenant)
            if task_type in entry.get("task_types", [])
        )
        if elsewhere:
            return f"app {elsewhere[0]!r} has it"
        return (
            "start an agent for the app (conveyor agent --app ...) so it registers its task types"
        )


class _View:
    def __init__(self, stamp: bytes | None) -> None:
        self.stamp = stamp
        self.applied = -2  # the offset it was checked at
        self.catalog: Catalog | None = None
        self.apps: dict[str, dict[str, Any] | None] = {}
        self.definitions: dict[tuple[str, str], dict[str, Any] | None] = {}


def _from_legacy(tenant: str, app: str, entry: dict[str, Any]) -> RegisterTypes:
    """The registration that writes an app's ``registry.json`` row into the log (its
    removed types are not carried: the next deploy decides them again)."""
    return RegisterTypes(
        tenant=tenant,
        app=app,
        version=entry.get("version"),
        deploy=entry.get("deploy") if isinstance(entry.get("deploy"), int) else None,
        pinned=list(entry.get("pinned", [])),
        types=[TypeDefinition(task_type=t) for t in entry.get("task_types", [])],
    )
