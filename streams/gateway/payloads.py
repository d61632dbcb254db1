"""JSON values in and out of records: inline up to ``INLINE_BYTES_MAX``, else by blob reference.

A large payload (or result, or checkpoint) is stored in the blob store, under the tenant of the
record, and the record carries a reference instead; everything the gateway hands out resolves
it back, so the SDK and handlers never see it.

Rule 1 (no forged references): a reference is stored as `` {"$blob":"sha256:…"}``, with a
leading space. Every value a client sends is stored as compact JSON (``fields.compact``), which
never starts with a space, so no client value can read back as a reference, whatever keys it
holds; and a reference is read in its record's tenant only (``store/blobs.py``), so no record of
one tenant can name another's blob. (It stays valid JSON: a reader that does not resolve it,
such as a parallel step's results that hold a child's large result, sees an object.)
Rule 2 (old records): records written before rule 1 hold ``{"$blob":"sha256:…"}`` without the
space, for a blob in the shared area. Such a value is a reference only when ``$blob`` is its
only key; clients may not send that shape (``check_not_marker``: a 400), so it still comes only
from old records, while ``{"$blob": …, "x": 1}`` is plain data.
Rule 3 (missing blobs): a reference whose blob cannot be read raises ``PayloadUnavailable``,
``permanent`` when the store answered that the blob is gone or damaged, not when the store could
not be reached; the caller decides what the task does (``service.py``).
"""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

from conveyor.store.blobs import BlobCorrupt, BlobNotFound, Blobs, is_ref
from conveyor.streams.gateway.errors import PayloadTooLarge
from conveyor.streams.gateway.fields import compact, invalid
from conveyor.streams.gateway.tenants import HIDDEN_MARKER

INLINE_BYTES_MAX = 256 * 1024
BLOB_MARKER = "$blob"
_REF_HEAD = b' {"$blob":"'  # rule 1
_OLD_REF_HEAD = b'{"$blob":"'  # rule 2


class PayloadUnavailable(Exception):
    """A record's value is in a blob that cannot be read (rule 3)."""

    def __init__(self, message: str, *, permanent: bool) -> None:
        super().__init__(message)
        self.permanent = permanent


def check_not_marker(value: Any, path: str) -> None:
    """Markers are ours: ``$blob`` (an old record's blob reference, rule 2) and ``$hidden``
    (tenants.HIDDEN), each as the only key of an object."""
    if isinstance(value, dict) and len(value) == 1:
        (key,) = value
        if key in (BLOB_MARKER, HIDDEN_MARKER):
            raise invalid(path, f'an object whose only key is "{key}" is reserved')


class Payloads:
    def __init__(self, blobs: Blobs | None) -> None:
        self.blobs = blobs

    async def pack(self, tenant: str, data: bytes, field: str) -> bytes:
        """What a record of ``tenant`` stores for the compact JSON ``data``."""
        if len(data) <= INLINE_BYTES_MAX:
            return data
        if self.blobs is None:
            raise PayloadTooLarge(
                f"{field}: {len(data)} bytes is over the inline limit of {INLINE_BYTES_MAX} and "
                "this node has no blob store",
                field=field,
            )
        ref = await asyncio.to_thread(self.blobs.put, tenant, data)
        return b" " + compact({BLOB_MARKER: ref})

    async def unpack(self, tenant: str, stored: bytes | None) -> bytes | None:
        """The compact JSON a record of ``tenant`` stands for (the blob's bytes for a
        reference); ``PayloadUnavailable`` when that blob cannot be read."""
        if stored is None:
            return None
        if stored.startswith(_REF_HEAD):
            return await self._read(tenant, stored)
        if stored.startswith(_OLD_REF_HEAD) and _old_ref(stored) is not None:
            return await self._read(None, stored)
        return stored

    async def _read(self, tenant: str | None, stored: bytes) -> bytes:
        ref = _old_ref(stored.lstrip(b" "))
        if self.blobs is None or ref is None:
            raise PayloadUnavailable(
                f"the value is in blob {ref!r}, which this node has no blob store to read",
                permanent=True,
            )
        try:
            return await asyncio.to_thread(self.blobs.get, tenant, ref)
        except (BlobNotFound, BlobCorrupt) as exc:
            why = "is missing" if isinstance(exc, BlobNotFound) else "does not match its digest"
            raise PayloadUnavailable(f"blob {ref} {why}", permanent=True) from exc
        except Exception as exc:  # the store itself failed (disk, network, S3): maybe later
            raise PayloadUnavailable(
                f"blob {ref} could not be read: {type(exc).__name__}: {exc}", permanent=False
            ) from exc

    async def value(self, tenant: str, stored: bytes | None) -> Any:
        """The JSON value a record of ``tenant`` stands for; None for no value."""
        return decode(await self.unpack(tenant, stored))


def _old_ref(stored: bytes) -> str | None:
    """The ref of ``{"$blob": "<ref>"}`` when that is the whole object, else None."""
    try:
        value = json.loads(stored)
    except ValueError:
        return None
    if not isinstance(value, dict) or len(value) != 1:
        return None
    ref = value.get(BLOB_MARKER)
    return ref if isinstance(ref, str) and is_ref(ref) else None


def decode(data: bytes | None) -> Any:
    """JSON bytes as a value. Records written by other producers may hold non-JSON bytes; those
    come out as ``{"$base64": ...}`` rather than failing the whole response."""
    if not data:
        return None
    try:
        return json.loads(data)
    except ValueError:
        return {"$base64": base64.b64encode(data).decode("ascii")}
