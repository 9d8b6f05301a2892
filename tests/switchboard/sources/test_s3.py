"""S3Source against a real S3 API (moto's server on loopback): a prefix listed as a folder with each
object's check, reads from an offset of exactly the version listed, a read dropped half way and
resumed, and each failure a SourceError that says what to do."""

from __future__ import annotations

import re
from collections.abc import Callable, Generator
from pathlib import Path
from typing import cast

import pytest

from switchboard.config import StorageConfig
from switchboard.sources.files import Checker, RemoteFile
from switchboard.sources.locations import S3Location
from switchboard.sources.s3 import S3Source
from switchboard.sources.source import SourceChanged, SourceError
from tests.support.s3_store import S3Store

from .conftest import BUCKET, PART_BYTES

OpenS3 = Callable[[str], S3Source]
NAMES = ["config.json", "model.safetensors", "sub/extra.txt", "tokenizer.json"]


def file_named(source: S3Source, name: str) -> RemoteFile:
    return next(file for file in source.list_files().files if file.name == name)


def read_all(source: S3Source, file: RemoteFile, offset: int = 0) -> bytes:
    return b"".join(source.read(file, offset))


def test_a_prefix_lists_as_a_folder_and_never_a_longer_prefix(open_s3: OpenS3, tiny_model: Path) -> None:
    manifest = open_s3("s3://models/tiny").list_files()
    assert [file.name for file in manifest.files] == NAMES, "tiny-2's objects are not tiny's"
    assert manifest.location == "s3://models/tiny" and not manifest.pinned
    sizes = {path.relative_to(tiny_model).as_posix(): path.stat().st_size for path in tiny_model.rglob("*")}
    assert {file.name: file.size for file in manifest.files} == {name: sizes[name] for name in NAMES}
    assert all(file.check == "md5" and file.version == f'"{file.digest}"' for file in manifest.files)


def test_the_whole_bucket_and_folder_markers(open_s3: OpenS3, aws_env: S3Store) -> None:
    aws_env.create_bucket("whole-bucket")
    client = aws_env.client()
    for key, body in [("config.json", b"{}"), ("sub/", b""), ("sub/extra.txt", b"x")]:
        client.put_object(Bucket="whole-bucket", Key=key, Body=body)
    assert [file.name for file in open_s3("s3://whole-bucket").list_files().files] == [
        "config.json",
        "sub/extra.txt",
    ]


def test_the_revision_is_the_listing_and_moves_when_an_object_does(open_s3: OpenS3, aws_env: S3Store) -> None:
    client = aws_env.client()
    for name in ("config.json", "weights"):
        client.put_object(Bucket=BUCKET, Key=f"revision-test/{name}", Body=name.encode())
    source = open_s3("s3://models/revision-test")
    first = source.list_files().revision
    assert re.fullmatch(r"[0-9a-f]{64}", first) and source.list_files().revision == first
    client.put_object(Bucket=BUCKET, Key="revision-test/weights", Body=b"changed")
    assert source.list_files().revision != first


def test_a_multipart_object_is_checked_by_its_parts(open_s3: OpenS3) -> None:
    source = open_s3("s3://models/parts")
    weights = file_named(source, "model.safetensors")
    assert (weights.check, weights.part_size) == ("s3-multipart", PART_BYTES)
    assert re.fullmatch(r"[0-9a-f]{32}-2", weights.digest)
    checker = Checker(weights)
    for chunk in source.read(weights, 0):
        checker.update(chunk)
    assert checker.mismatch() is None
    assert file_named(source, "config.json").check == "md5", "small files went up in one part"


def test_a_multipart_object_of_uneven_parts_is_checked_by_its_size(open_s3: OpenS3, aws_env: S3Store) -> None:
    client = aws_env.client()
    key = "uneven/weights"
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    parts = [
        {"PartNumber": number, "ETag": client.upload_part(
            Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=number, Body=b"w" * size
        )["ETag"]}
        for number, size in ((1, PART_BYTES), (2, PART_BYTES + 1024 * 1024))
    ]  # fmt: skip
    client.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
    )
    weights = open_s3("s3://models/uneven").list_files().files[0]
    assert (weights.check, weights.size) == ("size", 2 * PART_BYTES + 1024 * 1024), "no part size fits all"


def test_an_object_encrypted_with_kms_is_checked_by_its_size(open_s3: OpenS3, aws_env: S3Store) -> None:
    client = aws_env.client()
    client.put_object(Bucket=BUCKET, Key="kms/weights", Body=b"w" * 100, ServerSideEncryption="aws:kms")
    client.put_object(Bucket=BUCKET, Key="kms/config.json", Body=b"{}")
    checks = {file.name: file.check for file in open_s3("s3://models/kms").list_files().files}
    assert checks == {"weights": "size", "config.json": "md5"}, "a KMS object's ETag is no MD5 on AWS"


def test_a_read_from_an_offset_asks_a_range(open_s3: OpenS3, aws_env: S3Store, tiny_model: Path) -> None:
    source = open_s3("s3://models/tiny")
    weights = file_named(source, "model.safetensors")
    data = (tiny_model / "model.safetensors").read_bytes()
    aws_env.reset_counts()
    chunks = list(source.read(weights, 1000))
    assert b"".join(chunks) == data[1000:]
    assert max(len(chunk) for chunk in chunks) <= 1 << 20, "streamed in chunks, not held whole"
    assert aws_env.object_gets(BUCKET, "tiny/model", ranged=True) == 1
    assert aws_env.object_gets(BUCKET, "tiny/model", ranged=False) == 0


