"""The schema registry's operations over the tenant's catalog, with Confluent's error codes.

Rule 1 (ids): a schema id is given once per tenant, in the order of the tenant's registry
partition (``catalog.py`` rule 1): the same schema text has the same id in every subject
of the tenant, and ids of one tenant say nothing of another's (a cluster-wide sequence would
need one writer for all tenants, and would let a tenant count the others' schemas).
Confluent clients cache schemas by id per client, and a client is bound to one registry URL
and one set of credentials, so ids unique per tenant are what they can see.
Rule 2 (checks first): a schema is parsed and checked against its subject's compatibility
level before its record is appended, so an invalid or incompatible schema writes nothing.
When another registration to the subject came first (``machine/handlers/types.py`` rule 5),
the check runs again against the new latest version.
Rule 3 (levels): a subject's own level, else the tenant's, else BACKWARD.
"""

from __future__ import annotations

from typing import Any

from conveyor.errors import ContractError, TransientError
from conveyor.schemas.types import DeleteSchemas, RegisterSchema, SetCompatibility
from conveyor.store.catalog import Catalog
from conveyor.streams.machine.handlers.types import live_versions
from conveyor.streams.registry import compatibility
from conveyor.streams.registry.catalog import Catalogs

REGISTER_TRIES_MAX = 5
SUBJECT_BYTES_MAX = 512


class RegistryError(ContractError):
    """A schema registry refusal: ``error_code`` and status as Confluent's registry answers."""

    def __init__(self, error_code: int, message: str) -> None:
        super().__init__(message, field=None)
        self.error_code = error_code
        self.http_status = 422 if error_code >= 42200 else error_code // 100
        if error_code == 409:
            self.http_status = 409


def subject_not_found(subject: str) -> RegistryError:
    return RegistryError(40401, f"Subject '{subject}' not found.")


def version_not_found(subject: str, version: object) -> RegistryError:
    return RegistryError(40402, f"Version {version} not found for subject '{subject}'.")


def schema_not_found(what: str) -> RegistryError:
    return RegistryError(40403, f"Schema {what} not found.")


