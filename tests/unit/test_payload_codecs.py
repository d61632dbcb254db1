"""``conveyor.codecs``: the chain, compression, envelope encryption, and the envelope."""

from __future__ import annotations

import base64
import json
import os
from typing import Any

import pytest

from conveyor.codecs import (
    Chain,
    CodecError,
    Compression,
    Encryption,
    Keys,
    Payload,
    decode_tree,
    decode_value,
    decode_values,
    describe,
    encode_value,
    encode_values,
    load_codec,
    payload_of,
)
from conveyor.schemas.envelope import is_envelope
from conveyor.streams.registry.payloads import mismatch

KEY_1, KEY_2 = os.urandom(32), os.urandom(32)
BIG = {"text": "lorem ipsum dolor sit amet " * 200, "n": 7}  # compresses well, > 1 KiB


def chain(keys: Keys | None = None) -> Chain:
    keys = keys or Keys({"k1": KEY_1}, current="k1")
    return Chain(Compression(), Encryption(keys))


@pytest.mark.parametrize(
    "value", [None, 0, "é ☃", [1, {"a": None}], {"nested": {"$codec": "looks like one"}}, BIG]
)
def test_a_value_round_trips_through_the_chain_as_an_opaque_envelope(value: Any) -> None:
    codec = chain()
    sealed = encode_value(codec, value)
    assert is_envelope(sealed)
    assert sealed["metadata"] == {"key_id": "k1"}
    # Nothing of the plaintext shows in what the node would store.
    assert "lorem" not in json.dumps(sealed) and "looks like one" not in json.dumps(sealed)
    assert decode_value(codec, sealed) == value


def test_compression_applies_only_above_its_threshold_and_names_itself() -> None:
    codec = chain()
    assert encode_value(codec, {"small": 1})["encoding"] == ["aes-gcm"]
    assert encode_value(codec, BIG)["encoding"] == ["zlib", "aes-gcm"]
    # Compression alone leaves a small value plain JSON (no codec changed it: no envelope).
    alone = Compression()
    assert encode_value(alone, {"small": 1}) == {"small": 1}
    packed = encode_value(alone, BIG)
    assert packed["encoding"] == ["zlib"] and len(packed["data"]) < len(json.dumps(BIG)) / 4
    assert decode_value(alone, packed) == BIG
    # A plain value that looks like an envelope is wrapped, so no reader mistakes it.
    lookalike = {"$codec": "mine", "n": 1}
    wrapped = encode_value(alone, lookalike)
    assert wrapped["encoding"] == [] and decode_value(alone, wrapped) == lookalike
    assert decode_tree(alone, [wrapped]) == [lookalike]
    assert describe(encode_value(codec, BIG)) == "encoded (conveyor/v1, zlib+aes-gcm)"


def test_every_payload_gets_its_own_data_key_and_nonce() -> None:
    codec = chain()
    a, b = encode_values(codec, ["same", "same"])
    assert a["data"] != b["data"]
    assert decode_values(codec, [a, b, "plain"]) == ["same", "same", "plain"]


def _altered(envelope: dict[str, Any], at: int) -> dict[str, Any]:
    raw = bytearray(base64.b64decode(envelope["data"]))
    raw[at] ^= 0x01
    return {**envelope, "data": base64.b64encode(bytes(raw)).decode()}


@pytest.mark.parametrize("at", [0, 45, -1], ids=["wrapped key", "nonce", "ciphertext"])
def test_an_altered_byte_fails_the_integrity_check(at: int) -> None:
    codec = chain()
    sealed = encode_value(codec, {"amount": 100})
    with pytest.raises(CodecError, match="failed its integrity check: it was altered"):
        decode_value(codec, _altered(sealed, at))


def test_altered_metadata_is_caught_too() -> None:
    """The codecs applied before encryption are authenticated: dropping "zlib" from the
    envelope (so the ciphertext would be read as uncompressed) is refused, not misread."""
    codec = chain(Keys({"k1": KEY_1, "k2": KEY_1}, current="k1"))
    sealed = encode_value(codec, BIG)
    with pytest.raises(CodecError, match="integrity check"):
        decode_value(codec, {**sealed, "encoding": ["aes-gcm"]})
    # Another id naming the same key bytes: the id is bound to the data as well.
    with pytest.raises(CodecError, match="integrity check"):
        decode_value(codec, {**sealed, "metadata": {"key_id": "k2"}})


