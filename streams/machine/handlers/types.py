"""RegisterTypes and the schema registry's records: the tenant's catalog (``store/catalog.py``).

Every record here sits on the tenant's registry partition and touches catalog rows only, so
a node that does not lead that partition can rebuild the same rows by applying just these
records (``streams/registry/catalog.py``): nothing here reads a task, a timer or the clock.

Rules 1-3 of ``streams/gateway/registry.py`` (rolling deploys add types, a higher deploy
number removes the types it does not serve, the newest deploy decides the pinned types) are
applied here, by ``register``, on the app's row. Rule 4 (definitions): a type's definition
(its default options and schema ids) is written by a registration that speaks for the newest
deploy (rule 3's test), or by any registration when the type has none yet; its origin (app
version, deploy number, the record's time) goes with it. An older deploy's agent restarting
never puts its defaults back.
Rule 5 (schemas): a RegisterSchema names the subject's latest live version its
compatibility check ran against; when the subject has another one now, a concurrent
registration came first and the record is refused (ok False, reason ``stale``): the gateway
checks again. The same schema text has one id in the tenant, in every subject; a subject that
has it live already answers its version, unchanged. Versions only grow within a subject.
Rule 6 (deletes): a soft delete hides versions (their ids still resolve); a permanent one
drops them, and drops a schema id no other version of the tenant still names.
"""

from __future__ import annotations

from typing import Any

from conveyor.schemas.types import (
    DeleteSchemas,
    RegisterSchema,
    RegisterTypes,
    SetCompatibility,
    TypeDefinition,
)
from conveyor.store.catalog import Catalog
from conveyor.store.tables import Tables
from conveyor.streams.machine.outcome import Meta, Outcome, Reply

STALE = "stale"
OPTIONS = (
    "queue",
    "priority",
    "attempts_max",
    "backoff_base_ms",
    "backoff_factor",
    "backoff_cap_ms",
    "non_retryable",
    "schedule_to_start_ms",
    "start_to_close_ms",
    "schedule_to_close_ms",
    "cancel_grace_ms",
    "resume",
    "payload_schema_id",
    "result_schema_id",
)


def _ok(meta: Meta, out: Outcome, *, created: bool = False, ok: bool = True) -> None:
    reason = None if ok else STALE
    out.actions.append(
        Reply(offset=meta.offset, index=0, ok=ok, task_id="", created=created, reason=reason)
    )


def is_current(entry: dict[str, Any], version: str | None, deploy: int | None) -> bool:
    """Whether a registration speaks for the newest deploy (rules 2 and 3)."""
    newest = entry.get("deploy")
    if newest is not None:
        return deploy is not None and deploy >= newest
    if deploy is not None:
        return True
    return (
        version is None
        or version == entry.get("version")
        or version not in entry.get("versions", [])
    )


def register(
    entry: dict[str, Any],
    served: set[str],
    version: str | None,
    pinned: list[str] | None,
    deploy: int | None,
) -> tuple[dict[str, Any], list[str]]:
    """Rules 1-3 on an app's row: the row after the registration, and the types it removed."""
    known = set(entry.get("task_types", []))
    seen = set(entry.get("versions", []))
    removed: dict[str, str] = dict(entry.get("removed", {}))
    pins = set(entry.get("pinned", []))
    newest = entry.get("deploy")
    current = is_current(entry, version, deploy)
    after: dict[str, Any] = {k: v for k, v in entry.items() if k in ("version", "deploy")}
    removed_now: list[str] = []
    if deploy is not None and newest is not None and deploy > newest:
        removed_now = sorted(known - served - set(removed))  # a deploy (rule 2)
        removed.update(dict.fromkeys(removed_now, version or f"deploy {deploy}"))
    if deploy is not None and (newest is None or deploy > newest):
        after["deploy"] = deploy
    if current:
        for task_type in served & set(removed):
            del removed[task_type]  # the newest deploy serves it again
        if version is not None:
            after["version"] = version
    if version is not None:
        seen.add(version)
    known.update(served)
    if pinned is not None and current:
        pins = set(pinned)
    after.update(
        task_types=sorted(known),
        versions=sorted(seen),
        removed=dict(sorted(removed.items())),
        pinned=sorted(pins),
    )
    return after, removed_now


