"""The node cache's entries on disk: where each thing lies, who holds an entry, when it was last used,
and the eviction of the least recently used unheld entries to make room within the budget.

Every process of a host shares the folder, so every rule here holds across processes through the
kernel's `flock`: a holder keeps a shared lock on its entry's `use.lock` (released by the kernel if the
process dies), and eviction takes that lock exclusively without waiting, skipping an entry it cannot
take. The layout under the root:

    node-id                              the node's id, made once
    models/<cache_key>/fetch.lock        held exclusively while one process fetches this location
    models/<cache_key>/progress.json     that fetch's DownloadProgress
    models/<cache_key>/partial/          the fetch under way: model/<name>.part until checked
    models/<cache_key>/rev-<id>/         a complete entry: model/ (the folder an engine loads),
                                         use.lock (its mtime is the last use), manifest.json (last)
    rates/                               measured download rates, per store
    trash/                               entries being deleted
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec

from switchboard.sources.files import Manifest
from switchboard.sources.source import SourceError

logger = logging.getLogger(__name__)

MODEL_DIR = "model"
MANIFEST = "manifest.json"
USE_LOCK = "use.lock"
PARTIAL = "partial"
# Free disk left untouched by a fetch, so that a full cache never fills the disk to its last byte.
DISK_MARGIN_BYTES = 256 * 1024**2

_manifest_decoder = msgspec.json.Decoder(Manifest)


class CacheFull(SourceError):
    """The model does not fit in the node cache even after evicting every entry nobody holds.
    `held` says whether entries held by models in use stand in the way (room may come when they
    leave) or the budget and disk are too small for the model alone."""

    def __init__(self, message: str, *, held: bool) -> None:
        super().__init__(message)
        self.held = held


class CacheLayout:
    """Where each thing lies under the node cache's root."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.models = root / "models"
        self.rates = root / "rates"
        self.trash = root / "trash"
        self.node_id_file = root / "node-id"

    def key_dir(self, cache_key: str) -> Path:
        """The folder of one location's entries."""
        return self.models / cache_key

    def fetch_lock(self, cache_key: str) -> Path:
        """The lock one process holds while it fetches this location."""
        return self.key_dir(cache_key) / "fetch.lock"

    def progress_file(self, cache_key: str) -> Path:
        """The running fetch's DownloadProgress."""
        return self.key_dir(cache_key) / "progress.json"

    def partial(self, cache_key: str) -> Path:
        """The fetch under way (or abandoned by a killed fetcher, to resume)."""
        return self.key_dir(cache_key) / PARTIAL

    def entry(self, cache_key: str, revision: str) -> CacheEntry:
        """The complete entry of one revision (which may not exist)."""
        digest = hashlib.sha256(revision.encode()).hexdigest()[:16]
        return CacheEntry(self.key_dir(cache_key) / f"rev-{digest}")


@dataclass(frozen=True)
class CacheEntry:
    """One revision of a model in the cache: complete once its manifest is there."""

    path: Path

    @property
    def model_dir(self) -> Path:
        """The folder an engine loads from."""
        return self.path / MODEL_DIR

    @property
    def use_lock(self) -> Path:
        """Shared-locked by each holder; its mtime is the entry's last use."""
        return self.path / USE_LOCK

    def manifest(self) -> Manifest | None:
        """The listing it was fetched from, or None while incomplete (or gone)."""
        try:
            return _manifest_decoder.decode((self.path / MANIFEST).read_bytes())
        except (FileNotFoundError, NotADirectoryError):
            return None

    def last_use(self) -> float:
        """When a fetch or a release last touched it (0 when gone)."""
        try:
            return self.use_lock.stat().st_mtime
        except FileNotFoundError:
            return 0.0

    def touch(self) -> None:
        """Mark it used now, for LRU eviction."""
        with contextlib.suppress(FileNotFoundError):
            os.utime(self.use_lock)


