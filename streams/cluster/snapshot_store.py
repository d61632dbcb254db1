"""Where partition snapshots are kept: a local directory or an S3 bucket, named objects.

The blob stores (``store/blobs.py``) address content by digest, per tenant; a snapshot needs
names it can list by partition, and deletions. So this is its own small protocol, five verbs
on whole objects, each blocking (callers run them in a thread)::

    <root or s3://bucket/prefix>/<cluster>/p0003/00000000000000012345-e2097152/state.tar.gz
                                                                              /manifest.json

Rules:

1. An object appears whole or not at all: the directory writes a temporary file, fsyncs it
   and renames it over the name (then fsyncs the directory); an S3 PUT is atomic, and carries
   its SHA-256 so S3 refuses bytes damaged on the way.
2. ``keys`` lists names under a prefix in no promised order; a name being listed does not
   promise it can still be read (a prune may delete it meanwhile): ``SnapshotMissing``.
3. Credentials are never part of a description, a log line or an error (``describe`` names
   the bucket and prefix only).
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any, Protocol

from conveyor.store.s3_blobs import parse_url


class SnapshotMissing(KeyError):
    """No object has this name (rule 2)."""


class SnapshotStore(Protocol):
    def put_file(self, key: str, source: Path) -> None: ...

    def get_file(self, key: str, dest: Path) -> None:
        """Write the object ``key`` to ``dest``; ``SnapshotMissing`` if there is none."""
        ...

    def keys(self, prefix: str) -> list[str]: ...

    def delete(self, keys: list[str]) -> None:
        """Delete ``keys``; a name already gone is not an error."""
        ...

    def describe(self) -> str:
        """Where this is, for messages (rule 3)."""
        ...


def open_store(where: str, *, endpoint_url: str | None = None) -> SnapshotStore:
    """``s3://bucket/prefix`` or a directory; a clear ``ValueError`` for an unusable one."""
    if where.startswith("s3:"):
        return S3SnapshotStore(where, endpoint_url=endpoint_url)
    if "://" in where:
        raise ValueError(f"snapshot store {where!r} is neither a directory nor s3://bucket/prefix")
    return LocalSnapshotStore(Path(where))


class LocalSnapshotStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        parts = key.split("/")
        if any(part in ("", ".", "..") for part in parts):
            raise ValueError(f"snapshot object name {key!r} is not a plain relative path")
        return self.root.joinpath(*parts)

    def put_file(self, key: str, source: Path) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out, source.open("rb") as src:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        fsync_dir(path.parent)

    def get_file(self, key: str, dest: Path) -> None:
        try:
            with self._path(key).open("rb") as src, dest.open("wb") as out:
                while chunk := src.read(1 << 20):
                    out.write(chunk)
        except FileNotFoundError:
            raise SnapshotMissing(key) from None

    def keys(self, prefix: str) -> list[str]:
        base = self._path(prefix.rstrip("/"))
        if not base.is_dir():
            return []
        return [
            path.relative_to(self.root).as_posix()
            for path in base.rglob("*")
            if path.is_file() and not path.name.startswith(".tmp-")
        ]

    def delete(self, keys: list[str]) -> None:
        parents = set()
        for key in keys:
            path = self._path(key)
            path.unlink(missing_ok=True)
            parents.add(path.parent)
        for parent in parents:
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()

    def describe(self) -> str:
        return str(self.root)


class S3SnapshotStore:
    def __init__(self, url: str, *, endpoint_url: str | None = None, client: Any = None) -> None:
        from conveyor.extras import require

        require("s3", what="S3 snapshots (--snapshots s3://...)")
        import boto3  # only where S3 is used

        self.bucket, self.prefix = parse_url(url)
        self._s3 = client or boto3.client("s3", endpoint_url=endpoint_url)

    def put_file(self, key: str, source: Path) -> None:
        data = source.read_bytes()  # a partition's packed state: tens of MB at most
        digest = base64.b64encode(hashlib.sha256(data).digest()).decode()
        self._s3.put_object(
            Bucket=self.bucket, Key=self.prefix + key, Body=data, ChecksumSHA256=digest
        )

    def get_file(self, key: str, dest: Path) -> None:
        from botocore.exceptions import ClientError

        try:
            reply = self._s3.get_object(Bucket=self.bucket, Key=self.prefix + key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in {"404", "NoSuchKey", "NotFound"}:
                raise SnapshotMissing(key) from None
            raise
        with dest.open("wb") as out:
            for chunk in reply["Body"].iter_chunks(1 << 20):
                out.write(chunk)

    def keys(self, prefix: str) -> list[str]:
        found = []
        pages = self._s3.get_paginator("list_objects_v2")
        for page in pages.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
            found += [item["Key"][len(self.prefix) :] for item in page.get("Contents", [])]
        return found

    def delete(self, keys: list[str]) -> None:
        for i in range(0, len(keys), 1000):  # DeleteObjects takes at most 1000
            objects = [{"Key": self.prefix + key} for key in keys[i : i + 1000]]
            self._s3.delete_objects(Bucket=self.bucket, Delete={"Objects": objects})

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
