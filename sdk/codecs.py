"""Payload codecs: encoders the client and the agent apply and the node never undoes.

    keys = conveyor.codecs.Keys({"shop-2": key2, "shop-1": key1}, current="shop-2")
    codec = conveyor.codecs.Chain(conveyor.codecs.Compression(), conveyor.codecs.Encryption(keys))
    app = conveyor.App("shop", codec=codec)            # the agent's side
    client = conveyor.Client(url, api_key, codec=codec)  # the caller's side

Rule 1 (where values cross): the client encodes what it sends (an enqueue's payload, an
event's payload, a schedule's payload) and decodes what it reads (payload, result, step
values). Inside the guest, the payload, the last checkpoint and the recorded step values are
decoded before the handler sees them, and the result, each checkpoint, each step's value and
each child's payload of ``ctx.parallel`` are encoded before they leave for the node.
Rule 2 (the envelope, ``conveyor.schemas.envelope``): an encoded value is one JSON object
``{"$codec": "conveyor/v1", "encoding": [...], "metadata": {...}, "data": "<base64>"}``.
``encoding`` lists the codecs applied, first first; decoding undoes them last first, each
codec taking off its own name. A value no codec changed (compression under its threshold, no
encryption) is sent as plain JSON, not wrapped, unless it holds a "$codec" key of its own (then
it is wrapped with an empty ``encoding``, so no reader takes it for an envelope).
Rule 3 (schemas): the node cannot read an envelope, so it skips a payload schema check for one;
the SDK validates a typed task's payload (its handler's annotation) before encoding it.
Rule 4 (keys): ``Encryption`` is envelope encryption. Each payload gets a fresh random data key
(AES-256-GCM); the data key is wrapped (AES key wrap) by the tenant's key-encryption key, and
the key's id travels in the envelope's metadata. Keys come from the user's ``KeyProvider``,
never from the node: to rotate, make a new key current and keep the old ones for decoding.
The key id, the codecs applied before and the envelope version are authenticated with the
data, so an altered envelope fails to decode instead of decoding to something else.

Not encoded: error messages and stacks of failed attempts, heartbeat progress, task types,
queues and every other field the platform routes by.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from conveyor.app import TaskType
from conveyor.errors import ContractError
from conveyor.schemas.envelope import ENVELOPE_KEY, ENVELOPE_VERSION, is_envelope
from conveyor.wire import TaskInfo

__all__ = [
    "Chain",
    "CodecError",
    "Compression",
    "Encryption",
    "KeyProvider",
    "Keys",
    "Payload",
    "PayloadCodec",
    "decode_tree",
    "decode_value",
    "decode_values",
    "describe",
    "encode_value",
    "encode_values",
    "load_codec",
]

COMPRESS_BYTES_MIN = 1024  # smaller payloads rarely shrink enough to pay for the envelope
DECODED_BYTES_MAX = 64 * 1024 * 1024  # a decompressed payload larger than this is refused
DATA_KEY_BYTES = 32  # AES-256 per payload
NONCE_BYTES = 12
WRAPPED_KEY_BYTES = DATA_KEY_BYTES + 8  # RFC 3394 adds one 8-byte block
AES_KEY_SIZES = (16, 24, 32)


class CodecError(ContractError):
    """A payload could not be encoded or decoded (a key missing, an altered envelope, a codec
    the chain does not have). The message names the cause; it never holds key material."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Payload:
    """One value on its way through a codec chain: its bytes, the codecs applied so far
    (first first) and what they need to undo it (a key id)."""

    data: bytes
    encoding: tuple[str, ...] = ()
    metadata: Mapping[str, str] = field(default_factory=dict)


@runtime_checkable
class PayloadCodec(Protocol):
    """Turns payloads into payloads. ``encode`` MUST append its name to ``encoding`` when it
    changed a payload (and leave one it did not change as it was); ``decode`` MUST undo only
    payloads whose last ``encoding`` is its name, remove that name, and pass the others on
    untouched. Both take and return lists in the same order, so a codec can batch."""

    def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """The payloads encoded, in order."""
        ...

    def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """The payloads with this codec's encoding undone, in order."""
        ...


class Chain:
    """Codecs applied in the order given (compress, then encrypt) and undone in reverse."""

    def __init__(self, *codecs: PayloadCodec) -> None:
        for codec in codecs:
            if not isinstance(codec, PayloadCodec):
                raise CodecError(
                    f"Chain takes payload codecs (encode and decode methods), got "
                    f"{type(codec).__name__}"
                )
        self.codecs = codecs

    def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Each codec's ``encode`` in the order given."""
        out = list(payloads)
        for codec in self.codecs:
            out = codec.encode(out)
        return out

    def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Each codec's ``decode``, last first."""
        out = list(payloads)
        for codec in reversed(self.codecs):
            out = codec.decode(out)
        return out


