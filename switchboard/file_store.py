"""Where the contents of the Files API's files live (uploads for the Batch API, a batch's output and
error files): a local folder for the all-in-one `switchboard up`, an S3-compatible bucket for a
deployment (read the way model sources read one: `switchboard/sources/s3.py`).

Only the bytes are kept here, under the file's id. What the API says about a file (its owner,
purpose, name, size, expiry) lives in Redis beside the rest of the router's state: a listing or a
lookup never touches the store, and a store holds nothing a reader could not fetch by id anyway.

A put is atomic: a reader sees the old bytes or the new, whole, never a half-written file (a local
file is written under a temporary name and renamed over; an S3 object appears only once its upload
completes). A read is streamed in chunks, so a 200 MB file never sits in memory. boto3 blocks, so
every call to it runs in a thread, one chunk of a read at a time.
"""

from __future__ import annotations

import asyncio
import os
import re
import secrets
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any, Protocol

from switchboard.config import StorageConfig
from switchboard.sources.locations import S3Location, parse_location

_CHUNK_BYTES = 1 << 20
# Ids the router makes ("file-" and random letters); anything else could name a path or key
# outside the store's folder or prefix.
_FILE_ID = re.compile(r"^[A-Za-z0-9_-]{1,128}$")
_CREDENTIALS_HELP = (
    "give the router credentials the way AWS's SDK reads them (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, an instance or pod role) that may get, put and delete "
    "objects under the prefix and list the bucket (without s3:ListBucket a missing object reads as "
    "refused), or name a profile in the files store's storage.profile"
)


class FileStoreError(RuntimeError):
    """A store that cannot be reached or refuses; the message says what to do and names no secret."""


class FileStore(Protocol):
    """The contents of files, by file id."""

    async def put(self, file_id: str, source: Path) -> None:
        """Store the finished local file `source` as `file_id`, replacing any earlier bytes whole."""
        ...

    def read(self, file_id: str, *, chunk_bytes: int = _CHUNK_BYTES) -> AsyncIterator[bytes]:
        """The stored bytes in chunks; FileNotFoundError (at the first chunk) if there are none."""
        ...

    async def delete(self, file_id: str) -> None:
        """Forget `file_id`'s bytes; nothing happens if there are none."""
        ...

    async def size(self, file_id: str) -> int | None:
        """The stored bytes' length, None if there are none."""
        ...


def file_store(where: str, storage: StorageConfig | None = None) -> FileStore:
    """The store `where` names: "s3://bucket/prefix", or else a local folder (`~` expanded)."""
    if where.startswith("s3://"):
        return S3FileStore(where, storage)
    return LocalFileStore(Path(where).expanduser())


def _check_id(file_id: str) -> str:
    """`file_id`, if it is one the store can hold under its own name (ValueError otherwise)."""
    if not _FILE_ID.match(file_id):
        raise ValueError(f"{file_id!r} is not a file id (1-128 letters, digits, '-' and '_')")
    return file_id


def _check_chunk(chunk_bytes: int) -> None:
    if chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be at least 1, not {chunk_bytes}")


# --- a local folder -------------------------------------------------------------------------------


