"""A model's files in an S3-compatible bucket (AWS S3, MinIO, R2, Ceph...), through boto3.

The endpoint, region and credentials are found the way AWS's SDK finds them for any program: the
environment (`AWS_ENDPOINT_URL`, `AWS_DEFAULT_REGION`, `AWS_ACCESS_KEY_ID`...), the shared files
(`~/.aws/config`, `~/.aws/credentials`), an instance's or a pod's role; a model's `storage` table
names an endpoint, a region or a profile of the shared files on top. Each object is checked by its
ETag: the MD5 of its bytes, or for a multipart upload the MD5 of its parts' MD5s (the part size read
from the object's first part); by its size alone when its ETag is no MD5 (an object encrypted with
KMS or a customer's key, which a listing does not show: each object's HEAD says).
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from switchboard.config import StorageConfig
from switchboard.sources.files import CheckKind, Manifest, RemoteFile, UnsafeName, safe_name
from switchboard.sources.locations import S3Location
from switchboard.sources.source import SourceChanged, SourceError

CHUNK_BYTES = 1 << 20
_MULTIPART_ETAG = re.compile(r"^[0-9a-f]{32}-\d+$")
_PLAIN_ETAG = re.compile(r"^[0-9a-f]{32}$")
_CREDENTIALS_HELP = (
    "give the worker credentials the way AWS's SDK reads them (AWS_ACCESS_KEY_ID and "
    "AWS_SECRET_ACCESS_KEY, ~/.aws/credentials, an instance or pod role), or name a profile in the "
    "model's storage.profile"
)


class S3Source:
    """The objects under one prefix of one bucket, as one model's files."""

    def __init__(self, location: S3Location, storage: StorageConfig | None, *, concurrency: int = 4) -> None:
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError

        storage = storage or StorageConfig()
        self._location = location
        self._concurrency = max(1, concurrency)
        self.location = f"s3://{location.bucket}/{location.prefix}".rstrip("/")
        try:
            session = boto3.session.Session(profile_name=storage.profile, region_name=storage.region)
            self._client: Any = session.client(
                "s3",
                endpoint_url=storage.endpoint_url,
                config=Config(
                    retries={"mode": "standard", "max_attempts": 5},
                    max_pool_connections=max(10, concurrency * 2),
                ),
            )
        except BotoCoreError as exc:  # a profile the shared files lack, a region or endpoint unusable
            raise SourceError(
                f"{self.location}: {exc}; correct the model's storage table (profile, region, endpoint_url) "
                "or the AWS settings of the environment"
            ) from None
        endpoint = str(self._client.meta.endpoint_url)
        self.rate_key = f"s3 {endpoint}"
        where = f"{endpoint}|{location.bucket}|{location.prefix}"
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{location.bucket}-{location.prefix}").strip("-")[:64]
        self.cache_key = f"s3-{slug}-{hashlib.sha256(where.encode()).hexdigest()[:12]}"

    def list_files(self) -> Manifest:
        """Every object under the prefix (a folder's marker objects left out), each with its check."""
        prefix = f"{self._location.prefix}/" if self._location.prefix else ""
        listed: list[tuple[str, int, str]] = []  # (key, size, ETag without quotes)
        with _s3_errors(self.location):
            pages = self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self._location.bucket, Prefix=prefix
            )
            for page in pages:
                for entry in page.get("Contents", []):
                    key = str(entry["Key"])
                    if not key.endswith("/"):
                        listed.append((key, int(entry["Size"]), str(entry["ETag"]).strip('"').lower()))
        if not listed:
            raise SourceError(
                f"{self.location} holds no files: upload the model's folder there (its config.json, weights "
                "and tokenizer), or correct the model's path"
            )
        with ThreadPoolExecutor(self._concurrency, thread_name_prefix="s3-head") as pool:
            files = list(pool.map(lambda item: self._file(*item, prefix=prefix), listed))
        listing = "\n".join(sorted(f"{file.name} {file.version}" for file in files))
        return Manifest(
            location=self.location,
            revision=hashlib.sha256(listing.encode()).hexdigest(),
            files=tuple(sorted(files, key=lambda file: file.name)),
            listed_at=time.time(),
        )

    def read(self, file: RemoteFile, offset: int) -> Iterator[bytes]:
        """The object's bytes from `offset`, of exactly the version listed (SourceChanged otherwise)."""
        key = self._key(file.name)
        request: dict[str, Any] = {"Bucket": self._location.bucket, "Key": key}
        if file.version:
            request["IfMatch"] = file.version
        if offset:
            request["Range"] = f"bytes={offset}-"
        with _s3_errors(self.location, key):
            body = self._client.get_object(**request)["Body"]
        try:
            with _s3_errors(self.location, key):
                yield from body.iter_chunks(CHUNK_BYTES)
        finally:
            body.close()

    def _key(self, name: str) -> str:
        return f"{self._location.prefix}/{name}" if self._location.prefix else name

    def _file(self, key: str, size: int, etag: str, *, prefix: str) -> RemoteFile:
        """The object as a file of the model, checked by its ETag where that is an MD5 (of its bytes,
        or of its parts' MD5s), by its size where it is not (an object encrypted with KMS or a
        customer's key; a multipart object whose parts' sizes the store does not say, or differ)."""
        try:
            name = safe_name(key.removeprefix(prefix))
        except UnsafeName as exc:
            raise SourceError(f"{self.location}: {exc}; rename or remove that object") from None
        head = self._head(key, multipart=bool(_MULTIPART_ETAG.match(etag)))
        check: CheckKind = "size"
        digest, part_size = "", 0
        if head is not None and _PLAIN_ETAG.match(etag):
            check, digest = "md5", etag
        elif head is not None and _MULTIPART_ETAG.match(etag) and _same_parts(size, head, etag):
            check, digest, part_size = "s3-multipart", etag, int(head["ContentLength"])
        return RemoteFile(
            name=name, size=size, check=check, digest=digest, part_size=part_size, version=f'"{etag}"'
        )

    def _head(self, key: str, *, multipart: bool) -> dict[str, Any] | None:
        """The object's HEAD (its first part's, for a multipart object: that part's size is the part
        size), or None when its ETag is no MD5: encrypted with KMS or a customer's key, or the store
        does not answer (some S3-compatible stores know no PartNumber)."""
        request: dict[str, Any] = {"Bucket": self._location.bucket, "Key": key}
        if multipart:
            request["PartNumber"] = 1
        try:
            head: dict[str, Any] = self._client.head_object(**request)
        except Exception:
            return None if multipart else {}  # a plain ETag stays an MD5 unless the store says otherwise
        if str(head.get("ServerSideEncryption", "")).startswith("aws:kms") or head.get(
            "SSECustomerAlgorithm"
        ):
            return None
        return head


