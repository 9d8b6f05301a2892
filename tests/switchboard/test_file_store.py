"""The Files API's contents store: a local folder, and an S3 bucket on a real S3 API (moto's server on
loopback). Both round-trip a file in streamed chunks, replace one whole (a reader never sees half a
file), delete idempotently and tell a missing file from a store that cannot serve."""

from __future__ import annotations

import asyncio
import os
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest

import switchboard.file_store as file_store_module
from switchboard.config import StorageConfig
from switchboard.file_store import FileStore, FileStoreError, LocalFileStore, S3FileStore, file_store
from tests.support.s3_store import S3Store

MB = 1 << 20
BUCKET = "files"


def write(folder: Path, name: str, data: bytes) -> Path:
    path = folder / name
    path.write_bytes(data)
    return path


async def chunks_of(store: FileStore, file_id: str, chunk_bytes: int = MB) -> list[bytes]:
    return [chunk async for chunk in store.read(file_id, chunk_bytes=chunk_bytes)]


async def read_all(store: FileStore, file_id: str) -> bytes:
    return b"".join(await chunks_of(store, file_id))


async def round_trip(store: FileStore, uploads: Path) -> None:
    """Put, read back in chunks, size, delete (twice): the same for every store."""
    data = os.urandom(3 * MB + 12345)
    await store.put("file-abc_1", write(uploads, "upload.jsonl", data))
    chunks = await chunks_of(store, "file-abc_1", MB)
    assert b"".join(chunks) == data
    assert all(0 < len(chunk) <= MB for chunk in chunks) and len(chunks) >= 4
    assert await store.size("file-abc_1") == len(data)
    await store.delete("file-abc_1")
    await store.delete("file-abc_1")  # idempotent
    assert await store.size("file-abc_1") is None
    with pytest.raises(FileNotFoundError):
        await read_all(store, "file-abc_1")


# --- the local folder -----------------------------------------------------------------------------


@pytest.fixture
def local(tmp_path: Path) -> LocalFileStore:
    return LocalFileStore(tmp_path / "store" / "files")


async def test_local_round_trip(local: LocalFileStore, tmp_path: Path) -> None:
    await round_trip(local, tmp_path)


async def test_local_reads_in_chunks_of_the_asked_size(local: LocalFileStore, tmp_path: Path) -> None:
    data = os.urandom(10_500)
    await local.put("f", write(tmp_path, "u", data))
    assert [len(chunk) for chunk in await chunks_of(local, "f", 1000)] == [1000] * 10 + [500]
    await local.put("empty", write(tmp_path, "e", b""))
    assert await chunks_of(local, "empty") == []
    assert await local.size("empty") == 0
    with pytest.raises(ValueError):
        await chunks_of(local, "f", 0)


@pytest.mark.parametrize("bad", ["", "../escape", "a/b", "a.b", ".hidden", "x" * 129, "é", "a\x00"])
async def test_local_refuses_a_bad_id(local: LocalFileStore, tmp_path: Path, bad: str) -> None:
    source = write(tmp_path, "u", b"data")
    with pytest.raises(ValueError, match="not a file id"):
        await local.put(bad, source)
    with pytest.raises(ValueError):
        await read_all(local, bad)
    with pytest.raises(ValueError):
        await local.size(bad)
    with pytest.raises(ValueError):
        await local.delete(bad)
    assert not (tmp_path / "store" / "escape").exists()


async def test_local_permissions(tmp_path: Path) -> None:
    """Only this user reads the files, whatever the umask."""
    old_umask = os.umask(0)
    try:
        store = LocalFileStore(tmp_path / "new" / "files")
        await store.put("f", write(tmp_path, "u", b"secret"))
    finally:
        os.umask(old_umask)
    assert stat.S_IMODE((tmp_path / "new" / "files").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "new" / "files" / "f").stat().st_mode) == 0o600


