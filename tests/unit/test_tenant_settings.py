"""Per-tenant settings in keys.json: parsed strictly, re-read with the keys, and the marker
that replaces a hidden payload cannot be forged by a client."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conveyor.errors import ContractError
from conveyor.streams.clock import FakeClock
from conveyor.streams.gateway.auth import KeyStore
from conveyor.streams.gateway.payloads import check_not_marker
from conveyor.streams.gateway.tenants import HIDDEN, TenantSettings, parse_tenants


def write(home: Path, tenants: object) -> None:
    doc = {"keys": {"key-a-0123456789": {"tenant": "alpha"}}, "tenants": tenants}
    (home / "keys.json").write_text(json.dumps(doc))


def test_defaults_show_payloads() -> None:
    assert parse_tenants({}) == {}
    assert parse_tenants({"tenants": {"alpha": {}}}) == {"alpha": TenantSettings()}
    assert TenantSettings().show_payloads is True


@pytest.mark.parametrize(
    ("tenants", "message"),
    [
        ([], '"tenants" must be an object'),
        ({"alpha": True}, "tenants.alpha must be an object"),
        ({"alpha": {"show_payload": False}}, "tenants.alpha.show_payload: unknown setting"),
        ({"alpha": {"show_payloads": "no"}}, "tenants.alpha.show_payloads must be true or false"),
    ],
)
def test_a_bad_setting_is_named_never_ignored(tenants: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_tenants({"tenants": tenants})


def test_keystore_rereads_settings_with_the_keys(tmp_path: Path) -> None:
    clock = FakeClock()
    write(tmp_path, {"alpha": {"show_payloads": False}})
    store = KeyStore.load(tmp_path, clock=clock)
    assert store.settings("alpha").show_payloads is False
    assert store.settings("beta").show_payloads is True  # no entry: the default

    write(tmp_path, {"alpha": {"show_payloads": True}, "beta": {"show_payloads": False}})
    clock.advance(1_000)
    assert store.settings("alpha").show_payloads is True
    assert store.settings("beta").show_payloads is False

    # A broken section keeps what was read last (hiding stays hidden).
    (tmp_path / "keys.json").write_text(json.dumps({"keys": {}, "tenants": {"beta": 1}}))
    clock.advance(1_000)
    assert store.settings("beta").show_payloads is False
    assert store.tenant("key-a-0123456789") == "alpha"


@pytest.mark.parametrize("value", [HIDDEN, {"$hidden": True}, {"$blob": "sha256:00"}])
def test_clients_cannot_send_a_marker(value: object) -> None:
    with pytest.raises(ContractError, match="is reserved"):
        check_not_marker(value, "payload")


def test_objects_that_merely_contain_a_marker_key_are_payloads() -> None:
    check_not_marker({"$hidden": 1, "other": 2}, "payload")
    check_not_marker([HIDDEN], "payload")
