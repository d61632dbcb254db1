"""The catalog records through ``machine.apply`` (``machine/handlers/types.py``): a type's
definition is the newest deploy's (rule 4), a schema registration checked against a version
that is no longer the latest is refused (rule 5), one schema has one id in the tenant, and
deletes soft and hard (rule 6)."""

from __future__ import annotations

from conveyor.schemas.types import (
    DeleteSchemas,
    RegisterSchema,
    RegisterTypes,
    SetCompatibility,
    TypeDefinition,
)
from conveyor.streams.machine.handlers.types import STALE
from conveyor.streams.registry.catalog import LocalCatalogs


def types(deploy: int | None, version: str, queue: str) -> RegisterTypes:
    return RegisterTypes(
        tenant="t",
        app="shop",
        version=version,
        deploy=deploy,
        types=[TypeDefinition(task_type="charge", queue=queue, attempts_max=3)],
    )


def test_the_newest_deploy_defines_a_type_and_an_older_one_changes_nothing() -> None:
    catalogs = LocalCatalogs()
    catalogs.apply(types(2, "v2", "payments"))
    catalogs.apply(types(1, "v1", "default"))  # an old agent restarting
    doc = catalogs.read("t").definition("t", "shop", "charge")
    assert doc is not None and doc["queue"] == "payments"
    assert doc["origin"] == {"version": "v2", "deploy": 2, "registered_ms": 0}
    catalogs.apply(types(3, "v3", "fast"))
    doc = catalogs.read("t").definition("t", "shop", "charge")
    assert doc is not None and (doc["queue"], doc["origin"]["deploy"]) == ("fast", 3)
    assert catalogs.read("u").definition("u", "shop", "charge") is None  # tenants apart


def test_schemas_get_one_id_per_text_and_stale_registrations_are_refused() -> None:
    catalogs = LocalCatalogs()

    def register(subject: str, schema: str, latest: int) -> bool:
        record = RegisterSchema(tenant="t", subject=subject, schema=schema, expect_latest=latest)
        reply = catalogs.apply(record)
        assert reply.ok or reply.reason == STALE
        return reply.ok

    assert register("a-value", '"int"', 0)
    assert not register("a-value", '"long"', 0)  # checked against no version: v1 came first
    assert register("a-value", '"long"', 1)
    assert register("b-value", '"int"', 0)
    catalog = catalogs.read("t")
    a, b = catalog.subject("t", "a-value"), catalog.subject("t", "b-value")
    assert a is not None and b is not None
    assert [v["id"] for v in a["versions"]] == [1, 2]
    assert b["versions"] == [{"version": 1, "id": 1, "deleted": False}]  # the same text: id 1
    assert register("a-value", '"int"', 0)  # live already: its version, nothing new
    assert len(catalogs.read("t").subject("t", "a-value")["versions"]) == 2  # type: ignore[index]


def test_soft_then_hard_delete_keeps_ids_other_subjects_use() -> None:
    catalogs = LocalCatalogs()
    for subject in ("a-value", "b-value"):
        catalogs.apply(RegisterSchema(tenant="t", subject=subject, schema='"int"', expect_latest=0))
    catalogs.apply(DeleteSchemas(tenant="t", subject="a-value", permanent=False))
    doc = catalogs.read("t").subject("t", "a-value")
    assert doc is not None and doc["versions"][0]["deleted"] is True
    assert catalogs.read("t").schema("t", 1) == '"int"'  # a soft delete keeps the id
    catalogs.apply(SetCompatibility(tenant="t", subject="a-value", level="NONE"))
    catalogs.apply(DeleteSchemas(tenant="t", subject="a-value", permanent=True))
    catalog = catalogs.read("t")
    assert catalog.subject("t", "a-value") is None and catalog.level("t", "a-value") is None
    assert catalog.schema("t", 1) == '"int"'  # b-value still names it
    catalogs.apply(DeleteSchemas(tenant="t", subject="b-value", permanent=True))
    assert catalogs.read("t").schema("t", 1) is None