async def test_local_put_shows_nothing_until_it_is_whole(
    local: LocalFileStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a new version is being copied, the file's name still holds the old one, whole; a
    reader that opened the old one reads it whole after the new one is in; no temporary is left."""
    old, new = b"o" * (2 * MB + 7), b"n" * (3 * MB + 1)
    await local.put("f", write(tmp_path, "old", old))
    seen_mid_copy: list[bytes] = []
    copy = file_store_module._copy

    def copy_and_look(reader: IO[bytes], target: Path) -> None:
        copy(reader, target)
        seen_mid_copy.append((local.folder / "f").read_bytes())

    monkeypatch.setattr(file_store_module, "_copy", copy_and_look)
    reading = local.read("f", chunk_bytes=MB)
    first = await anext(reading)
    await local.put("f", write(tmp_path, "new", new))
    assert seen_mid_copy == [old]
    assert first + b"".join([chunk async for chunk in reading]) == old
    assert await read_all(local, "f") == new
    assert sorted(path.name for path in local.folder.iterdir()) == ["f"]


async def test_local_readers_during_puts_see_whole_versions(local: LocalFileStore, tmp_path: Path) -> None:
    versions = [bytes([65 + n]) * (MB + 1000 * n) for n in range(3)]
    sources = [write(tmp_path, f"v{n}", data) for n, data in enumerate(versions)]
    await local.put("f", sources[0])

    async def writer() -> None:
        for n in range(30):
            await local.put("f", sources[n % 3])

    async def reader() -> list[bytes]:
        return [await read_all(local, "f") for _ in range(30)]

    _, *reads = await asyncio.gather(writer(), reader(), reader())
    assert all(data in versions for read in reads for data in read)


async def test_local_read_of_a_missing_file_and_an_unwritable_folder(
    local: LocalFileStore, tmp_path: Path
) -> None:
    with pytest.raises(FileNotFoundError):
        await read_all(local, "missing")
    assert await local.size("missing") is None
    blocker = write(tmp_path, "a-file", b"")
    with pytest.raises(FileStoreError, match="files folder"):
        LocalFileStore(blocker / "files")


def test_file_store_picks_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    store = file_store("~/switchboard-files")
    assert isinstance(store, LocalFileStore) and store.folder == tmp_path / "switchboard-files"
    assert store.folder.is_dir()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    assert isinstance(file_store("s3://bucket/files"), S3FileStore)


def test_s3_without_boto3_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(FileStoreError, match=r"boto3.*`cpu` or `gpu` extra.*local folder"):
        S3FileStore("s3://bucket/files")


def test_s3_location_must_be_a_bucket() -> None:
    with pytest.raises(ValueError):
        S3FileStore("s3://Not_A_Bucket/files")


# --- the S3 bucket --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3_server() -> Iterator[S3Store]:
    with S3Store() as server:
        server.create_bucket(BUCKET)
        yield server


@pytest.fixture
def s3(s3_server: S3Store, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    """The server's credentials in the environment as the router would have them; no shared AWS
    files of this machine's. The endpoint is given through the storage table instead."""
    for name, value in s3_server.env().items():
        if name != "AWS_ENDPOINT_URL":
            monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    return s3_server


def s3_store(server: S3Store, url: str) -> S3FileStore:
    return S3FileStore(url, StorageConfig(endpoint_url=server.endpoint_url))


async def test_s3_round_trip(s3: S3Store, tmp_path: Path) -> None:
    await round_trip(s3_store(s3, f"s3://{BUCKET}/round-trip"), tmp_path)


async def test_s3_objects_live_under_the_prefix(s3: S3Store, tmp_path: Path) -> None:
    store = s3_store(s3, f"s3://{BUCKET}/under/prefix")
    await store.put("file-1", write(tmp_path, "u", b"hello"))
    assert s3.client().get_object(Bucket=BUCKET, Key="under/prefix/file-1")["Body"].read() == b"hello"
    assert [len(chunk) for chunk in await chunks_of(store, "file-1", 2)] == [2, 2, 1]
    with pytest.raises(ValueError):
        await store.put("../file-1", write(tmp_path, "u", b"x"))


async def test_s3_large_file_is_uploaded_in_parts(s3: S3Store, tmp_path: Path) -> None:
    """Above boto3's multipart threshold (8 MB) the upload goes in parts, and reads back whole."""
    store = s3_store(s3, f"s3://{BUCKET}/large")
    data = os.urandom(9 * MB)
    await store.put("big", write(tmp_path, "big", data))
    etag = s3.client().head_object(Bucket=BUCKET, Key="large/big")["ETag"].strip('"')
    assert etag.endswith("-2")
    assert await store.size("big") == len(data)
    assert await read_all(store, "big") == data


async def test_s3_missing_object(s3: S3Store) -> None:
    store = s3_store(s3, f"s3://{BUCKET}/missing")
    assert await store.size("nothing") is None
    with pytest.raises(FileNotFoundError):
        await read_all(store, "nothing")
    await store.delete("nothing")


async def test_s3_missing_bucket_is_a_store_error(s3: S3Store, tmp_path: Path) -> None:
    store = s3_store(s3, "s3://no-such-bucket/files")
    source = write(tmp_path, "u", b"data")
    for attempt in (store.put("f", source), read_all(store, "f"), store.size("f"), store.delete("f")):
        with pytest.raises(FileStoreError, match=r"no-such-bucket.*bucket does not exist") as raised:
            await attempt
        assert "switchboard-tests" not in str(raised.value)  # no credential in the message


async def test_s3_refused_credentials_are_a_store_error(s3: S3Store) -> None:
    store = s3_store(s3, f"s3://{BUCKET}/refused")
    s3.fail("refused/f", 403)
    try:
        with pytest.raises(FileStoreError, match=r"refused access.*AWS_ACCESS_KEY_ID"):
            await read_all(store, "f")
    finally:
        s3.clear_faults()
