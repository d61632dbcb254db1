"""The tenant's catalog rows: its apps' task types and its schema registry, over ``Tables``.

Every row sits on the tenant's registry partition (``streams/registry/catalog.py`` says why)
under ``keys.REGISTRY``; values are compact JSON documents, few and small (one per app, type,
subject, schema and level), read by the gateway and written only by
``streams/machine/handlers/types.py``.

    table          name                          value
    a  apps        app                           {"task_types", "version", "deploy",
                                                  "versions", "removed", "pinned"}
    t  types       lp:app task_type              the TypeDefinition's options, and "origin"
    i  schemas     u32:id                        the schema, canonical JSON text
    f  by schema   sha256(schema)                u32:id (the same schema, the same id)
    s  subjects    subject                       {"versions": [{"version", "id", "deleted"}]}
    c  levels      subject ("" for the tenant)   the compatibility level
    n  next id     (none)                        u32: the last id given
    v  stamp       (none)                        u64: the offset of the last catalog record
                                                  applied for the tenant (readers cache by it)
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Iterator
from typing import Any

from conveyor.store import keys
from conveyor.store.tables import Tables

APPS, TYPES, SCHEMAS, BY_SCHEMA, SUBJECTS, LEVELS, NEXT_ID, STAMP = (
    b"a",
    b"t",
    b"i",
    b"f",
    b"s",
    b"c",
    b"n",
    b"v",
)


def _load(raw: bytes | None) -> dict[str, Any] | None:
    if raw is None:
        return None
    doc: dict[str, Any] = json.loads(raw)
    return doc


def _dump(doc: Any) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


class Catalog:
    """Typed access to one partition's catalog rows (reads see the batch's own writes)."""

    def __init__(self, tables: Tables) -> None:
        self.tables = tables

    def stamp(self, tenant: str) -> bytes | None:
        """Changes whenever a catalog record of the tenant is applied."""
        return self.tables.get_raw(keys.registry(tenant, STAMP))

    def touch(self, tenant: str, offset: int) -> None:
        self.tables.put_raw(keys.registry(tenant, STAMP), struct.pack(">Q", offset))

    # -- apps and task types ------------------------------------------------------------------

    def app(self, tenant: str, app: str) -> dict[str, Any] | None:
        return _load(self.tables.get_raw(keys.registry(tenant, APPS, app.encode())))

    def put_app(self, tenant: str, app: str, entry: dict[str, Any]) -> None:
        self.tables.put_raw(keys.registry(tenant, APPS, app.encode()), _dump(entry))

    def apps(self, tenant: str) -> Iterator[tuple[str, dict[str, Any]]]:
        prefix = keys.registry(tenant, APPS)
        for key, value in self.tables.scan(prefix):
            yield key[len(prefix) :].decode(), json.loads(value)

    def definition(self, tenant: str, app: str, task_type: str) -> dict[str, Any] | None:
        key = keys.registry(tenant, TYPES, keys.lp(app) + task_type.encode())
        return _load(self.tables.get_raw(key))

    def put_definition(self, tenant: str, app: str, task_type: str, doc: dict[str, Any]) -> None:
        key = keys.registry(tenant, TYPES, keys.lp(app) + task_type.encode())
        self.tables.put_raw(key, _dump(doc))

    def definitions(self, tenant: str, app: str) -> Iterator[tuple[str, dict[str, Any]]]:
        prefix = keys.registry(tenant, TYPES, keys.lp(app))
        for key, value in self.tables.scan(prefix):
            yield key[len(prefix) :].decode(), json.loads(value)

    # -- schemas -------------------------------------------------------------------------------

    def schema(self, tenant: str, schema_id: int) -> str | None:
        raw = self.tables.get_raw(keys.registry(tenant, SCHEMAS, struct.pack(">I", schema_id)))
        return None if raw is None else raw.decode()

    def id_of(self, tenant: str, schema: str) -> int | None:
        raw = self.tables.get_raw(keys.registry(tenant, BY_SCHEMA, _digest(schema)))
        return None if raw is None else int(struct.unpack(">I", raw)[0])

    def add_schema(self, tenant: str, schema: str) -> int:
        """The id of ``schema`` in the tenant, given now if it has none."""
        known = self.id_of(tenant, schema)
        if known is not None:
            return known
        last = self.tables.get_raw(keys.registry(tenant, NEXT_ID))
        schema_id = (int(struct.unpack(">I", last)[0]) if last else 0) + 1
        packed = struct.pack(">I", schema_id)
        self.tables.put_raw(keys.registry(tenant, NEXT_ID), packed)
        self.tables.put_raw(keys.registry(tenant, SCHEMAS, packed), schema.encode())
        self.tables.put_raw(keys.registry(tenant, BY_SCHEMA, _digest(schema)), packed)
        return schema_id

    def drop_schema(self, tenant: str, schema_id: int) -> None:
        schema = self.schema(tenant, schema_id)
        if schema is not None:
            self.tables.put_raw(keys.registry(tenant, SCHEMAS, struct.pack(">I", schema_id)), None)
            self.tables.put_raw(keys.registry(tenant, BY_SCHEMA, _digest(schema)), None)

    def subject(self, tenant: str, subject: str) -> dict[str, Any] | None:
        return _load(self.tables.get_raw(keys.registry(tenant, SUBJECTS, subject.encode())))

    def put_subject(self, tenant: str, subject: str, doc: dict[str, Any] | None) -> None:
        key = keys.registry(tenant, SUBJECTS, subject.encode())
        self.tables.put_raw(key, None if doc is None else _dump(doc))

    def subjects(self, tenant: str) -> Iterator[tuple[str, dict[str, Any]]]:
        prefix = keys.registry(tenant, SUBJECTS)
        for key, value in self.tables.scan(prefix):
            yield key[len(prefix) :].decode(), json.loads(value)

    def level(self, tenant: str, subject: str | None) -> str | None:
        raw = self.tables.get_raw(keys.registry(tenant, LEVELS, (subject or "").encode()))
        return None if raw is None else raw.decode()

    def put_level(self, tenant: str, subject: str | None, level: str | None) -> None:
        key = keys.registry(tenant, LEVELS, (subject or "").encode())
        self.tables.put_raw(key, None if level is None else level.encode())


def _digest(schema: str) -> bytes:
    return hashlib.sha256(schema.encode()).digest()
