"""Searchable payload fields (streams/gateway/payload_fields.py): what an enqueue keeps of a
payload, what a listing's ``payload.<field>=<value>`` asks for, and the spec that carries them."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from conveyor.errors import ContractError
from conveyor.streams.gateway import payload_fields
from conveyor.streams.gateway.payload_fields import (
    FIELDS_BYTES_MAX,
    FIELDS_MAX,
    extract,
    parse_search,
    scalar,
)
from conveyor.streams.gateway.payloads import INLINE_BYTES_MAX
from conveyor.streams.gateway.validation import parse_list_query, parse_task, to_spec


def _fields(payload: Any) -> dict[str, Any] | None:
    text = extract(payload)
    return None if text is None else json.loads(text)


def test_the_top_level_scalars_of_an_object_are_kept_in_order() -> None:
    payload = {
        "customer": "acme",
        "n": 3,
        "ratio": 0.5,
        "vip": True,
        "note": None,
        "items": [1, 2],
        "address": {"city": "Oslo"},
    }
    text = extract(payload)
    assert text == '{"customer":"acme","n":3,"ratio":0.5,"vip":true,"note":null}'


@pytest.mark.parametrize("payload", [None, 3, "acme", [{"customer": "acme"}], {}, {"a": [1]}])
def test_a_payload_without_top_level_scalars_has_no_fields(payload: Any) -> None:
    assert extract(payload) is None


def test_an_encoded_payload_is_never_searchable() -> None:
    envelope = {"$codec": "conveyor/v1", "encoding": ["zlib"], "metadata": {}, "data": "eJw="}
    assert extract(envelope) is None


def test_fields_are_capped_in_count_and_in_bytes() -> None:
    many = {f"f{i}": i for i in range(40)}
    assert list(_fields(many) or {}) == [f"f{i}" for i in range(FIELDS_MAX)]
    long = {"a": "x" * FIELDS_BYTES_MAX, "customer": "acme", "b": "y" * 1500, "c": "z" * 1500}
    kept = _fields(long) or {}
    assert list(kept) == ["customer", "b"]  # "a" alone is too long; "c" would pass the bound
    assert len((extract(long) or "").encode()) <= FIELDS_BYTES_MAX


def test_names_a_search_could_not_name_and_values_jsonb_cannot_hold_are_skipped() -> None:
    payload = {"with space": 1, "ok.name:v-1_x": 2, "zero": "a\x00b", "nan": float("nan")}
    assert _fields(payload) == {"ok.name:v-1_x": 2}
    assert _fields({"customer": "Åse ✓"}) == {"customer": "Åse ✓"}


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("acme", "acme"),
        ("3", 3),
        ("-2.5", -2.5),
        ("true", True),
        ("null", None),
        ('"3"', "3"),  # quoted: the string
        ("[1]", "[1]"),  # not a scalar: the text
        ("NaN", "NaN"),
        ("1e999", "1e999"),
    ],
)
def test_a_searched_value_is_the_json_scalar_it_spells_else_a_string(text: str, value: Any) -> None:
    assert scalar(text) == value and type(scalar(text)) is type(value)


def test_a_search_is_the_object_the_fields_must_contain() -> None:
    pairs = [("payload.customer", "acme"), ("status", "FAILED"), ("payload.n", "3")]
    assert parse_search(pairs) == '{"customer":"acme","n":3}'
    assert parse_search([("status", "FAILED")]) is None
    assert parse_search([("payload.n", "3"), ("payload.n", "3")]) == '{"n":3}'
    # OpenAPI's deepObject style of the same search
    assert parse_search([("payload[customer]", "acme"), ("payload.n", "3")]) == (
        '{"customer":"acme","n":3}'
    )


@pytest.mark.parametrize(
    ("pairs", "field", "says"),
    [
        ([("payload.cust omer", "acme")], "payload.cust omer", "U+0020 at index 4"),
        ([("payload.", "acme")], "payload.", "1..200 characters"),
        ([("payload.n", "1"), ("payload.n", "2")], "payload.n", "twice"),
        ([("payload.t", "x" * 3000)], "payload.t", "at most 2048 bytes"),
        ([(f"payload.f{i}", "1") for i in range(17)], "payload.f16", "at most 16"),
        ([("payload.note", "a\x00b")], "payload.note", "U+0000"),
        ([("payload", "acme")], "payload", "is not a filter"),
        ([("payloads.customer", "acme")], "payloads.customer", "is not a filter"),
        ([("payload[a b]", "1")], "payload[a b]", "U+0020 at index 1"),
    ],
)
def test_a_bad_search_is_refused_naming_the_field(
    pairs: list[tuple[str, str]], field: str, says: str
) -> None:
    with pytest.raises(ContractError, match=re.escape(says)) as caught:
        parse_search(pairs)
    assert caught.value.field == field


def test_the_listing_query_takes_payload_pairs_beside_its_filters() -> None:
    query = parse_list_query({"payload.customer": "acme", "queue": "emails"})
    assert query.filter.payload_fields == '{"customer":"acme"}'
    assert query.filter.queue == "emails"
    with pytest.raises(ContractError, match=r"payload\.a b"):
        parse_list_query({"payload.a b": "1"})
    with pytest.raises(ContractError, match="payloads"):  # an unknown filter is still refused
        parse_list_query({"payloads.customer": "acme"})


def _spec(body: dict[str, Any], *, payload: bytes | None = None, searchable: bool = True) -> Any:
    req = parse_task({"task_type": "t", "app": "a", **body})
    packed = req.payload if payload is None else payload
    return to_spec(req, task_id="", tenant="x", payload=packed, now_ms=0, searchable=searchable)


def test_the_spec_keeps_the_fields_of_an_inline_visible_payload_only() -> None:
    body = {"payload": {"customer": "acme", "lines": [1, 2]}}
    assert _spec(body).payload_fields == '{"customer":"acme"}'
    assert _spec(body, searchable=False).payload_fields is None  # the tenant hides payloads
    marker = b'{"$blob":"x"}'  # stored as a blob: past the inline limit
    assert _spec(body, payload=marker).payload_fields is None
    assert _spec({"payload": [1]}).payload_fields is None
    assert INLINE_BYTES_MAX > FIELDS_BYTES_MAX
    assert payload_fields.SEARCH_PREFIX == "payload"