class LocalFileStore:
    """Files in one folder of this machine, readable by this user alone (the folder 0700, files 0600)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        try:
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise FileStoreError(
                f"cannot make the files folder {self.folder}: {exc.strerror or exc}; choose a folder "
                "this user may write, or an s3:// store"
            ) from None

    async def put(self, file_id: str, source: Path) -> None:
        path = self._path(file_id)
        await asyncio.to_thread(self._put, path, Path(source))

    async def read(self, file_id: str, *, chunk_bytes: int = _CHUNK_BYTES) -> AsyncIterator[bytes]:
        _check_chunk(chunk_bytes)
        # An open file keeps the bytes it was opened on: a put or delete meanwhile does not tear it.
        handle = await asyncio.to_thread(self._path(file_id).open, "rb")
        try:
            while chunk := await asyncio.to_thread(handle.read, chunk_bytes):
                yield chunk
        finally:
            handle.close()

    async def delete(self, file_id: str) -> None:
        path = self._path(file_id)
        with suppress(FileNotFoundError):
            await asyncio.to_thread(path.unlink)

    async def size(self, file_id: str) -> int | None:
        path = self._path(file_id)
        try:
            return (await asyncio.to_thread(path.stat)).st_size
        except FileNotFoundError:
            return None

    def _path(self, file_id: str) -> Path:
        return self.folder / _check_id(file_id)

    def _put(self, path: Path, source: Path) -> None:
        """Copy `source` to a temporary name beside `path`, then rename it over `path`: a rename
        within one folder is atomic, a copy straight onto `path` would show readers half a file."""
        # The '.' keeps temporary names apart from every file id (which holds none).
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(8)}.part")
        with source.open("rb") as reader:
            try:
                _copy(reader, temporary)
                os.replace(temporary, path)
            except OSError as exc:
                with suppress(OSError):
                    temporary.unlink()
                raise FileStoreError(
                    f"cannot write {path.name} to the files folder {self.folder}: {exc.strerror or exc}; "
                    "free space there or let this user write it"
                ) from exc
        _sync_folder(self.folder)


def _copy(reader: IO[bytes], target: Path) -> None:
    """`reader`'s bytes into the new file `target` (0600 whatever the umask), flushed to disk before
    it is renamed into place, so a crash cannot leave an empty or short file under the real name."""
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as writer:
        os.fchmod(fd, 0o600)
        while chunk := reader.read(_CHUNK_BYTES):
            writer.write(chunk)
        writer.flush()
        os.fsync(fd)


def _sync_folder(folder: Path) -> None:
    """Flush the folder's entries, so that the rename survives a crash too (best effort)."""
    with suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# --- an S3-compatible bucket ----------------------------------------------------------------------


class S3FileStore:
    """Files as objects under one prefix of one bucket, reached as model sources reach theirs."""

    def __init__(self, url: str, storage: StorageConfig | None = None) -> None:
        location = parse_location(url)
        if not isinstance(location, S3Location):
            raise ValueError(f"{url!r} is no S3 location: write s3://bucket/prefix")
        self._bucket = location.bucket
        self._prefix = location.prefix
        self.location = f"s3://{location.bucket}/{location.prefix}".rstrip("/")
        self._client: Any = self._make_client(storage or StorageConfig())
        self._transfer = self._transfer_config()

    def _make_client(self, storage: StorageConfig) -> Any:
        try:
            import boto3
            from botocore.config import Config
            from botocore.exceptions import BotoCoreError
        except ImportError:
            raise FileStoreError(
                f"the files store {self.location} needs boto3: install it (or Switchboard's `cpu` or "
                "`gpu` extra), or keep files in a local folder"
            ) from None
        try:
            session = boto3.session.Session(profile_name=storage.profile, region_name=storage.region)
            return session.client(
                "s3",
                endpoint_url=storage.endpoint_url,
                config=Config(retries={"mode": "standard", "max_attempts": 5}),
            )
        except BotoCoreError as exc:  # a profile the shared files lack, a region or endpoint unusable
            raise FileStoreError(
                f"{self.location}: {exc}; correct the files store's storage table (profile, region, "
                "endpoint_url) or the AWS settings of the environment"
            ) from None

    @staticmethod
    def _transfer_config() -> Any:
        from boto3.s3.transfer import TransferConfig

        # boto3's defaults (parts of 8 MB above 8 MB, 10 at once), in this process's threads: the
        # CRT transfer manager, where installed, would pick its own.
        return TransferConfig(preferred_transfer_client="classic")

    async def put(self, file_id: str, source: Path) -> None:
        key = self._key(file_id)
        await asyncio.to_thread(self._put, key, Path(source))

    async def read(self, file_id: str, *, chunk_bytes: int = _CHUNK_BYTES) -> AsyncIterator[bytes]:
        _check_chunk(chunk_bytes)
        key = self._key(file_id)
        # One GET serves one version of the object whole, even if a put replaces it meanwhile.
        body = await asyncio.to_thread(self._open, key)
        try:
            while chunk := await asyncio.to_thread(self._chunk, body, key, chunk_bytes):
                yield chunk
        finally:
            body.close()

    async def delete(self, file_id: str) -> None:
        key = self._key(file_id)
        await asyncio.to_thread(self._delete, key)

    async def size(self, file_id: str) -> int | None:
        key = self._key(file_id)
        return await asyncio.to_thread(self._size, key)

    def _key(self, file_id: str) -> str:
        _check_id(file_id)
        return f"{self._prefix}/{file_id}" if self._prefix else file_id

    # The blocking halves, each run in a thread.

    def _put(self, key: str, source: Path) -> None:
        # An object appears only when its upload completes (a multipart one at its last part).
        with self._errors(key):
            self._client.upload_file(str(source), self._bucket, key, Config=self._transfer)

    def _open(self, key: str) -> Any:
        with self._errors(key):
            return self._client.get_object(Bucket=self._bucket, Key=key)["Body"]

    def _chunk(self, body: Any, key: str, chunk_bytes: int) -> bytes:
        with self._errors(key):
            return bytes(body.read(chunk_bytes))

    def _delete(self, key: str) -> None:
        with self._errors(key):  # S3 answers a delete of a missing object as of any other
            self._client.delete_object(Bucket=self._bucket, Key=key)

    def _size(self, key: str) -> int | None:
        with self._errors(key):
            try:
                head = self._client.head_object(Bucket=self._bucket, Key=key)
            except Exception as exc:
                if _status(exc) != 404:
                    raise
                self._check_bucket()
                return None
            return int(head["ContentLength"])

    def _check_bucket(self) -> None:
        """A HEAD answers 404 without a body for a missing bucket as for a missing object: ask the
        bucket which it was. A 403 (no s3:ListBucket) cannot tell, and counts as the object missing."""
        try:
            self._client.head_bucket(Bucket=self._bucket)
        except Exception as exc:
            if _status(exc) == 404:
                raise FileStoreError(_no_bucket(self.location)) from None
            if _status(exc) != 403:
                raise

    @contextmanager
    def _errors(self, key: str) -> Iterator[None]:
        """botocore's failures as FileNotFoundError (no such object) or FileStoreError."""
        try:
            yield
        except (FileStoreError, FileNotFoundError):
            raise
        except Exception as exc:
            failure = _failure(self.location, key, exc)
            if failure is None:
                raise
            raise failure from exc