def definition_doc(definition: TypeDefinition, record: RegisterTypes, ts_ms: int) -> dict[str, Any]:
    doc: dict[str, Any] = {
        name: getattr(definition, name) for name in OPTIONS if getattr(definition, name) is not None
    }
    doc["origin"] = {"version": record.version, "deploy": record.deploy, "registered_ms": ts_ms}
    return doc


def apply_register_types(tables: Tables, record: RegisterTypes, meta: Meta, out: Outcome) -> None:
    catalog = Catalog(tables)
    entry = catalog.app(record.tenant, record.app) or {}
    current = is_current(entry, record.version, record.deploy)
    served = {d.task_type for d in record.types}
    after, _ = register(entry, served, record.version, record.pinned, record.deploy)
    if after != entry:
        catalog.put_app(record.tenant, record.app, after)
    for definition in record.types:  # rule 4
        known = catalog.definition(record.tenant, record.app, definition.task_type)
        doc = definition_doc(definition, record, meta.ts_ms)
        if known is None or (current and _options(known) != _options(doc)):
            catalog.put_definition(record.tenant, record.app, definition.task_type, doc)
    catalog.touch(record.tenant, meta.offset)  # readers cache by it
    _ok(meta, out)


def _options(doc: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k != "origin"}


def live_versions(subject: dict[str, Any] | None) -> list[dict[str, Any]]:
    return [v for v in (subject or {}).get("versions", []) if not v.get("deleted")]


def apply_register_schema(tables: Tables, record: RegisterSchema, meta: Meta, out: Outcome) -> None:
    catalog = Catalog(tables)
    subject = catalog.subject(record.tenant, record.subject) or {"versions": []}
    live = live_versions(subject)
    latest = live[-1]["version"] if live else 0
    known_id = catalog.id_of(record.tenant, record.schema)
    if known_id is not None and any(v["id"] == known_id for v in live):
        _ok(meta, out)  # rule 5: the subject has it already
        return
    if latest != record.expect_latest:
        _ok(meta, out, ok=False)
        return
    schema_id = catalog.add_schema(record.tenant, record.schema)
    versions = subject["versions"]
    number = max((v["version"] for v in versions), default=0) + 1
    versions.append({"version": number, "id": schema_id, "deleted": False})
    catalog.put_subject(record.tenant, record.subject, subject)
    catalog.touch(record.tenant, meta.offset)
    _ok(meta, out, created=True)


def apply_delete_schemas(tables: Tables, record: DeleteSchemas, meta: Meta, out: Outcome) -> None:
    catalog = Catalog(tables)
    subject = catalog.subject(record.tenant, record.subject)
    if subject is None:
        _ok(meta, out, ok=False)
        return
    hit = [
        v for v in subject["versions"] if record.version is None or v["version"] == record.version
    ]
    if not record.permanent:
        for v in hit:
            v["deleted"] = True
        catalog.put_subject(record.tenant, record.subject, subject)
        catalog.touch(record.tenant, meta.offset)
        _ok(meta, out)
        return
    subject["versions"] = [v for v in subject["versions"] if v not in hit]
    if subject["versions"]:
        catalog.put_subject(record.tenant, record.subject, subject)
    else:
        catalog.put_subject(record.tenant, record.subject, None)
        catalog.put_level(record.tenant, record.subject, None)
    named = {v["id"] for _, s in catalog.subjects(record.tenant) for v in s["versions"]}
    for v in hit:
        if v["id"] not in named:
            catalog.drop_schema(record.tenant, v["id"])
    catalog.touch(record.tenant, meta.offset)
    _ok(meta, out)


def apply_set_compatibility(
    tables: Tables, record: SetCompatibility, meta: Meta, out: Outcome
) -> None:
    catalog = Catalog(tables)
    catalog.put_level(record.tenant, record.subject, record.level)
    catalog.touch(record.tenant, meta.offset)
    _ok(meta, out)
