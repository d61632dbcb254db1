"""JSON values in and out of records: inline up to ``INLINE_BYTES_MAX``, else by blob reference.

A large payload (or result, or checkpoint) is stored in the blob store and the record carries
``{"$blob": "sha256:..."}`` instead; everything the gateway hands out resolves it back, so the
SDK and handlers never see the marker. Clients may not send a value of that exact shape (the
validators reject it), so a marker in a record is always ours.
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from conveyor.store.blobs import Blobs, is_ref
from conveyor.streams.gateway.errors import PayloadTooLarge
from conveyor.streams.gateway.fields import compact, invalid
from conveyor.streams.gateway.tenants import HIDDEN_MARKER

INLINE_BYTES_MAX = 256 * 1024
BLOB_MARKER = "$blob"
_MARKER_HEAD = b'{"$blob":"'


def check_not_marker(value: Any, path: str) -> None:
    """Markers are ours: ``$blob`` (a blob reference) and ``$hidden`` (tenants.HIDDEN)."""
    if isinstance(value, dict) and len(value) == 1:
        (key,) = value
        if key in (BLOB_MARKER, HIDDEN_MARKER):
            raise invalid(path, f'an object whose only key is "{key}" is reserved')


class Payloads:
    def __init__(self, blobs: Blobs | None) -> None:
        self.blobs = blobs

    async def pack(self, data: bytes, field: str) -> bytes:
        """What a record stores for the compact JSON ``data``."""
        if len(data) <= INLINE_BYTES_MAX:
            return data
        if self.blobs is None:
            raise PayloadTooLarge(
                f"{field}: {len(data)} bytes is over the inline limit of {INLINE_BYTES_MAX} and "
                "this node has no blob store",
                field=field,
            )
        ref = await asyncio.to_thread(self.blobs.put, data)
        return compact({BLOB_MARKER: ref})

    async def unpack(self, stored: bytes | None) -> bytes | None:
        """The compact JSON a record stands for (the blob's bytes for a marker)."""
        if stored is None or not stored.startswith(_MARKER_HEAD):
            return stored
        ref = json.loads(stored).get(BLOB_MARKER)
        if self.blobs is None or not isinstance(ref, str) or not is_ref(ref):
            raise RuntimeError(f"record refers to blob {ref!r} but it cannot be read here")
        return await asyncio.to_thread(self.blobs.get, ref)

    async def value(self, stored: bytes | None) -> Any:
        """The JSON value a record stands for; None for no value."""
        return decode(await self.unpack(stored))


def decode(data: bytes | None) -> Any:
    """JSON bytes as a value. Records written by other producers may hold non-JSON bytes; those
    come out as ``{"$base64": ...}`` rather than failing the whole response."""
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return {"$base64": base64.b64encode(data).decode("ascii")}