def _same_parts(size: int, first_part: dict[str, Any], etag: str) -> bool:
    """Whether the object's parts are all the size of its first (but the last): the ETag's part
    count is then the size over the first part's. Some uploaders vary their parts' sizes, and the
    check would then fail bytes that are right."""
    part_size = int(first_part.get("ContentLength") or 0)
    return part_size > 0 and -(-size // part_size) == int(etag.rpartition("-")[2])


class _s3_errors:
    """botocore's failures as SourceError (SourceChanged for an object replaced or gone since its
    listing), each naming the location and what to do."""

    def __init__(self, location: str, key: str | None = None) -> None:
        self._location = location
        self._key = key

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, tb: object) -> None:
        if error is None or not isinstance(error, Exception) or isinstance(error, SourceError):
            return
        from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError, NoCredentialsError

        what = f"{self._location} ({self._key})" if self._key else self._location
        if isinstance(error, FlexibleChecksumError):
            raise SourceError(
                f"the bytes of {what} fail the checksum the store sent with them ({error}): its copy is "
                "corrupt, or was changed on the way; upload the file again"
            ) from error
        if isinstance(error, NoCredentialsError):
            raise SourceError(f"no credentials to read {what}: {_CREDENTIALS_HELP}") from error
        if isinstance(error, ClientError):
            code = str(error.response.get("Error", {}).get("Code", ""))
            status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
            raise _client_error(what, code, status, error) from error
        if isinstance(error, BotoCoreError | OSError):
            raise SourceError(
                f"cannot reach the store of {what}: {error}; check its endpoint (AWS_ENDPOINT_URL or the "
                "model's storage.endpoint_url) and the network"
            ) from error


def _client_error(what: str, code: str, status: int, error: Exception) -> SourceError:
    if code in ("PreconditionFailed", "NoSuchKey") or status == 412:
        return SourceChanged(f"{what} changed in the store since it was listed")
    if code == "NoSuchBucket":
        return SourceError(
            f"{what}: the bucket does not exist; correct the model's path or its storage.endpoint_url"
        )
    if (
        code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken")
        or status == 403
    ):
        return SourceError(f"{what}: the store refused access ({code or status}); {_CREDENTIALS_HELP}")
    return SourceError(f"{what}: the store answered {code or status}: {error}")
