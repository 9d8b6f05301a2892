"""Where a model's files are, as its `path` says: a local folder, `s3://bucket/prefix`, or
`hf://org/name[@revision]`; parsed once, each wrong one a ValueError that says what is wrong."""

from __future__ import annotations

import re

import msgspec

SCHEMES = ("s3://", "hf://")
# S3's bucket names: 3-63 lowercase letters, digits, dots and hyphens, starting and ending with a
# letter or digit.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# The Hub's repository ids: `org/name`, each part letters, digits, '-', '_' and '.'.
_REPO_PART = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


class LocalFolder(msgspec.Struct, frozen=True):
    """A folder on the worker's own disk."""

    path: str


class S3Location(msgspec.Struct, frozen=True):
    """Objects under `prefix/` in an S3-compatible bucket ("" for the whole bucket)."""

    bucket: str
    prefix: str


class HubLocation(msgspec.Struct, frozen=True):
    """A model repository on the Hugging Face Hub, at a revision (a branch, tag or commit; None: main)."""

    repo: str
    revision: str | None = None

    @property
    def pinned(self) -> bool:
        """Whether the revision is a commit id, which never moves."""
        return self.revision is not None and bool(_COMMIT.match(self.revision))


Location = LocalFolder | S3Location | HubLocation


def is_remote(path: str) -> bool:
    """Whether `path` names a store rather than a local folder."""
    return path.startswith(SCHEMES)


def parse_location(path: str) -> Location:
    """`path` as a location; ValueError saying what is wrong with it."""
    if path.startswith("s3://"):
        return _s3(path)
    if path.startswith("hf://"):
        return _hub(path)
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", path)
    if scheme:
        raise ValueError(
            f"{path!r}: models are read from a local folder, s3://bucket/prefix or hf://org/name[@revision],"
            f" not {scheme[1]}://"
        )
    if not path.strip():
        raise ValueError(
            "the model's path is empty: give a local folder, s3://bucket/prefix or hf://org/name"
        )
    return LocalFolder(path)


def _s3(path: str) -> S3Location:
    bucket, _, prefix = path.removeprefix("s3://").partition("/")
    if not bucket:
        raise ValueError(f"{path!r} names no bucket: write s3://bucket/prefix")
    if not _BUCKET.match(bucket) or ".." in bucket:
        raise ValueError(
            f"{path!r}: {bucket!r} is not a bucket name (3-63 lowercase letters, digits, '.' and '-')"
        )
    prefix = prefix.strip("/")
    if any(part in ("", ".", "..") for part in prefix.split("/")) and prefix:
        raise ValueError(f"{path!r}: the prefix may not hold empty, '.' or '..' parts")
    return S3Location(bucket=bucket, prefix=prefix)


def _hub(path: str) -> HubLocation:
    rest = path.removeprefix("hf://")
    repo, at, revision = rest.partition("@")
    parts = repo.strip("/").split("/")
    if len(parts) != 2 or not all(_REPO_PART.match(part) for part in parts):
        raise ValueError(f"{path!r}: write a Hub model as hf://org/name, optionally with @revision")
    if at and not revision.strip():
        raise ValueError(f"{path!r}: the revision after '@' is empty (a branch, tag or commit id)")
    return HubLocation(repo="/".join(parts), revision=revision.strip() or None)
