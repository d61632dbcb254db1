"""API keys with roles in keys.json: parsed strictly, a bad entry named (never whole), legacy
entries kept as keys of both roles with one warning per load, and what each role may call."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from conveyor.errors import Forbidden
from conveyor.streams.clock import FakeClock
from conveyor.streams.gateway.auth import (
    BOTH_ROLES,
    KeyStore,
    Role,
    agent_grant,
    client_grant,
    create_key,
    ensure_agent_key,
    ensure_dev_key,
    parse_keys,
)

SECRET = "cvk_SECRETSECRETSECRET"


def write(home: Path, keys: dict[str, object]) -> None:
    (home / "keys.json").write_text(json.dumps({"keys": keys}))


def test_roles_parse_into_grants() -> None:
    grants = parse_keys(
        {
            "keys": {
                "c": {"tenant": "acme", "role": "client"},
                "a": {"tenant": "acme", "role": "agent", "app": "shop"},
                "v": {"tenant": "acme", "role": "agent", "app": "shop", "version": "v3"},
                "old": {"tenant": "acme"},
            }
        }
    )
    assert grants["c"] == client_grant("acme")
    assert grants["a"] == agent_grant("acme", "shop")
    assert grants["v"] == agent_grant("acme", "shop", "v3")
    assert grants["old"].roles == BOTH_ROLES and grants["old"].app is None
    assert grants["old"].legacy and not grants["a"].legacy


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"tenant": "t", "role": "admin"}, '"role" must be "client" or "agent", got \'admin\''),
        ({"tenant": "t", "role": "agent"}, 'an agent key needs an "app" string'),
        ({"tenant": "t", "role": "agent", "app": ""}, "'app' must be a non-empty string"),
        ({"tenant": "t", "role": "agent", "app": "s", "version": 3}, "'version' must be a non"),
        ({"tenant": "t", "role": "client", "app": "shop"}, "a client key is not bound to an app"),
        ({"tenant": "t", "role": "client", "tenants": "x"}, "unknown field 'tenants'"),
        ({"tenant": "t", "app": "shop"}, '"app" and "version" bind an agent key'),
        ({"role": "client"}, 'needs a "tenant" string'),
        ("t", 'must be an object with a "tenant" string'),
    ],
)
def test_a_bad_entry_is_named_by_its_prefix_never_whole(entry: object, message: str) -> None:
    with pytest.raises(ValueError) as err:
        parse_keys({"keys": {SECRET: entry}})
    assert message in str(err.value)
    assert "keys[cvk_SE...]" in str(err.value) and SECRET not in str(err.value)


def test_a_client_key_may_call_the_client_api_only() -> None:
    grant = client_grant("acme")
    grant.check_path("/v1/tasks")
    grant.check_path("/v1/tenants/me/usage")
    with pytest.raises(Forbidden, match=r"use an agent key|an agent key bound to its app"):
        grant.check_path("/worker/poll")


def test_an_agent_key_may_call_the_worker_protocol_of_its_app_only() -> None:
    grant = agent_grant("acme", "shop")
    grant.check_path("/worker/complete")
    with pytest.raises(Forbidden, match="can only call the worker protocol"):
        grant.check_path("/v1/tasks")
    grant.check_app("shop", "v1")
    grant.check_app("shop", None)
    with pytest.raises(Forbidden, match="bound to app 'shop', not 'billing'") as err:
        grant.check_app("billing", None)
    assert err.value.field == "app"
    assert grant.serves("shop") and not grant.serves("billing")


def test_a_version_bound_agent_key_polls_that_version_only() -> None:
    grant = agent_grant("acme", "shop", "v3")
    grant.check_app("shop", "v3")
    for version in ("v4", None):
        with pytest.raises(Forbidden, match="bound to version 'v3'") as err:
            grant.check_app("shop", version)
        assert err.value.field == "version"


def test_a_legacy_key_may_do_both_for_any_app() -> None:
    grant = parse_keys({"keys": {"k": {"tenant": "acme"}}})["k"]
    grant.check_path("/v1/tasks")
    grant.check_path("/worker/poll")
    grant.check_app("anything", "v9")
    assert grant.serves("anything")


def test_legacy_entries_warn_once_per_load_without_the_key(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    write(tmp_path, {SECRET: {"tenant": "acme"}, "cvk_new": {"tenant": "acme", "role": "client"}})
    with caplog.at_level(logging.WARNING, logger="conveyor.gateway"):
        store = KeyStore.load(tmp_path, clock=clock)
        for _ in range(3):
            clock.advance(1_000)
            assert store.tenant(SECRET) == "acme"
    warnings = [r.getMessage() for r in caplog.records if "deprecated" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "1 key(s)" in warnings[0] and "cvk_SE... of 'acme'" in warnings[0]
    assert SECRET not in caplog.text and '"role": "client"' in warnings[0]

    caplog.clear()
    write(tmp_path, {SECRET: {"tenant": "acme"}, "cvk_other": {"tenant": "beta"}})
    with caplog.at_level(logging.WARNING, logger="conveyor.gateway"):
        clock.advance(1_000)
        assert store.tenant("cvk_other") == "beta"  # re-read: a new load, one new warning
        clock.advance(1_000)
        store.tenant("cvk_other")
    assert sum("deprecated" in r.getMessage() for r in caplog.records) == 1


def test_a_file_with_roles_only_warns_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    write(tmp_path, {"cvk_a": {"tenant": "acme", "role": "client"}})
    with caplog.at_level(logging.WARNING, logger="conveyor.gateway"):
        KeyStore.load(tmp_path)
    assert caplog.records == []


def test_create_key_adds_an_entry_atomically_and_keeps_the_rest(tmp_path: Path) -> None:
    doc = {"keys": {"cvk_old": {"tenant": "acme"}}, "tenants": {"acme": {"show_payloads": False}}}
    (tmp_path / "keys.json").write_text(json.dumps(doc))
    key = create_key(tmp_path, agent_grant("acme", "shop", "v3"))
    stored = json.loads((tmp_path / "keys.json").read_text())
    assert stored["tenants"] == doc["tenants"] and stored["keys"]["cvk_old"] == {"tenant": "acme"}
    entry = {"tenant": "acme", "role": "agent", "app": "shop", "version": "v3"}
    assert stored["keys"][key] == entry
    assert os.stat(tmp_path / "keys.json").st_mode & 0o777 == 0o600
    assert KeyStore.load(tmp_path).grant(key) == agent_grant("acme", "shop", "v3")


def test_create_key_leaves_a_broken_file_alone(tmp_path: Path) -> None:
    write(tmp_path, {"cvk_a": {"tenant": "acme", "role": "root"}})
    before = (tmp_path / "keys.json").read_text()
    with pytest.raises(ValueError, match='"role" must be'):
        create_key(tmp_path, client_grant("acme"))
    assert (tmp_path / "keys.json").read_text() == before


def test_dev_keys_are_a_client_key_and_an_agent_key_of_the_app(tmp_path: Path) -> None:
    client = ensure_dev_key(tmp_path)
    agent = ensure_agent_key(tmp_path, "devshop")
    assert (ensure_dev_key(tmp_path), ensure_agent_key(tmp_path, "devshop")) == (client, agent)
    store = KeyStore.load(tmp_path)
    assert store.grant(client) == client_grant("default")
    assert store.grant(agent) == agent_grant("default", "devshop")
    assert ensure_agent_key(tmp_path, "other") not in (client, agent)


def test_a_home_with_a_legacy_dev_key_keeps_it_for_clients(tmp_path: Path) -> None:
    write(tmp_path, {"cvk_legacy": {"tenant": "default"}})
    assert ensure_dev_key(tmp_path) == "cvk_legacy"
    agent = ensure_agent_key(tmp_path, "devshop")  # the embedded agent gets a scoped key
    assert KeyStore.load(tmp_path).grant(agent) == agent_grant("default", "devshop")
    assert Role.AGENT in KeyStore.load(tmp_path).grant("cvk_legacy").roles  # type: ignore[union-attr]
