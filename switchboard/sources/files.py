"""A remote model's files as its store lists them, and the checks their bytes must pass once fetched.

A store says how to check each file: an S3 object by its ETag (the MD5 of its bytes, or of its
parts' MD5s for a multipart upload), a Hub file by the SHA-256 its LFS pointer records or by its git
blob id. A file whose fetched bytes do not pass is never used.
"""

from __future__ import annotations

import hashlib
from pathlib import PurePosixPath
from typing import Literal

import msgspec

# How a file's bytes are checked: "md5" (a single-part S3 ETag), "s3-multipart" (a multipart ETag:
# the MD5 of each `part_size` part's MD5, then "-N"), "sha256" (a Hub LFS file), "git-sha1" (a Hub
# file in git itself: its blob id), "size" (the store gives no digest: the size alone).
CheckKind = Literal["md5", "s3-multipart", "sha256", "git-sha1", "size"]


class RemoteFile(msgspec.Struct, frozen=True, kw_only=True):
    """One file of a remote model, as its store lists it."""

    # The path inside the model's folder, '/'-separated (checked by `safe_name`).
    name: str
    size: int
    check: CheckKind
    # The expected digest, as `check` computes it (hex; "<hex>-N" for "s3-multipart").
    digest: str = ""
    # "s3-multipart": the size of every part but the last.
    part_size: int = 0
    # What the store calls this version of the file (an S3 ETag, a Hub blob id): a resumed read
    # asks for exactly this version, so that a file replaced in the store restarts its fetch.
    version: str = ""


class Manifest(msgspec.Struct, frozen=True, kw_only=True):
    """What one listing of a remote model found: its revision and its files."""

    # The location as configured (`s3://bucket/prefix`, `hf://org/name@rev`).
    location: str
    # The revision listed: the Hub's commit id; for a bucket, a digest of its (key, ETag) listing.
    revision: str
    files: tuple[RemoteFile, ...]
    # When it was listed (unix seconds): a moving revision is listed again after `recheck_s`.
    listed_at: float
    # Whether `revision` can never move (a Hub commit id named in the location).
    pinned: bool = False

    @property
    def total_bytes(self) -> int:
        """The bytes of all its files."""
        return sum(file.size for file in self.files)


class UnsafeName(ValueError):
    """A store listed a file whose name would leave the model's folder."""


def safe_name(name: str) -> str:
    """`name` if it stays inside the model's folder (relative, no '..', no empty part), else UnsafeName."""
    path = PurePosixPath(name)
    if not name or path.is_absolute() or any(part in ("", ".", "..") for part in name.split("/")):
        raise UnsafeName(f"the store lists a file named {name!r}, which would leave the model's folder")
    return name


class Checker:
    """The running check of one file's bytes, fed in order from its first byte."""

    def __init__(self, file: RemoteFile) -> None:
        self._file = file
        self._size = 0
        self._whole = _hasher(file.check)
        if file.check == "git-sha1":
            self._whole.update(f"blob {file.size}\0".encode())
        # "s3-multipart": the current part's MD5, and the digests of the parts already done.
        self._part = hashlib.md5(usedforsecurity=False)
        self._part_fill = 0
        self._part_digests: list[bytes] = []

    def update(self, data: bytes | memoryview) -> None:
        """Take the next bytes of the file."""
        self._size += len(data)
        if self._file.check != "s3-multipart":
            self._whole.update(data)
            return
        view = memoryview(data)
        while view:
            take = min(len(view), self._file.part_size - self._part_fill)
            self._part.update(view[:take])
            self._part_fill += take
            view = view[take:]
            if self._part_fill == self._file.part_size:
                self._close_part()

    def mismatch(self) -> str | None:
        """Why the bytes taken are not the listed file's, or None when they are."""
        if self._size != self._file.size:
            return f"{self._file.name}: {self._size} bytes fetched, the store lists {self._file.size}"
        actual = self._digest()
        if actual is not None and actual != self._file.digest.lower():
            return f"{self._file.name}: {self._file.check} {actual} does not match the store's {self._file.digest}"
        return None

    def _digest(self) -> str | None:
        if self._file.check == "size":
            return None
        if self._file.check != "s3-multipart":
            return self._whole.hexdigest()
        if self._part_fill or not self._part_digests:
            self._close_part()
        joined = hashlib.md5(b"".join(self._part_digests), usedforsecurity=False).hexdigest()
        return f"{joined}-{len(self._part_digests)}"

    def _close_part(self) -> None:
        self._part_digests.append(self._part.digest())
        self._part = hashlib.md5(usedforsecurity=False)
        self._part_fill = 0


def _hasher(check: CheckKind) -> hashlib._Hash:
    if check == "sha256":
        return hashlib.sha256()
    if check == "git-sha1":
        return hashlib.sha1(usedforsecurity=False)
    return hashlib.md5(usedforsecurity=False)