def test_an_unknown_key_id_names_the_key_and_what_to_do_without_echoing_keys() -> None:
    old = chain(Keys({"shop-1": KEY_1}, current="shop-1"))
    sealed = encode_value(old, "secret")
    new = chain(Keys({"shop-2": KEY_2}, current="shop-2"))
    with pytest.raises(CodecError) as raised:
        decode_value(new, sealed)
    message = str(raised.value)
    assert "'shop-1'" in message and "it has: shop-2" in message
    assert "old keys stay for decoding" in message
    for key in (KEY_1, KEY_2):
        assert key.hex() not in message and base64.b64encode(key).decode() not in message


def test_rotation_encrypts_under_the_new_key_and_still_decodes_the_old() -> None:
    before = chain(Keys({"shop-1": KEY_1}, current="shop-1"))
    old = encode_value(before, {"v": 1})
    after = chain(Keys({"shop-1": KEY_1, "shop-2": KEY_2}, current="shop-2"))
    new = encode_value(after, {"v": 2})
    assert (old["metadata"]["key_id"], new["metadata"]["key_id"]) == ("shop-1", "shop-2")
    assert decode_values(after, [old, new]) == [{"v": 1}, {"v": 2}]
    retired = chain(Keys({"shop-2": KEY_2}, current="shop-2"))
    assert decode_value(retired, new) == {"v": 2}
    with pytest.raises(CodecError, match="'shop-1'"):
        decode_value(retired, old)


def test_a_chain_missing_a_codec_says_which() -> None:
    sealed = encode_value(chain(), BIG)
    with pytest.raises(CodecError, match="still encoded with zlib"):
        decode_value(Encryption(Keys({"k1": KEY_1}, current="k1")), sealed)


def test_bad_keys_and_envelopes_are_refused_by_name() -> None:
    with pytest.raises(CodecError, match="key 'short' is 5 bytes; a key-encryption key is 16"):
        Keys({"short": b"12345"}, current="short")
    with pytest.raises(CodecError, match="current='k9' is not one of the keys"):
        Keys({"k1": KEY_1}, current="k9")
    with pytest.raises(CodecError, match="version 'conveyor/v9'"):
        payload_of({"$codec": "conveyor/v9", "encoding": [], "data": ""})
    with pytest.raises(CodecError, match="'data' is not base64"):
        payload_of({"$codec": "conveyor/v1", "encoding": ["zlib"], "data": "!!"})
    with pytest.raises(CodecError, match="Chain takes payload codecs"):
        Chain(object())  # type: ignore[arg-type]


def test_a_decompression_bomb_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import conveyor.codecs as codecs

    monkeypatch.setattr(codecs, "DECODED_BYTES_MAX", 10_000)
    packed = encode_value(Compression(), "0" * 20_000)
    with pytest.raises(CodecError, match="more than 10000 bytes"):
        decode_value(Compression(), packed)


def test_decode_tree_decodes_envelopes_wherever_they_sit() -> None:
    codec = chain()
    results = encode_values(codec, [1, {"b": 2}])
    step = {"results": results, "errors": {}, "payload": encode_value(codec, "event")}
    assert decode_tree(codec, step) == {"results": [1, {"b": 2}], "errors": {}, "payload": "event"}
    # Without a codec an envelope stays as it is: a reader without keys sees it encoded.
    assert decode_tree(None, step) == step


def test_the_node_skips_its_schema_check_for_an_envelope() -> None:
    """The node cannot read an encoded payload; the SDK checked it before encoding."""
    schema = json.dumps(
        {"type": "record", "name": "P", "fields": [{"name": "to", "type": "string"}]}
    )
    assert mismatch(schema, b'{"to": 5}') == ".to: expected string, got 5"
    sealed = encode_value(chain(), {"to": 5})
    assert mismatch(schema, json.dumps(sealed).encode()) is None


def test_a_payload_is_data_plus_what_was_applied() -> None:
    assert Payload(data=b"x").encoding == ()
    assert Encryption(Keys({"k": KEY_1}, current="k")).decode([Payload(data=b"x")]) == [
        Payload(data=b"x")
    ]


codec_for_load = Chain(Compression())


def make_codec() -> Chain:
    return Chain(Compression())


def test_load_codec_takes_an_object_or_a_factory() -> None:
    assert load_codec(f"{__name__}:codec_for_load") is codec_for_load
    assert isinstance(load_codec(f"{__name__}:make_codec"), Chain)
    with pytest.raises(CodecError, match="not 'module:attr'"):
        load_codec("nocolon")
    with pytest.raises(CodecError, match="not a payload codec"):
        load_codec(f"{__name__}:BIG")
