"""Blobs: payloads, results and checkpoints too large to travel inline in a log record.

Content-addressed: a blob's ref is ``sha256:<hex digest>`` of its bytes, so writing the same
bytes twice stores them once and a retried enqueue of a large payload produces the same ref
(which is what lets the gateway compare payloads of an idempotent retry by ref).

Rule: ``put`` returns only once the blob is durable (file and directory fsync'd), because the
caller acknowledges a task that points at it right after. ``S3Blobs`` (store/s3_blobs.py,
``--blobs-url s3://bucket/prefix``) implements the same protocol; the local directory is the
embedded default.

    root/
      ab/abcdef...   one file per blob, named by its digest, fanned out by the first two hex
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


class BlobNotFound(KeyError):
    """No blob has this ref."""


class BlobCorrupt(Exception):
    """A stored blob no longer matches its digest."""


class Blobs(Protocol):
    def put(self, data: bytes) -> str:
        """Store ``data`` durably; its ref."""
        ...

    def get(self, ref: str) -> bytes:
        """The bytes stored under ``ref``; ``BlobNotFound`` if there are none."""
        ...


def is_ref(ref: str) -> bool:
    return _REF.match(ref) is not None


class LocalBlobs:
    """A directory of content-addressed files."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, ref: str) -> Path:
        # Refs come from stored records, but never let one name a path outside the root.
        if not is_ref(ref):
            raise BlobNotFound(ref)
        digest = ref[len(REF_PREFIX) :]
        return self.root / digest[:2] / digest

    def put(self, data: bytes) -> str:
        ref = REF_PREFIX + hashlib.sha256(data).hexdigest()
        path = self._path(ref)
        if path.exists():
            return ref
        path.parent.mkdir(exist_ok=True)
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
        _fsync_dir(path.parent)
        _fsync_dir(self.root)
        return ref

    def get(self, ref: str) -> bytes:
        try:
            data = self._path(ref).read_bytes()
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