class Compression:
    """zlib, for payloads of at least ``threshold_bytes`` that it makes smaller."""

    name = "zlib"

    def __init__(self, threshold_bytes: int = COMPRESS_BYTES_MIN, level: int = 6) -> None:
        self.threshold_bytes = threshold_bytes
        self.level = level

    def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Compressed where a payload is at least the threshold and shrinks."""
        return [self._encode(p) for p in payloads]

    def _encode(self, payload: Payload) -> Payload:
        if len(payload.data) < self.threshold_bytes:
            return payload
        packed = zlib.compress(payload.data, self.level)
        if len(packed) >= len(payload.data):
            return payload
        return Payload(
            data=packed, encoding=(*payload.encoding, self.name), metadata=payload.metadata
        )

    def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Decompressed where "zlib" is the last encoding; others pass."""
        return [self._decode(p) if _last(p) == self.name else p for p in payloads]

    def _decode(self, payload: Payload) -> Payload:
        inflater = zlib.decompressobj()
        try:
            data = inflater.decompress(payload.data, DECODED_BYTES_MAX)
        except zlib.error as exc:
            raise CodecError(f"a zlib payload does not decompress ({exc}): it was altered") from exc
        if inflater.unconsumed_tail:
            raise CodecError(
                f"a zlib payload decompresses to more than {DECODED_BYTES_MAX} bytes; refused"
            )
        return Payload(data=data, encoding=payload.encoding[:-1], metadata=payload.metadata)


class KeyProvider(Protocol):
    """The tenant's key-encryption keys, held by the user (a file, a KMS, the environment),
    never by the platform."""

    def current(self) -> tuple[str, bytes]:
        """The id and key that new payloads are encrypted under."""
        ...

    def get(self, key_id: str) -> bytes | None:
        """The key of ``key_id``, or None when this provider does not have it."""
        ...

    def ids(self) -> Iterable[str]:
        """The ids of the keys it has (named in an error; never the keys themselves)."""
        ...


class Keys:
    """A fixed set of AES keys by id; ``current`` encrypts, every key decrypts. Rotate by
    adding a key and making it current; drop an old key only once nothing encrypted under it
    is still wanted."""

    def __init__(self, keys: Mapping[str, bytes], *, current: str) -> None:
        for key_id, key in keys.items():
            if not isinstance(key, bytes) or len(key) not in AES_KEY_SIZES:
                size = f"{len(key)} bytes" if isinstance(key, bytes) else type(key).__name__
                raise CodecError(
                    f"key {key_id!r} is {size}; a key-encryption key is 16, 24 or 32 bytes "
                    "(32: os.urandom(32))"
                )
        if current not in keys:
            raise CodecError(f"current={current!r} is not one of the keys: {sorted(keys)}")
        self._keys = dict(keys)
        self._current = current

    def current(self) -> tuple[str, bytes]:
        """The current key's id and bytes."""
        return self._current, self._keys[self._current]

    def get(self, key_id: str) -> bytes | None:
        """The key of ``key_id``, or None."""
        return self._keys.get(key_id)

    def ids(self) -> Iterable[str]:
        """The ids of the keys, sorted."""
        return sorted(self._keys)


