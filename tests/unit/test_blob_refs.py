"""Blob references cannot be forged and blobs are per tenant (``gateway/payloads.py`` rules
1-3, ``store/blobs.py``)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path
from typing import Any

import pytest

from conveyor.store.blobs import BlobNotFound, LocalBlobs
from conveyor.streams.gateway.fields import compact
from conveyor.streams.gateway.payloads import INLINE_BYTES_MAX, Payloads, PayloadUnavailable

BIG = compact({"blob": "x" * (INLINE_BYTES_MAX + 1)})


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_equal_bytes_of_two_tenants_are_two_blobs_neither_can_read_across(
    tmp_path: Path,
) -> None:
    blobs = LocalBlobs(tmp_path)
    ref = blobs.put("a", b"secret")
    assert blobs.put("b", b"secret") == ref
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    digest = ref[len("sha256:") :]
    assert files == [f"tenants/a/{digest[:2]}/{digest}", f"tenants/b/{digest[:2]}/{digest}"]
    (tmp_path / files[0]).unlink()
    with pytest.raises(BlobNotFound):
        blobs.get("a", ref)
    with pytest.raises(BlobNotFound):
        blobs.get("c", ref)
    assert blobs.get("b", ref) == b"secret"


@pytest.mark.parametrize("tenant", ["../escape", "a/b", "~x", "ü", "x" * 65])
def test_a_tenant_that_is_no_plain_name_gets_a_digest_directory(
    tmp_path: Path, tenant: str
) -> None:
    blobs = LocalBlobs(tmp_path)
    ref = blobs.put(tenant, b"data")
    (path,) = (p for p in tmp_path.rglob("*") if p.is_file())
    assert path.is_relative_to(tmp_path / "tenants") and path.parent.parent.name.startswith("~")
    assert blobs.get(tenant, ref) == b"data"


def test_a_large_value_is_stored_as_a_reference_no_client_value_can_be(tmp_path: Path) -> None:
    payloads = Payloads(LocalBlobs(tmp_path))
    stored = run(payloads.pack("a", BIG, "payload"))
    assert stored.startswith(b" ") and not compact({"$blob": "x", "y": 1}).startswith(b" ")
    assert run(payloads.unpack("a", stored)) == BIG
    ref = "sha256:" + hashlib.sha256(BIG).hexdigest()
    forged = compact({"$blob": ref, "x": 1})  # what a client of tenant b may send and store
    assert run(payloads.unpack("b", forged)) == forged  # its own value, never a's bytes
    assert run(payloads.unpack("a", forged)) == forged
    with pytest.raises(PayloadUnavailable) as caught:  # a's reference, read as b: nothing
        run(payloads.unpack("b", stored))
    assert caught.value.permanent and "missing" in str(caught.value)


def test_an_old_records_reference_reads_from_the_shared_blobs(tmp_path: Path) -> None:
    digest = hashlib.sha256(BIG).hexdigest()
    (tmp_path / digest[:2]).mkdir()
    (tmp_path / digest[:2] / digest).write_bytes(BIG)  # where nodes kept blobs before tenants
    payloads = Payloads(LocalBlobs(tmp_path))
    old = compact({"$blob": f"sha256:{digest}"})
    assert run(payloads.unpack("a", old)) == BIG
    assert run(payloads.unpack("a", compact({"$blob": "not a ref"}))) == compact(
        {"$blob": "not a ref"}
    )


class Unreachable:
    def put(self, tenant: str, data: bytes) -> str:
        raise OSError("no route to host")

    def get(self, tenant: str | None, ref: str) -> bytes:
        raise OSError("no route to host")


def test_a_store_that_cannot_be_reached_is_not_a_missing_blob(tmp_path: Path) -> None:
    stored = run(Payloads(LocalBlobs(tmp_path)).pack("a", BIG, "payload"))
    with pytest.raises(PayloadUnavailable) as caught:
        run(Payloads(Unreachable()).unpack("a", stored))
    assert not caught.value.permanent and "no route to host" in str(caught.value)
