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
    ref = blobs.put("acme", data)
    digest = hashlib.sha256(data).hexdigest()
    assert ref == f"sha256:{digest}"
    key = f"conveyor/tenants/acme/{digest}"
    assert s3.get_object(Bucket="payloads", Key=key)["Body"].read() == data
    assert blobs.get("acme", ref) == data


def test_a_second_put_of_the_same_bytes_writes_nothing(s3: Any) -> None:
    blobs = S3Blobs("s3://payloads/", client=s3)
    ref = blobs.put("acme", b"same")
    key = f"tenants/acme/{ref[7:]}"
    etag = s3.head_object(Bucket="payloads", Key=key)["LastModified"]
    assert blobs.put("acme", b"same") == ref
    assert s3.head_object(Bucket="payloads", Key=key)["LastModified"] == etag
    assert len(s3.list_objects_v2(Bucket="payloads")["Contents"]) == 1


def test_missing_and_damaged_blobs_are_reported(s3: Any) -> None:
    blobs = S3Blobs("s3://payloads/p", client=s3)
    with pytest.raises(BlobNotFound):
        blobs.get("acme", "sha256:" + "0" * 64)
    with pytest.raises(BlobNotFound):
        blobs.get("acme", "../../etc/passwd")  # never a key outside the prefix
    ref = blobs.put("acme", b"good")
    s3.put_object(Bucket="payloads", Key="p/tenants/acme/" + ref[7:], Body=b"evil")
    with pytest.raises(BlobCorrupt):
        blobs.get("acme", ref)


def test_equal_bytes_of_two_tenants_are_two_blobs_neither_can_read_across(s3: Any) -> None:
    blobs = S3Blobs("s3://payloads/p", client=s3)
    ref = blobs.put("a", b"secret")
    assert blobs.put("b", b"secret") == ref  # the same digest...
    keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="payloads")["Contents"])
    assert keys == [f"p/tenants/a/{ref[7:]}", f"p/tenants/b/{ref[7:]}"]  # ...two objects
    s3.delete_object(Bucket="payloads", Key=f"p/tenants/a/{ref[7:]}")
    with pytest.raises(BlobNotFound):
        blobs.get("a", ref)  # b's copy is not a's
    with pytest.raises(BlobNotFound):
        blobs.get("c", ref)
    assert blobs.get("b", ref) == b"secret"


def test_the_shared_blobs_of_old_records_still_read(s3: Any) -> None:
    blobs = S3Blobs("s3://payloads/p", client=s3)
    digest = hashlib.sha256(b"old").hexdigest()
    s3.put_object(Bucket="payloads", Key=f"p/{digest}", Body=b"old")  # written before tenants
    assert blobs.get(None, f"sha256:{digest}") == b"old"
    with pytest.raises(BlobNotFound):
        blobs.get("a", f"sha256:{digest}")


@pytest.mark.parametrize("url", ["payloads", "http://payloads/x", "s3://", "s3:///x"])
def test_a_url_that_is_not_s3_is_refused(url: str) -> None:
    with pytest.raises(ValueError, match="is not s3://<bucket>/<prefix>"):
        parse_url(url)
