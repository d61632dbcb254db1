"""S3Blobs keeps the blob contract (content-addressed, idempotent, checked on read) against an
in-process S3 (moto)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from moto import mock_aws

from conveyor.store.blobs import BlobCorrupt, BlobNotFound
from conveyor.store.s3_blobs import S3Blobs, parse_url


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    with mock_aws():
        client = boto3.client("s3")
        client.create_bucket(Bucket="payloads")
        yield client


def test_put_then_get_round_trips_under_the_digest_key(s3: Any) -> None:
    blobs = S3Blobs("s3://payloads/conveyor", client=s3)
    data = b"x" * 300_000
    ref = blobs.put(data)
    digest = hashlib.sha256(data).hexdigest()
    assert ref == f"sha256:{digest}"
    assert s3.get_object(Bucket="payloads", Key=f"conveyor/{digest}")["Body"].read() == data
    assert blobs.get(ref) == data


def test_a_second_put_of_the_same_bytes_writes_nothing(s3: Any) -> None:
    blobs = S3Blobs("s3://payloads/", client=s3)
    ref = blobs.put(b"same")
    etag = s3.head_object(Bucket="payloads", Key=ref[7:])["LastModified"]
    assert blobs.put(b"same") == ref
    assert s3.head_object(Bucket="payloads", Key=ref[7:])["LastModified"] == etag
    assert len(s3.list_objects_v2(Bucket="payloads")["Contents"]) == 1


def test_missing_and_damaged_blobs_are_reported(s3: Any) -> None:
    blobs = S3Blobs("s3://payloads/p", client=s3)
    with pytest.raises(BlobNotFound):
        blobs.get("sha256:" + "0" * 64)
    with pytest.raises(BlobNotFound):
        blobs.get("../../etc/passwd")  # never a key outside the prefix
    ref = blobs.put(b"good")
    s3.put_object(Bucket="payloads", Key="p/" + ref[7:], Body=b"evil")
    with pytest.raises(BlobCorrupt):
        blobs.get(ref)


@pytest.mark.parametrize("url", ["payloads", "http://payloads/x", "s3://", "s3:///x"])
def test_a_url_that_is_not_s3_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="is not s3://<bucket>/<prefix>"):
        parse_url(url)
