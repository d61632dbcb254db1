"""Blobs: payloads, results and checkpoints too large to travel inline in a log record.

Content-addressed per tenant: a blob's ref is ``sha256:<hex digest>`` of its bytes, and it is
stored under its tenant, so writing the same bytes twice for one tenant stores them once and a
retried enqueue of a large payload produces the same ref (which is what lets the machine
compare payloads of an idempotent retry by ref), while two tenants with equal bytes have two
blobs and neither can name the other's: every read names the tenant of the record it serves.

Rule 1: ``put`` returns only once the blob is durable (file and directory fsync'd), because the
caller acknowledges a task that points at it right after. ``S3Blobs`` (store/s3_blobs.py,
``--blobs-url s3://bucket/prefix``) implements the same protocol; the local directory is the
embedded default.
Rule 2: ``tenant=None`` reads the shared blobs written before blobs were stored per tenant
(the references of old records, ``gateway/payloads.py``); nothing writes there any more.

    root/
      tenants/<tenant>/ab/abcdef...   one file per blob, named by its digest, fanned out by
                                      the first two hex; <tenant> as ``tenant_dir`` names it
      ab/abcdef...                    the shared blobs of old records (rule 2)
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from pathlib import Path
from typing import Protocol

REF_PREFIX = "sha256:"
_REF = re.compile(r"^sha256:[0-9a-f]{64}$")
_PLAIN_TENANT = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class BlobNotFound(KeyError):
    """No blob has this ref."""


class BlobCorrupt(Exception):
    """A stored blob no longer matches its digest."""


class Blobs(Protocol):
    def put(self, tenant: str, data: bytes) -> str:
        """Store ``data`` durably for ``tenant``; its ref."""
        ...

    def get(self, tenant: str | None, ref: str) -> bytes:
        """The bytes ``tenant`` stored under ``ref`` (``None``: a shared blob, rule 2);
        ``BlobNotFound`` if there are none."""
        ...


def is_ref(ref: str) -> bool:
    return _REF.match(ref) is not None


def tenant_dir(tenant: str) -> str:
    """A tenant as one path segment: the name itself when it is plain (letters, digits, ``-``
    and ``_``), else ``~`` and a digest of it (no plain name starts with ``~``)."""
    if _PLAIN_TENANT.match(tenant):
        return tenant
    return "~" + hashlib.sha256(tenant.encode()).hexdigest()[:40]


class LocalBlobs:
    """A directory of content-addressed files."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, tenant: str | None, ref: str) -> Path:
        # Refs come from stored records, but never let one name a path outside the root.
        if not is_ref(ref):
            raise BlobNotFound(ref)
        digest = ref[len(REF_PREFIX) :]
        base = self.root if tenant is None else self.root / "tenants" / tenant_dir(tenant)
        return base / digest[:2] / digest

    def put(self, tenant: str, data: bytes) -> str:
        ref = REF_PREFIX + hashlib.sha256(data).hexdigest()
        path = self._path(tenant, ref)
        if path.exists():
            return ref
        created = [p for p in reversed(path.parents) if not p.exists()]
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        for directory in {path.parent, *(p.parent for p in created)}:
            _fsync_dir(directory)  # the file's name, and every directory made for it
        return ref

    def get(self, tenant: str | None, ref: str) -> bytes:
        try:
            data = self._path(tenant, ref).read_bytes()
        except FileNotFoundError:
            raise BlobNotFound(ref) from None
        if REF_PREFIX + hashlib.sha256(data).hexdigest() != ref:
            raise BlobCorrupt(f"blob {ref} does not match its digest")
        return data


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