def test_a_read_dropped_half_way_resumes_from_its_offset(
    open_s3: OpenS3, aws_env: S3Store, tiny_model: Path
) -> None:
    source = open_s3("s3://models/tiny-2")
    weights = file_named(source, "model.safetensors")
    aws_env.throttle("tiny-2/model.safetensors", 20 * 1024 * 1024)
    got = bytearray()
    reading = cast(Generator[bytes], source.read(weights, 0))
    for chunk in reading:
        got += chunk
        if len(got) >= 2 * 1024 * 1024:
            break
    reading.close()  # the fetcher gave up: the connection goes
    assert 0 < len(got) < weights.size
    aws_env.clear_faults()
    checker = Checker(weights)
    checker.update(bytes(got))
    for chunk in source.read(weights, len(got)):
        checker.update(chunk)
    assert checker.mismatch() is None
    assert bytes(got) == (tiny_model / "model.safetensors").read_bytes()[: len(got)]


def test_a_server_error_is_retried(open_s3: OpenS3, aws_env: S3Store) -> None:
    source = open_s3("s3://models/tiny")
    config = file_named(source, "config.json")
    aws_env.reset_counts()
    aws_env.fail("tiny/config.json", 500, times=1)
    assert read_all(source, config).startswith(b'{"model_type"')
    assert aws_env.object_gets(BUCKET, "tiny/config.json") == 2


def test_bytes_corrupted_on_the_way_are_never_passed(open_s3: OpenS3, aws_env: S3Store) -> None:
    source = open_s3("s3://models/tiny")
    tokenizer = file_named(source, "tokenizer.json")
    aws_env.corrupt("tiny/tokenizer.json")
    checker = Checker(tokenizer)
    try:
        for chunk in source.read(tokenizer, 0):
            checker.update(chunk)
    except SourceError as refused:  # boto3 checks the CRC32 moto sends with the object, when it has one
        assert "upload the file again" in str(refused)
    else:
        assert "does not match" in (checker.mismatch() or "")


def test_an_object_replaced_or_deleted_since_its_listing_is_a_change(
    open_s3: OpenS3, aws_env: S3Store
) -> None:
    client = aws_env.client()
    for name in ("a.json", "b.json"):
        client.put_object(Bucket=BUCKET, Key=f"changing/{name}", Body=b"{}")
    source = open_s3("s3://models/changing")
    listed = {file.name: file for file in source.list_files().files}
    client.put_object(Bucket=BUCKET, Key="changing/a.json", Body=b'{"v": 2}')
    client.delete_object(Bucket=BUCKET, Key="changing/b.json")
    with pytest.raises(SourceChanged, match=r"s3://models/changing \(changing/a.json\) changed in the store"):
        read_all(source, listed["a.json"], 1)
    with pytest.raises(SourceChanged):
        read_all(source, listed["b.json"])


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("s3://missing-bucket/tiny", "s3://missing-bucket/tiny: the bucket does not exist"),
        ("s3://models/tin", "s3://models/tin holds no files: upload the model's folder there"),
    ],
)
def test_a_wrong_location_says_so(open_s3: OpenS3, path: str, says: str) -> None:
    with pytest.raises(SourceError) as wrong:
        open_s3(path).list_files()
    assert says in str(wrong.value)


def test_no_credentials_says_how_to_give_them(open_s3: OpenS3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(SourceError) as refused:
        open_s3("s3://models/tiny").list_files()
    words = str(refused.value)
    assert words.startswith("no credentials to read s3://models/tiny")
    assert all(way in words for way in ("AWS_ACCESS_KEY_ID", "~/.aws/credentials", "role", "storage.profile"))


def test_access_refused_says_how_to_give_credentials(open_s3: OpenS3, aws_env: S3Store) -> None:
    source = open_s3("s3://models/tiny")
    config = file_named(source, "config.json")
    aws_env.fail("tiny/config.json", 403)
    with pytest.raises(SourceError, match=r"refused access \(AccessDenied\).*storage\.profile"):
        read_all(source, config)


def test_a_profile_the_shared_files_lack_says_what_to_correct(aws_env: S3Store) -> None:
    with pytest.raises(SourceError, match=r"could not be found.*storage table"):
        S3Source(S3Location(bucket=BUCKET, prefix="tiny"), StorageConfig(profile="nobody"))


def test_the_endpoint_comes_from_the_environment_unless_storage_names_one(aws_env: S3Store) -> None:
    location = S3Location(bucket=BUCKET, prefix="tiny")
    from_env = S3Source(location, None)
    assert from_env.rate_key == f"s3 {aws_env.endpoint_url}"
    assert [file.name for file in from_env.list_files().files] == NAMES
    elsewhere = S3Source(location, StorageConfig(endpoint_url="http://127.0.0.1:9"))
    assert elsewhere.rate_key == "s3 http://127.0.0.1:9"
    assert elsewhere.cache_key != from_env.cache_key, "one prefix in two stores: two cache entries"


def test_cache_keys_are_one_folder_name_each(aws_env: S3Store) -> None:
    keys = {
        S3Source(S3Location(bucket=BUCKET, prefix=prefix), None).cache_key
        for prefix in ("tiny", "tiny-2", "org/tiny", "org-tiny", "")
    }
    assert len(keys) == 5
    assert all(re.fullmatch(r"[A-Za-z0-9._-]+", key) and len(key) < 100 for key in keys)
    assert S3Source(S3Location(bucket=BUCKET, prefix="tiny"), None).cache_key in keys, "the same each time"