def _failure(location: str, key: str, error: Exception) -> Exception | None:
    """What `error` from boto3 means for a caller, or None for an error that is no store's."""
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

    if isinstance(error, S3UploadFailedError) and isinstance(error.__context__, ClientError):
        error = error.__context__  # boto3's transfer wraps the store's answer: read that
    what = f"{location} ({key})"
    if isinstance(error, NoCredentialsError):
        return FileStoreError(f"no credentials for {what}: {_CREDENTIALS_HELP}")
    if isinstance(error, ClientError):
        return _client_failure(location, what, error)
    if isinstance(error, BotoCoreError | OSError | S3UploadFailedError):
        return FileStoreError(
            f"the files store failed at {what}: {error}; check its endpoint (AWS_ENDPOINT_URL or the "
            "files store's storage.endpoint_url) and the network"
        )
    return None


def _client_failure(location: str, what: str, error: Any) -> Exception:
    code = str(error.response.get("Error", {}).get("Code", ""))
    status = _status(error)
    if code == "NoSuchBucket":
        return FileStoreError(_no_bucket(location))
    if code in ("NoSuchKey", "404") or status == 404:
        return FileNotFoundError(f"{what}: no such object")
    if (
        code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken")
        or status == 403
    ):
        return FileStoreError(f"{what}: the store refused access ({code or status}); {_CREDENTIALS_HELP}")
    return FileStoreError(f"{what}: the store answered {code or status}: {error}")


def _no_bucket(location: str) -> str:
    return (
        f"{location}: the bucket does not exist; create it, or correct the files store's location or "
        "its storage.endpoint_url"
    )


def _status(error: Exception) -> int:
    """The HTTP status of a botocore ClientError (0 for any other error)."""
    response = getattr(error, "response", None)
    if not isinstance(response, dict):
        return 0
    return int(response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
