"""A fetched file's bytes checked against what its store listed: an S3 ETag (the MD5, or a multipart
upload's MD5 of part MD5s, taken from moto's real S3 API), a Hub file's SHA-256 or git blob id (as
git itself computes it), or its size alone. Bytes arrive in chunks of any size."""

from __future__ import annotations

import hashlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchboard.sources.files import Checker, RemoteFile, UnsafeName, safe_name
from tests.support.s3_store import S3Store

from .conftest import BUCKET, PART_BYTES


def chunks(data: bytes, size: int) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def checked(file: RemoteFile, data: bytes, chunk_bytes: int = 1 << 20) -> str | None:
    checker = Checker(file)
    for chunk in chunks(data, chunk_bytes):
        checker.update(chunk)
    return checker.mismatch()


def flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :]


def test_md5_of_a_single_part_etag() -> None:
    data = os.urandom(10_000)
    file = RemoteFile(name="a", size=len(data), check="md5", digest=hashlib.md5(data).hexdigest())
    assert checked(file, data, 333) is None
    assert "md5" in (checked(file, flipped(data, 5000)) or "")


@pytest.mark.parametrize("size", [PART_BYTES + 1234, 2 * PART_BYTES])
def test_a_multipart_etag_from_a_real_s3_api(aws_env: S3Store, size: int) -> None:
    data = os.urandom(size)
    key = f"files-test/multipart-{size}"
    client = aws_env.client()
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts = [
        {"PartNumber": number, "ETag": client.upload_part(
            Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=number, Body=part
        )["ETag"]}
        for number, part in enumerate(chunks(data, PART_BYTES), start=1)
    ]  # fmt: skip
    client.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )
    etag = client.head_object(Bucket=BUCKET, Key=key)["ETag"].strip('"')
    assert etag.endswith("-2")
    file = RemoteFile(name="w", size=size, check="s3-multipart", digest=etag, part_size=PART_BYTES)
    assert checked(file, data, 777_777) is None, "chunks that straddle the parts' borders"
    assert checked(file, data, PART_BYTES) is None, "chunks exactly a part"
    assert "does not match the store's" in (checked(file, flipped(data, PART_BYTES + 1)) or "")


def test_sha256_of_a_hub_lfs_file() -> None:
    data = os.urandom(5000)
    file = RemoteFile(
        name="w", size=len(data), check="sha256", digest=hashlib.sha256(data).hexdigest().upper()
    )
    assert checked(file, data, 100) is None, "a digest compared without case"
    assert "sha256" in (checked(file, flipped(data, 0)) or "")


@pytest.mark.parametrize("data", [b"", b"{}\n", os.urandom(2000)])
def test_git_sha1_is_the_blob_id_git_computes(tmp_path: Path, data: bytes) -> None:
    (tmp_path / "file").write_bytes(data)
    blob_id = subprocess.run(
        ["git", "hash-object", str(tmp_path / "file")], capture_output=True, text=True, check=True
    ).stdout.strip()
    file = RemoteFile(name="config.json", size=len(data), check="git-sha1", digest=blob_id)
    assert checked(file, data, 7) is None
    if data:
        assert "git-sha1" in (checked(file, flipped(data, len(data) - 1)) or "")


def test_size_alone_where_the_store_gives_no_digest() -> None:
    file = RemoteFile(name="w", size=100, check="size")
    assert checked(file, os.urandom(100)) is None
    assert checked(file, os.urandom(99)) == "w: 99 bytes fetched, the store lists 100"


def test_bytes_missing_or_extra_fail_whatever_the_check() -> None:
    data = os.urandom(1000)
    file = RemoteFile(name="w", size=len(data), check="md5", digest=hashlib.md5(data).hexdigest())
    assert checked(file, data[:-1]) == "w: 999 bytes fetched, the store lists 1000"
    assert checked(file, data + b"x") == "w: 1001 bytes fetched, the store lists 1000"


@pytest.mark.parametrize("name", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a"])
def test_a_name_that_would_leave_the_folder_is_refused(name: str) -> None:
    with pytest.raises(UnsafeName, match="would leave the model's folder"):
        safe_name(name)
    assert safe_name("sub/tokenizer.json") == "sub/tokenizer.json"
