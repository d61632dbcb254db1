"""Confluent's wire format and the Avro datum of an ingest record, as plain JSON.

A value in Confluent's wire format::

    byte 0     1..4                  5..
    | 0x00 | schema id (big-endian) | Avro binary datum (schemaless) |

The datum is read with the schema the id names (the writer's) resolved to the task type's
current payload schema (the reader's), as Avro schema resolution says; then it becomes the
plain JSON a client would send (``streams/registry/payloads.py``): records are objects,
unions are their value (no ``{"type": value}`` wrapper), enums their symbol, bytes and
fixed a string of code points 0-255 (Avro's JSON encoding of bytes). Logical types are read
as the type under them (a ``timestamp-millis`` is its long, a ``decimal`` its bytes), so a
payload holds what its producer wrote, never a Python object that JSON cannot carry.

Every fault is a ``WireError`` naming what was wrong; the router quarantines the record with
that reason (``router.py``).
"""

from __future__ import annotations

import functools
import io
import json
import math
import struct
from typing import Any

from fastavro import parse_schema, schemaless_reader, schemaless_writer

MAGIC = 0
HEADER = struct.Struct(">bI")  # magic byte, schema id
PARSED_MAX = 1_024  # parsed (writer, reader) schema pairs kept


class WireError(ValueError):
    """A value that is not a datum of the schema it names; the message says what is wrong."""


def frame(schema_id: int, datum: bytes) -> bytes:
    """``datum`` behind Confluent's 5-byte header."""
    return HEADER.pack(MAGIC, schema_id) + datum


def schema_id_of(value: bytes | None) -> int:
    """The schema id of a value in Confluent's wire format; WireError if it is not one."""
    if value is None:
        raise WireError("the record has no value (a tombstone); send an Avro datum")
    if len(value) < HEADER.size:
        raise WireError(
            f"the value is {len(value)} bytes, shorter than Confluent's 5-byte header "
            "(magic byte 0, schema id); serialize it with an Avro serializer of the registry"
        )
    magic, schema_id = HEADER.unpack_from(value)
    if magic != MAGIC:
        raise WireError(
            f"the value starts with magic byte {magic & 0xFF}, not 0: it is not in Confluent's "
            "wire format; serialize it with an Avro serializer of the registry"
        )
    return int(schema_id)


def encode(schema: str, value: Any) -> bytes:
    """``value`` as the Avro binary datum of ``schema`` (tests, benches and the events
    relay's encoder)."""
    buf = io.BytesIO()
    schemaless_writer(buf, _parsed(schema), value)
    return buf.getvalue()


def decode(value: bytes, writer: str, reader: str) -> Any:
    """The datum after the header of ``value``, written with ``writer`` and read as
    ``reader``, as the plain JSON value of a payload. WireError if it is not such a datum."""
    buf = io.BytesIO(value)
    buf.seek(HEADER.size)
    resolved = None if reader == writer else _parsed(reader)
    try:
        datum = schemaless_reader(buf, _parsed(writer), resolved)
    except EOFError:
        raise WireError("the Avro datum is truncated: it ends before its schema does") from None
    except Exception as exc:  # fastavro raises many types for a datum or schemas that don't fit
        raise WireError(f"the Avro datum does not decode with its schema: {exc}") from None
    if buf.tell() != len(value):
        raise WireError(
            f"{len(value) - buf.tell()} bytes follow the Avro datum: the value holds more than "
            "one datum of its schema"
        )
    return _plain(datum)


def _plain(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode("latin-1")
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise WireError(f"the datum holds {value}, which JSON cannot carry")
    return value


@functools.lru_cache(maxsize=PARSED_MAX)
def _parsed(schema: str) -> Any:
    """A schema's text parsed without its logical types (see the module's docstring)."""
    try:
        return parse_schema(_without_logical(json.loads(schema)), _write_hint=False)
    except Exception as exc:  # not JSON, or not Avro: fastavro raises several types
        raise WireError(f"the registered schema does not parse: {exc}") from None


def _without_logical(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _without_logical(v) for k, v in node.items() if k != "logicalType"}
    if isinstance(node, list):
        return [_without_logical(v) for v in node]
    return node
