"""A ModelSource over a local folder: a test double for unit tests of the node cache.

It lists the folder's files with their MD5s as a bucket would, and serves them from an offset. A
test can make it fail after some bytes, change a file's version (a read of the old version is then
SourceChanged), serve corrupted bytes under the right listing, fail its listing, or slow each chunk.
What it was asked is appended to a record file, so a test counts the listings and the bytes read
by every process that used a copy of it (the source pickles, for a child process).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from switchboard.sources.files import Manifest, RemoteFile
from switchboard.sources.source import SourceChanged, SourceError


class FolderSource:
    """The files under `folder` as a remote model (see the module's docstring)."""

    def __init__(
        self,
        folder: Path,
        *,
        cache_key: str = "folder-model",
        rate_key: str = "folder test",
        pinned: bool = False,
        chunk_bytes: int = 64 * 1024,
        delay_s: float = 0.0,
        fail_after_bytes: int | None = None,
        record: Path | None = None,
    ) -> None:
        self.folder = folder
        self.location = f"s3://test/{folder.name}"
        self.cache_key = cache_key
        self.rate_key = rate_key
        self.pinned = pinned
        self.chunk_bytes = chunk_bytes
        # Seconds slept before each chunk (a slow store).
        self.delay_s = delay_s
        # A SourceError once this object has served this many bytes (a dropped connection).
        self.fail_after_bytes = fail_after_bytes
        self.fail_listing = False
        self.record = record or folder.with_name(f".{folder.name}.record")
        self._versions: dict[str, int] = {}
        self._corrupted: set[str] = set()
        self._served = 0

    def list_files(self) -> Manifest:
        """List the folder now: each file's MD5 and version; the revision is their digest."""
        self._note("list", 0)
        if self.fail_listing:
            raise SourceError(f"{self.location}: the store did not answer (a test's outage)")
        files = tuple(self._listed(path) for path in sorted(self.folder.rglob("*")) if path.is_file())
        revision = hashlib.sha256(repr([(f.name, f.version, f.digest) for f in files]).encode()).hexdigest()
        return Manifest(
            location=self.location, revision=revision, files=files, listed_at=time.time(), pinned=self.pinned
        )

    def read(self, file: RemoteFile, offset: int) -> Iterator[bytes]:
        """The file's bytes from `offset`, in chunks (as slow, as failing, as corrupt as asked)."""
        if file.version != str(self._version(file.name)):
            raise SourceChanged(f"{self.location}: {file.name} changed since it was listed")
        with (self.folder / file.name).open("rb") as source:
            source.seek(offset)
            first = offset == 0
            while chunk := source.read(self.chunk_bytes):
                if self.delay_s:
                    time.sleep(self.delay_s)
                if self.fail_after_bytes is not None and self._served + len(chunk) > self.fail_after_bytes:
                    raise SourceError(f"{self.location}: the connection dropped reading {file.name}")
                if file.name in self._corrupted and first:
                    chunk = bytes([chunk[0] ^ 0xFF]) + chunk[1:]
                first = False
                self._served += len(chunk)
                self._note("read", len(chunk))
                yield chunk

    def change_file(self, name: str, data: bytes) -> None:
        """Replace a file in the store: a new version, so the listing's revision moves too."""
        (self.folder / name).write_bytes(data)
        self._versions[name] = self._version(name) + 1

    def corrupt(self, name: str) -> None:
        """Serve the file with its first byte flipped, under its true listing."""
        self._corrupted.add(name)

    def list_calls(self) -> int:
        """How many listings every process using this source asked for."""
        return sum(1 for kind, _ in self._notes() if kind == "list")

    def bytes_read(self) -> int:
        """How many bytes every process using this source read."""
        return sum(count for kind, count in self._notes() if kind == "read")

    def calls(self) -> int:
        """Listings and chunks read, by every process using this source."""
        return len(self._notes())

    def total_bytes(self) -> int:
        """The bytes of the folder's files."""
        return sum(path.stat().st_size for path in self.folder.rglob("*") if path.is_file())

    def _listed(self, path: Path) -> RemoteFile:
        name = path.relative_to(self.folder).as_posix()
        data = path.read_bytes()
        return RemoteFile(
            name=name,
            size=len(data),
            check="md5",
            digest=hashlib.md5(data, usedforsecurity=False).hexdigest(),
            version=str(self._version(name)),
        )

    def _version(self, name: str) -> int:
        return self._versions.get(name, 1)

    def _note(self, kind: str, count: int) -> None:
        # One small O_APPEND write per note: whole lines even with several processes writing.
        descriptor = os.open(self.record, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(descriptor, f"{kind} {count}\n".encode())
        finally:
            os.close(descriptor)

    def _notes(self) -> list[tuple[str, int]]:
        if not self.record.exists():
            return []
        lines = self.record.read_text().splitlines()
        return [(kind, int(count)) for kind, count in (line.split() for line in lines)]


def write_model(folder: Path, *, shard_bytes: int = 1024 * 1024, shards: int = 2, seed: int = 0) -> Path:
    """A model-like folder: a small config and `shards` weight files of `shard_bytes` each."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(f'{{"model_type": "test", "seed": {seed}}}')
    for index in range(shards):
        data = hashlib.sha256(f"{seed}-{index}".encode()).digest() * (shard_bytes // 32 + 1)
        (folder / f"model-{index:05d}.safetensors").write_bytes(data[:shard_bytes])
    return folder