class SchemaRegistry:
    def __init__(self, catalogs: Catalogs) -> None:
        self.catalogs = catalogs

    def _read(self, tenant: str) -> Catalog:
        return self.catalogs.read(tenant)

    # -- reads ----------------------------------------------------------------------------

    def subjects(self, tenant: str, *, deleted: bool = False) -> list[str]:
        return [
            name
            for name, doc in self._read(tenant).subjects(tenant)
            if (doc["versions"] if deleted else live_versions(doc))
        ]

    def versions(self, tenant: str, subject: str, *, deleted: bool = False) -> list[int]:
        doc = self._subject(tenant, subject, deleted=deleted)
        rows = doc["versions"] if deleted else live_versions(doc)
        return [v["version"] for v in rows]

    def _subject(self, tenant: str, subject: str, *, deleted: bool = False) -> dict[str, Any]:
        doc = self._read(tenant).subject(tenant, subject)
        if doc is None or not (doc["versions"] if deleted else live_versions(doc)):
            raise subject_not_found(subject)
        return doc

    def version(
        self, tenant: str, subject: str, version: str, *, deleted: bool = False
    ) -> dict[str, Any]:
        """The version (a number or ``latest``), as Confluent shows it."""
        doc = self._subject(tenant, subject, deleted=deleted)
        rows = doc["versions"] if deleted else live_versions(doc)
        if version in ("latest", "-1"):
            row = rows[-1]
        else:
            number = parse_version(version)
            found = [v for v in rows if v["version"] == number]
            if not found:
                raise version_not_found(subject, number)
            row = found[0]
        return self._shown(tenant, subject, row)

    def _shown(self, tenant: str, subject: str, row: dict[str, Any]) -> dict[str, Any]:
        schema = self._read(tenant).schema(tenant, row["id"])
        return {"subject": subject, "version": row["version"], "id": row["id"], "schema": schema}

    def schema(self, tenant: str, schema_id: int) -> str:
        text = self._read(tenant).schema(tenant, schema_id)
        if text is None:
            raise schema_not_found(str(schema_id))
        return text

    def lookup(
        self, tenant: str, subject: str, text: str, *, deleted: bool = False
    ) -> dict[str, Any]:
        """The version of ``subject`` that holds ``text``."""
        canon = _canonical(text)
        doc = self._subject(tenant, subject, deleted=deleted)
        schema_id = self._read(tenant).id_of(tenant, canon)
        rows = doc["versions"] if deleted else live_versions(doc)
        for row in rows:
            if row["id"] == schema_id:
                return self._shown(tenant, subject, row)
        raise schema_not_found(f"in subject '{subject}'")

    def level(self, tenant: str, subject: str | None = None) -> str:
        catalog = self._read(tenant)
        own = catalog.level(tenant, subject) if subject is not None else None
        return own or catalog.level(tenant, None) or compatibility.BACKWARD

    def own_level(self, tenant: str, subject: str) -> str | None:
        return self._read(tenant).level(tenant, subject)

    def check(self, tenant: str, subject: str, text: str, version: str | None) -> list[str]:
        """What makes ``text`` incompatible with the subject's ``version`` (None: as the
        subject's level says); empty: compatible."""
        canon = _canonical(text)
        if version is None:
            return compatibility.incompatibilities(
                self.level(tenant, subject), canon, self._live(tenant, subject)
            )
        old = self.version(tenant, subject, version)["schema"]
        level = self.level(tenant, subject)
        if level == "NONE":
            return []
        found: list[str] = []
        if level.startswith(("BACKWARD", "FULL")):
            found += compatibility.problems(canon, old)
        if level.startswith(("FORWARD", "FULL")):
            found += compatibility.problems(old, canon)
        return found

    def _live(self, tenant: str, subject: str) -> list[str]:
        catalog = self._read(tenant)
        doc = catalog.subject(tenant, subject)
        return [catalog.schema(tenant, v["id"]) or "" for v in live_versions(doc)]

    # -- writes ---------------------------------------------------------------------------

    async def register(self, tenant: str, subject: str, text: str) -> int:
        """The id of ``text`` as a version of ``subject``, added if the subject lacks it."""
        check_subject(subject)
        canon = _canonical(text)
        for _ in range(REGISTER_TRIES_MAX):
            catalog = self._read(tenant)
            doc = catalog.subject(tenant, subject)
            live = live_versions(doc)
            known = catalog.id_of(tenant, canon)
            if known is not None and any(v["id"] == known for v in live):
                return known
            found = compatibility.incompatibilities(
                self.level(tenant, subject), canon, self._live(tenant, subject)
            )
            if found:
                raise RegistryError(
                    409,
                    f"Schema being registered is incompatible with an earlier schema for "
                    f"subject '{subject}' (compatibility {self.level(tenant, subject)}), "
                    f"details: {found}",
                )
            latest = live[-1]["version"] if live else 0
            record = RegisterSchema(
                tenant=tenant, subject=subject, schema=canon, expect_latest=latest
            )
            reply = await self.catalogs.submit(tenant, record)
            if reply.ok:
                schema_id = self._read(tenant).id_of(tenant, canon)
                assert schema_id is not None, "a registered schema has an id"
                return schema_id
        raise TransientError(
            f"subject '{subject}' kept changing while this schema was checked; send it again",
            retry_after_ms=100,
        )

    async def delete_subject(self, tenant: str, subject: str, *, permanent: bool) -> list[int]:
        doc = self._read(tenant).subject(tenant, subject)
        if doc is None or not doc["versions"]:
            raise subject_not_found(subject)
        live = [v["version"] for v in live_versions(doc)]
        if permanent and live:
            raise RegistryError(
                40405,
                f"Subject '{subject}' was not deleted first before being permanently deleted",
            )
        if not permanent and not live:
            raise RegistryError(40404, f"Subject '{subject}' was soft deleted.")
        gone = [v["version"] for v in doc["versions"]] if permanent else live
        record = DeleteSchemas(tenant=tenant, subject=subject, version=None, permanent=permanent)
        await self.catalogs.submit(tenant, record)
        return gone

    async def delete_version(
        self, tenant: str, subject: str, version: str, *, permanent: bool
    ) -> int:
        doc = self._read(tenant).subject(tenant, subject)
        if doc is None or not doc["versions"]:
            raise subject_not_found(subject)
        rows = doc["versions"]
        if version in ("latest", "-1"):
            live = live_versions(doc)
            if not live:
                raise subject_not_found(subject)
            row = live[-1]
        else:
            number = parse_version(version)
            found = [v for v in rows if v["version"] == number]
            if not found:
                raise version_not_found(subject, number)
            row = found[0]
        if permanent and not row.get("deleted"):
            raise RegistryError(
                40407,
                f"Subject '{subject}' Version {row['version']} was not deleted first before "
                "being permanently deleted",
            )
        if not permanent and row.get("deleted"):
            raise version_not_found(subject, row["version"])
        record = DeleteSchemas(
            tenant=tenant, subject=subject, version=row["version"], permanent=permanent
        )
        await self.catalogs.submit(tenant, record)
        return int(row["version"])

    async def set_level(self, tenant: str, subject: str | None, level: str | None) -> None:
        if level is not None and level not in compatibility.LEVELS:
            raise RegistryError(
                42203,
                f"Invalid compatibility level {level!r}; valid levels are "
                + ", ".join(compatibility.LEVELS),
            )
        if subject is not None:
            check_subject(subject)
        await self.catalogs.submit(
            tenant, SetCompatibility(tenant=tenant, subject=subject, level=level)
        )


def parse_version(text: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 2**31 - 1:
        raise RegistryError(
            42202,
            f"The specified version '{text}' is not a valid version id. Allowed values are "
            'between [1, 2^31-1] and the string "latest"',
        )
    return int(text)


def check_subject(subject: str) -> None:
    if not subject or len(subject.encode()) > SUBJECT_BYTES_MAX or "\x00" in subject:
        raise RegistryError(
            42208, f"Invalid subject name: 1 to {SUBJECT_BYTES_MAX} bytes, no NUL character"
        )


def _canonical(text: str) -> str:
    try:
        compatibility.parse(text)
    except compatibility.InvalidSchema as exc:
        raise RegistryError(42201, f"Invalid schema: {exc}") from None
    return compatibility.canonical(text)