def write_manifest(folder: Path, manifest: Manifest) -> None:
    """Write (or replace, atomically) the manifest that makes `folder` a complete entry."""
    temporary = folder / f".{MANIFEST}.{uuid.uuid4().hex}"
    temporary.write_bytes(msgspec.json.encode(manifest))
    os.replace(temporary, folder / MANIFEST)


def complete_entries(layout: CacheLayout, cache_key: str) -> list[tuple[CacheEntry, Manifest]]:
    """The complete entries of one location, the most recently listed first."""
    found = []
    with contextlib.suppress(FileNotFoundError):
        for path in layout.key_dir(cache_key).iterdir():
            if path.name.startswith("rev-"):
                entry = CacheEntry(path)
                manifest = entry.manifest()
                if manifest is not None:
                    found.append((entry, manifest))
    return sorted(found, key=lambda pair: pair[1].listed_at, reverse=True)


def cached_keys(layout: CacheLayout) -> set[str]:
    """The locations with at least one complete entry."""
    with contextlib.suppress(FileNotFoundError):
        return {path.name for path in layout.models.iterdir() if complete_entries(layout, path.name)}
    return set()


def try_lock(path: Path, *, shared: bool = False) -> int | None:
    """An open descriptor holding `flock` on `path` (made if missing), or None when another holds it."""
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, (fcntl.LOCK_SH if shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        return None
    return descriptor


def unlock(descriptor: int) -> None:
    """Release a lock `try_lock` or `hold` took."""
    fcntl.flock(descriptor, fcntl.LOCK_UN)
    os.close(descriptor)


def hold(entry: CacheEntry) -> int | None:
    """A shared lock on the entry's use-lock that keeps it from eviction, or None when it is gone
    (an evictor took it first: the lock file we opened is then no longer the entry's)."""
    try:
        descriptor = os.open(entry.use_lock, os.O_RDWR)
    except (FileNotFoundError, NotADirectoryError):
        return None
    # Waits only while an evictor deletes the entry (it holds the lock exclusively for that alone).
    fcntl.flock(descriptor, fcntl.LOCK_SH)
    try:
        still_there = os.stat(entry.use_lock).st_ino == os.fstat(descriptor).st_ino
    except FileNotFoundError:
        still_there = False
    if not still_there or entry.manifest() is None:
        unlock(descriptor)
        return None
    entry.touch()
    return descriptor


def remove_unheld(layout: CacheLayout, entry: CacheEntry) -> bool:
    """Delete the entry unless someone holds it; whether it was deleted."""
    descriptor = try_lock(entry.use_lock) if entry.path.is_dir() else None
    if descriptor is None:
        return False
    try:
        doomed = _to_trash(layout, entry.path)
    finally:
        # Released before the slow part: a process waiting to hold the entry finds it gone at once.
        unlock(descriptor)
    if doomed is not None:
        shutil.rmtree(doomed, ignore_errors=True)
    return True


def folder_bytes(folder: Path) -> int:
    """The bytes of the files under `folder`."""
    total = 0
    for directory, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                total += os.lstat(os.path.join(directory, name)).st_size
    return total


def used_bytes(layout: CacheLayout) -> int:
    """The bytes of the complete entries and the partial folders."""
    total = 0
    for cache_key in _keys(layout):
        total += sum(manifest.total_bytes for _, manifest in complete_entries(layout, cache_key))
        total += folder_bytes(layout.partial(cache_key))
    return total


def make_room(layout: CacheLayout, needed: int, budget: int | None, *, location: str) -> None:
    """Evict least recently used entries nobody holds until `needed` more bytes fit within the
    budget and the free disk; CacheFull when they do not fit even then."""
    shutil.rmtree(layout.trash, ignore_errors=True)
    for candidate in _eviction_order(layout):
        if _fits(layout, needed, budget):
            return
        if _evict(layout, candidate):
            logger.info(
                f"evicted {candidate} from the node cache to fit {location}",
                extra={"entry": str(candidate), "location": location},
            )
    if not _fits(layout, needed, budget):
        held = _held_entries(layout)
        raise CacheFull(_full_message(layout, needed, budget, location, held), held=bool(held))


def _keys(layout: CacheLayout) -> list[str]:
    with contextlib.suppress(FileNotFoundError):
        return [path.name for path in layout.models.iterdir() if path.is_dir()]
    return []


def _fits(layout: CacheLayout, needed: int, budget: int | None) -> bool:
    if budget is not None and used_bytes(layout) + needed > budget:
        return False
    layout.root.mkdir(parents=True, exist_ok=True)
    return shutil.disk_usage(layout.root).free - DISK_MARGIN_BYTES >= needed


def _eviction_order(layout: CacheLayout) -> list[Path]:
    """Every complete entry and every partial folder, least recently used first."""
    candidates: list[tuple[float, Path]] = []
    for cache_key in _keys(layout):
        for entry, _ in complete_entries(layout, cache_key):
            candidates.append((entry.last_use(), entry.path))
        partial = layout.partial(cache_key)
        with contextlib.suppress(FileNotFoundError):
            candidates.append((partial.stat().st_mtime, partial))
    return [path for _, path in sorted(candidates)]


def _evict(layout: CacheLayout, path: Path) -> bool:
    if path.name != PARTIAL:
        return remove_unheld(layout, CacheEntry(path))
    # A partial folder is its fetcher's while it holds the location's fetch lock; without one it
    # was abandoned (its fetcher was killed), and resuming it is worth less than room for a fetch.
    descriptor = try_lock(path.parent / "fetch.lock")
    if descriptor is None:
        return False
    try:
        discard(layout, path)
    finally:
        unlock(descriptor)
    return True


def discard(layout: CacheLayout, path: Path) -> None:
    """Delete a folder of the cache."""
    doomed = _to_trash(layout, path)
    if doomed is not None:
        shutil.rmtree(doomed, ignore_errors=True)


def _to_trash(layout: CacheLayout, path: Path) -> Path | None:
    """Move a folder into the trash (a rename, so that no other process sees a half-deleted entry as
    complete): its new path, or None when it was gone already."""
    layout.trash.mkdir(parents=True, exist_ok=True)
    doomed = layout.trash / uuid.uuid4().hex
    try:
        os.rename(path, doomed)
    except FileNotFoundError:
        return None
    return doomed


def _held_entries(layout: CacheLayout) -> list[str]:
    """The complete entries a model in use holds, as `key (size)`."""
    return [
        f"{cache_key} ({manifest.total_bytes / 1e9:.2f} GB)"
        for cache_key in _keys(layout)
        for entry, manifest in complete_entries(layout, cache_key)
        if _is_held(entry)
    ]


def _is_held(entry: CacheEntry) -> bool:
    try:
        descriptor = try_lock(entry.use_lock)
    except (FileNotFoundError, NotADirectoryError):
        return False  # evicted meanwhile
    if descriptor is None:
        return True
    unlock(descriptor)
    return False


def _full_message(
    layout: CacheLayout, needed: int, budget: int | None, location: str, held: list[str]
) -> str:
    free = shutil.disk_usage(layout.root).free
    limit = "no budget" if budget is None else f"a budget of {budget / 1e9:.2f} GB"
    return (
        f"the node cache at {layout.root} cannot fit {location}: it needs {needed / 1e9:.2f} GB more, "
        f"with {limit}, {used_bytes(layout) / 1e9:.2f} GB used and {free / 1e9:.2f} GB free on its disk; "
        f"held by models in use on this host: {', '.join(held) or 'nothing'}. "
        "Raise the worker's model_cache_gib, free disk space, or unload a model held on this host."
    )


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold `flock` on `path` exclusively for a short critical section (waits for it)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        yield
    finally:
        os.close(descriptor)


def age_s(manifest: Manifest) -> float:
    """Seconds since the manifest was listed."""
    return time.time() - manifest.listed_at