class Encryption:
    """AES-256-GCM envelope encryption under the tenant's keys (rule 4). Needs the
    ``cryptography`` package: ``pip install 'conveyor[codecs]'``."""

    name = "aes-gcm"

    def __init__(self, keys: KeyProvider) -> None:
        try:
            from cryptography.hazmat.primitives import keywrap
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError as exc:  # an optional extra
            raise CodecError(
                "Encryption needs the cryptography package: pip install 'conveyor[codecs]'"
            ) from exc
        self._keys = keys
        self._aead = AESGCM
        self._keywrap = keywrap

    def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Each payload sealed under a fresh data key, wrapped by the current key."""
        key_id, kek = self._keys.current()
        return [self._encode(p, key_id, kek) for p in payloads]

    def _encode(self, payload: Payload, key_id: str, kek: bytes) -> Payload:
        data_key = os.urandom(DATA_KEY_BYTES)
        nonce = os.urandom(NONCE_BYTES)
        aad = _aad(key_id, payload.encoding)
        sealed = self._aead(data_key).encrypt(nonce, payload.data, aad)
        wrapped = self._keywrap.aes_key_wrap(kek, data_key)
        return Payload(
            data=wrapped + nonce + sealed,
            encoding=(*payload.encoding, self.name),
            metadata={**payload.metadata, "key_id": key_id},
        )

    def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        """Opened where "aes-gcm" is the last encoding (under the key its id names)."""
        return [self._decode(p) if _last(p) == self.name else p for p in payloads]

    def _decode(self, payload: Payload) -> Payload:
        from cryptography.exceptions import InvalidTag

        key_id = payload.metadata.get("key_id")
        if not isinstance(key_id, str):
            raise CodecError("an aes-gcm payload has no key_id in its metadata: it was altered")
        kek = self._keys.get(key_id)
        if kek is None:
            raise CodecError(
                f"the payload was encrypted under key {key_id!r}, which the key provider does "
                f"not have (it has: {', '.join(self._keys.ids()) or 'none'}); give it that "
                "key: after a rotation the old keys stay for decoding"
            )
        header = WRAPPED_KEY_BYTES + NONCE_BYTES
        wrapped, nonce, sealed = (
            payload.data[:WRAPPED_KEY_BYTES],
            payload.data[WRAPPED_KEY_BYTES:header],
            payload.data[header:],
        )
        aad = _aad(key_id, payload.encoding[:-1])
        try:
            data_key = self._keywrap.aes_key_unwrap(kek, wrapped)
            data = self._aead(data_key).decrypt(nonce, sealed, aad)
        except (InvalidTag, self._keywrap.InvalidUnwrap, ValueError) as exc:
            raise CodecError(
                f"an aes-gcm payload under key {key_id!r} failed its integrity check: it was "
                "altered, or encrypted under a different key of the same id"
            ) from exc
        metadata = {k: v for k, v in payload.metadata.items() if k != "key_id"}
        return Payload(data=data, encoding=payload.encoding[:-1], metadata=metadata)


def _last(payload: Payload) -> str | None:
    return payload.encoding[-1] if payload.encoding else None


def _aad(key_id: str, before: tuple[str, ...]) -> bytes:
    """What the ciphertext is bound to besides its bytes: the version, key id and the codecs
    applied before (so dropping "zlib" from an envelope cannot go unnoticed)."""
    return json.dumps([ENVELOPE_VERSION, key_id, list(before)]).encode()


# -- JSON values <-> envelopes ------------------------------------------------------------------


def encode_values(codec: PayloadCodec | None, values: Sequence[Any]) -> list[Any]:
    """``values`` (JSON) as the node should store them: envelopes, or the values themselves
    where no codec changed them (rule 2). One batch through the codec; a value that is an
    envelope already (one read without decoding, sent on) is not encoded twice."""
    if codec is None or not values:
        return list(values)
    at = [i for i, v in enumerate(values) if not _sealed(v)]
    encoded = codec.encode([Payload(data=_json_bytes(values[i])) for i in at])
    out = list(values)
    for i, p in zip(at, encoded, strict=True):
        if p.encoding or _MARK in p.data:
            out[i] = envelope(p)
    return out


def _sealed(value: Any) -> bool:
    """An envelope of this version already (read from the node, sent on): kept as it is."""
    return is_envelope(value) and value[ENVELOPE_KEY] == ENVELOPE_VERSION and "data" in value


# A plain value with this in it could be taken for an envelope: it goes wrapped (no codec).
_MARK = json.dumps(ENVELOPE_KEY).encode()


def encode_value(codec: PayloadCodec | None, value: Any) -> Any:
    """One value as ``encode_values`` stores it."""
    return encode_values(codec, [value])[0] if codec is not None else value


def decode_values(codec: PayloadCodec | None, values: Sequence[Any]) -> list[Any]:
    """The JSON values of ``values``: envelopes decoded, anything else as it is. Without a
    codec an envelope is left as it is (a reader with no keys sees it encoded)."""
    if codec is None:
        return list(values)
    at = [i for i, v in enumerate(values) if is_envelope(v)]
    if not at:
        return list(values)
    decoded = codec.decode([payload_of(values[i]) for i in at])
    out = list(values)
    for i, p in zip(at, decoded, strict=True):
        if p.encoding:
            raise CodecError(
                f"the payload is still encoded with {'+'.join(p.encoding)} after this codec "
                "chain decoded it: the chain lacks that codec"
            )
        try:
            out[i] = json.loads(p.data)
        except ValueError as exc:
            raise CodecError(f"a decoded payload is not JSON ({exc})") from exc
    return out


def decode_value(codec: PayloadCodec | None, value: Any) -> Any:
    """One value as ``decode_values`` reads it."""
    return decode_values(codec, [value])[0] if codec is not None else value


def decode_tree(codec: PayloadCodec | None, value: Any) -> Any:
    """``value`` with every envelope in it decoded, however deep (a parallel step's results,
    an event inside a wait's value, a reply listing steps). What an envelope decodes to is
    not looked into again."""
    if codec is None:
        return value
    if is_envelope(value):
        return decode_value(codec, value)
    if isinstance(value, dict):
        return {k: decode_tree(codec, v) for k, v in value.items()}
    if isinstance(value, list):
        return [decode_tree(codec, v) for v in value]
    return value


def envelope(payload: Payload) -> dict[str, Any]:
    """The JSON the node stores for an encoded ``payload`` (rule 2)."""
    body: dict[str, Any] = {ENVELOPE_KEY: ENVELOPE_VERSION, "encoding": list(payload.encoding)}
    if payload.metadata:
        body["metadata"] = dict(payload.metadata)
    body["data"] = base64.b64encode(payload.data).decode("ascii")
    return body


def payload_of(value: Any) -> Payload:
    """The ``Payload`` an envelope carries; ``CodecError`` naming what is wrong with it."""
    if not is_envelope(value):
        raise CodecError("not an encoded payload: it has no '$codec' field")
    version = value[ENVELOPE_KEY]
    if version != ENVELOPE_VERSION:
        raise CodecError(
            f"an envelope of version {version!r}; this SDK reads {ENVELOPE_VERSION!r}: upgrade it"
        )
    encoding, metadata, data = value.get("encoding"), value.get("metadata", {}), value.get("data")
    if not isinstance(encoding, list) or not all(isinstance(e, str) for e in encoding):
        raise CodecError("an envelope's 'encoding' is a list of codec names")
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CodecError("an envelope's 'metadata' is an object of strings")
    if not isinstance(data, str):
        raise CodecError("an envelope's 'data' is a base64 string")
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise CodecError(f"an envelope's 'data' is not base64 ({exc})") from exc
    return Payload(data=raw, encoding=tuple(encoding), metadata=metadata)


def describe(value: Any) -> str | None:
    """How an envelope reads without its keys: ``encoded (conveyor/v1, zlib+aes-gcm)``."""
    if not is_envelope(value):
        return None
    encoding = value.get("encoding")
    names = "+".join(str(e) for e in encoding) if isinstance(encoding, list) else "?"
    return f"encoded ({value[ENVELOPE_KEY]}, {names})"


def _json_bytes(value: Any) -> bytes:
    try:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()
    except (TypeError, ValueError) as exc:
        raise CodecError(
            f"only JSON values are encoded, got {type(value).__name__}: {exc}"
        ) from exc


def load_codec(ref: str) -> PayloadCodec:
    """The codec named by ``"package.module:attr"`` (an object, or a function returning one)."""
    import importlib

    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise CodecError(f"codec reference {ref!r} is not 'module:attr'", field="codec")
    obj: Any = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    if isinstance(obj, type) or (callable(obj) and not isinstance(obj, PayloadCodec)):
        obj = obj()  # a class or a factory
    if not isinstance(obj, PayloadCodec):
        raise CodecError(
            f"{ref} is a {type(obj).__name__}, not a payload codec (encode and decode)",
            field="codec",
        )
    return obj


# -- the clients' side (rule 1), shared by Client, AsyncClient and the testing engine ---------


def encode_bodies(
    codec: PayloadCodec | None,
    bodies: list[dict[str, Any]],
    tasks: Sequence[TaskType[Any, Any] | str] = (),
) -> list[dict[str, Any]]:
    """Enqueue (or schedule) bodies with their payloads encoded, in one batch. The payload of
    each typed task among ``tasks`` (in the order of ``bodies``) is first checked against
    its handler's annotation (rule 3): once encoded, the node cannot check it."""
    if codec is None:
        return bodies
    for task, body in zip(tasks, bodies, strict=False):
        if isinstance(task, TaskType):
            task.binding.check(body.get("payload"))
    payloads = encode_values(codec, [b.get("payload") for b in bodies])
    return [{**b, "payload": p} for b, p in zip(bodies, payloads, strict=True)]


def encode_schedule(
    codec: PayloadCodec | None, body: dict[str, Any], task: TaskType[Any, Any] | str
) -> dict[str, Any]:
    """A ``POST /v1/schedules`` body with its task's payload encoded (each firing enqueues
    that envelope as it is)."""
    if codec is None:
        return body
    return {**body, "task": encode_bodies(codec, [body["task"]], [task])[0]}


def decoded_info(codec: PayloadCodec | None, info: TaskInfo) -> TaskInfo:
    """``info`` with its payload, result and checkpoint decoded."""
    if codec is None:
        return info
    payload, result, checkpoint = decode_values(codec, [info.payload, info.result, info.checkpoint])
    return dataclasses.replace(info, payload=payload, result=result, checkpoint=checkpoint)
