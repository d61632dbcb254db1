"""Blobs in S3 (or any S3-compatible store, through ``endpoint_url``), with boto3.

The same contract as ``LocalBlobs`` (``store/blobs.py``): content-addressed refs
(``sha256:<hex>``) per tenant, ``put`` durable on return, ``get`` checked against the digest.

    s3://<bucket>/<prefix>  ->  object <prefix>tenants/<tenant_dir>/<hex digest>
                                (the shared blobs of old records: <prefix><hex digest>)

Rule 1 (durable on return): S3 answers a PUT only once the object is stored; the PUT carries
its SHA-256, so S3 refuses bytes damaged on the way instead of storing them.
Rule 2 (idempotent): the key is the digest, so a retried put of the same bytes finds the
object and writes nothing.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any
from urllib.parse import urlparse

import boto3
from botocore.exceptions import ClientError

from conveyor.store.blobs import REF_PREFIX, BlobCorrupt, BlobNotFound, is_ref, tenant_dir

_MISSING = {"404", "NoSuchKey", "NotFound"}


def parse_url(url: str) -> tuple[str, str]:
    """``s3://bucket/prefix`` -> (bucket, prefix ending in "/" or empty); a clear error
    for anything else."""
    parsed = urlparse(url)
    if parsed.scheme != "s3" or not parsed.netloc:
        raise ValueError(f"blob store URL {url!r} is not s3://<bucket>/<prefix>")
    prefix = parsed.path.lstrip("/")
    return parsed.netloc, prefix if not prefix or prefix.endswith("/") else prefix + "/"


class S3Blobs:
    def __init__(self, url: str, *, endpoint_url: str | None = None, client: Any = None) -> None:
        self.bucket, self.prefix = parse_url(url)
        self._s3 = client or boto3.client("s3", endpoint_url=endpoint_url)

    def _key(self, tenant: str | None, ref: str) -> str:
        if not is_ref(ref):
            raise BlobNotFound(ref)
        base = self.prefix if tenant is None else f"{self.prefix}tenants/{tenant_dir(tenant)}/"
        return base + ref[len(REF_PREFIX) :]

    def put(self, tenant: str, data: bytes) -> str:
        digest = hashlib.sha256(data)
        ref = REF_PREFIX + digest.hexdigest()
        key = self._key(tenant, ref)
        try:
            self._s3.head_object(Bucket=self.bucket, Key=key)
            return ref  # rule 2
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") not in _MISSING:
                raise
        self._s3.put_object(
            Bucket=self.bucket,
            Key=key,
            Body=data,
            ChecksumSHA256=base64.b64encode(digest.digest()).decode(),
        )
        return ref

    def get(self, tenant: str | None, ref: str) -> bytes:
        try:
            reply = self._s3.get_object(Bucket=self.bucket, Key=self._key(tenant, ref))
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in _MISSING:
                raise BlobNotFound(ref) from None
            raise
        data: bytes = reply["Body"].read()
        if REF_PREFIX + hashlib.sha256(data).hexdigest() != ref:
            raise BlobCorrupt(f"blob {ref} in s3://{self.bucket}/{self.prefix} does not match")
        return data
