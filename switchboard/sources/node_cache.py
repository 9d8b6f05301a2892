"""The node cache: one folder per worker host into which remote models' files are fetched once per
host, and from which engines load them.

Every worker process of the host shares the folder, so the rules hold across processes: one fetch
per location at a time (an exclusive `flock`; the others wait for it, reading its progress, and then
find its entry); a complete entry used without asking the store while its listing is younger than
`recheck_s` (or its revision is pinned); a moving revision re-listed after that, and a new revision
fetched as a new entry while holders of the old one go on using it; partial files never used; the
least recently used entries nobody holds evicted to make room within the budget.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType

import msgspec

from switchboard.sources import cache_entries as entries
from switchboard.sources.cache_entries import CacheEntry, CacheFull, CacheLayout
from switchboard.sources.downloads import (
    LISTING,
    DownloadProgress,
    ProgressMeter,
    fetch_files,
    median_rate,
    prepare_partial,
    record_rate,
)
from switchboard.sources.files import Manifest
from switchboard.sources.source import ModelSource, SourceChanged, SourceError

__all__ = ["CacheFull", "CachedFiles", "DownloadProgress", "NodeCache"]

logger = logging.getLogger(__name__)

ProgressCallback = Callable[[DownloadProgress], None]

# How often a process waiting for another's fetch looks at its lock and its progress.
_WAIT_POLL_S = 0.05

_progress_decoder = msgspec.json.Decoder(DownloadProgress)


class CachedFiles:
    """A model's files in the node cache, held: never evicted while held."""

    def __init__(
        self,
        cache: NodeCache,
        cache_key: str,
        entry: CacheEntry,
        lock: int,
        manifest: Manifest,
        *,
        fetched_bytes: int,
        fetch_s: float,
    ) -> None:
        # The complete, checked model folder an engine loads from.
        self.folder = entry.model_dir
        self.manifest = manifest
        # Bytes this call fetched (0: a cache hit, or another process fetched them).
        self.fetched_bytes = fetched_bytes
        # Seconds this call spent fetching, or waiting for another process's fetch.
        self.fetch_s = fetch_s
        self._cache = cache
        self._cache_key = cache_key
        self._entry = entry
        self._lock: int | None = lock

    def release(self) -> None:
        """Let the cache evict the files again (idempotent); an older revision nobody holds any more
        leaves the cache at once."""
        if self._lock is None:
            return
        self._entry.touch()
        entries.unlock(self._lock)
        self._lock = None
        self._cache.drop_if_superseded(self._cache_key, self._entry)

    def __enter__(self) -> CachedFiles:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.release()


class NodeCache:
    """This host's cache of remote models' files; see the module's docstring for its rules."""

    def __init__(
        self, root: Path, *, budget_bytes: int | None, recheck_s: float, concurrency: int = 4
    ) -> None:
        self.root = root
        self.budget_bytes = budget_bytes
        self.recheck_s = recheck_s
        self.concurrency = concurrency
        self._layout = CacheLayout(root)
        self._layout.models.mkdir(parents=True, exist_ok=True)
        # A random id kept in root/node-id: the same for every process sharing the folder.
        self.node_id = _node_id(self._layout.node_id_file)

    def fetch(self, source: ModelSource, on_progress: ProgressCallback | None = None) -> CachedFiles:
        """The model's complete, checked files, held until `release()`: from the cache when it has
        a fresh entry, else listed and fetched (or waited for, when another process fetches them).
        Blocking; SourceError (CacheFull among them) when the files cannot be had."""
        started = time.monotonic()
        cache_key = _checked_key(source.cache_key)
        self._layout.key_dir(cache_key).mkdir(parents=True, exist_ok=True)
        held = self._hold_fresh(cache_key, started)
        if held is not None:
            return held
        with self._fetch_lock(cache_key, on_progress):
            # Another process may have fetched (or listed) it while this one waited.
            held = self._hold_fresh(cache_key, started)
            if held is not None:
                return held
            return self._list_and_fetch(source, cache_key, on_progress, started)

    def has(self, cache_key: str) -> bool:
        """Whether a complete entry is here (no network; freshness not considered)."""
        return bool(entries.complete_entries(self._layout, cache_key))

    def cached_keys(self) -> set[str]:
        """The cache keys of the locations with a complete entry here."""
        return entries.cached_keys(self._layout)

    def progress(self, cache_key: str) -> DownloadProgress | None:
        """How far a fetch on this node (by any process) has come; None when none runs."""
        progress = _read_progress(self._layout.progress_file(cache_key))
        if progress is None:
            return None
        lock = self._layout.fetch_lock(cache_key)
        if not lock.exists():
            return None
        descriptor = entries.try_lock(lock)
        if descriptor is not None:
            # Nobody holds the lock: the file is a killed fetcher's.
            entries.unlock(descriptor)
            return None
        return progress

    def rate_bps(self, rate_key: str) -> float | None:
        """This node's measured download rate from that store (the median of recent fetches)."""
        return median_rate(self._layout.rates, rate_key)

    def used_bytes(self) -> int:
        """The bytes of the complete entries and the partial folders."""
        return entries.used_bytes(self._layout)

    def drop_if_superseded(self, cache_key: str, entry: CacheEntry) -> None:
        """Delete `entry` if a newer revision of its location is complete here and nobody holds it."""
        complete = entries.complete_entries(self._layout, cache_key)
        if complete and complete[0][0] != entry and entries.remove_unheld(self._layout, entry):
            logger.info(
                f"removed an older revision of {cache_key} from the node cache (nobody holds it)",
                extra={"cache_key": cache_key, "entry": str(entry.path)},
            )

    def _hold_fresh(self, cache_key: str, started: float) -> CachedFiles | None:
        complete = entries.complete_entries(self._layout, cache_key)
        if not complete:
            return None
        entry, manifest = complete[0]
        if not manifest.pinned and entries.age_s(manifest) >= self.recheck_s:
            return None
        return self._hold(cache_key, entry, started)

    def _hold(self, cache_key: str, entry: CacheEntry, started: float) -> CachedFiles | None:
        lock = entries.hold(entry)
        manifest = entry.manifest()
        if lock is None or manifest is None:
            return None
        return CachedFiles(
            self, cache_key, entry, lock, manifest, fetched_bytes=0, fetch_s=time.monotonic() - started
        )

    def _list_and_fetch(
        self, source: ModelSource, cache_key: str, on_progress: ProgressCallback | None, started: float
    ) -> CachedFiles:
        complete = entries.complete_entries(self._layout, cache_key)
        try:
            manifest = source.list_files()
        except SourceError as exc:
            held = self._hold(cache_key, complete[0][0], started) if complete else None
            if held is None:
                raise
            logger.warning(
                f"listing {source.location} failed ({exc}); using its cached revision {held.manifest.revision}",
                extra={"location": source.location, "revision": held.manifest.revision},
            )
            return held
        for attempt in (1, 2):
            held = self._hold_listed(source, cache_key, manifest, started)
            if held is not None:
                return held
            try:
                return self._download(source, cache_key, manifest, on_progress, started)
            except SourceChanged as exc:
                if attempt == 2:
                    raise
                logger.info(
                    f"{source.location} changed during its fetch ({exc}); listing it again",
                    extra={"location": source.location},
                )
                manifest = source.list_files()
        raise AssertionError("unreachable")

    def _hold_listed(
        self, source: ModelSource, cache_key: str, manifest: Manifest, started: float
    ) -> CachedFiles | None:
        """The complete entry of the revision just listed, its listing renewed, if there is one."""
        entry = self._layout.entry(cache_key, manifest.revision)
        cached = entry.manifest()
        if cached is None or cached.revision != manifest.revision:
            return None
        entries.write_manifest(entry.path, msgspec.structs.replace(cached, listed_at=manifest.listed_at))
        logger.info(
            f"listed {source.location} again: still revision {manifest.revision}",
            extra={"location": source.location, "revision": manifest.revision},
        )
        return self._hold(cache_key, entry, started)

    def _download(
        self,
        source: ModelSource,
        cache_key: str,
        manifest: Manifest,
        on_progress: ProgressCallback | None,
        started: float,
    ) -> CachedFiles:
        partial = self._layout.partial(cache_key)
        earlier = [
            (listed, entry.model_dir) for entry, listed in entries.complete_entries(self._layout, cache_key)
        ]
        present = prepare_partial(partial, manifest, earlier)
        entries.make_room(
            self._layout, manifest.total_bytes - present, self.budget_bytes, location=source.location
        )
        # Held from birth: the entry must not be evicted between its rename and its first holder.
        lock = entries.try_lock(partial / entries.USE_LOCK, shared=True)
        assert lock is not None, "only an evictor takes a use-lock exclusively, and never a partial's"
        logger.info(
            f"fetching {source.location} ({manifest.total_bytes / 1e6:.1f} MB, revision {manifest.revision},"
            f" {present / 1e6:.1f} MB already here)",
            extra={"location": source.location, "bytes": manifest.total_bytes, "revision": manifest.revision},
        )
        progress_file = self._layout.progress_file(cache_key)
        meter = ProgressMeter(manifest, present, _reporter(progress_file, on_progress))
        meter.report()
        try:
            fetch_files(source, manifest, partial, meter, concurrency=self.concurrency)
            meter.report()  # the last report: every byte there
            entry = self._complete(cache_key, partial, manifest)
        except BaseException:
            entries.unlock(lock)
            raise
        finally:
            progress_file.unlink(missing_ok=True)
        seconds = meter.seconds()
        record_rate(self._layout.rates, source.rate_key, meter.fetched, seconds)
        logger.info(
            f"fetched {source.location}: {meter.fetched / 1e6:.1f} MB in {seconds:.1f} s"
            f" ({meter.fetched / seconds / 1e6 if seconds else 0.0:.1f} MB/s)",
            extra={"location": source.location, "bytes": meter.fetched, "seconds": round(seconds, 3)},
        )
        self._drop_older(cache_key, entry)
        entry.touch()
        fetch_s = time.monotonic() - started
        return CachedFiles(
            self, cache_key, entry, lock, manifest, fetched_bytes=meter.fetched, fetch_s=fetch_s
        )

    def _complete(self, cache_key: str, partial: Path, manifest: Manifest) -> CacheEntry:
        """Turn the fetched partial folder into the revision's complete entry: manifest last."""
        (partial / LISTING).unlink(missing_ok=True)
        entries.write_manifest(partial, manifest)
        entry = self._layout.entry(cache_key, manifest.revision)
        if entry.path.exists():
            # Left by an evictor killed half way (complete entries are found before any fetch).
            entries.discard(self._layout, entry.path)
        os.rename(partial, entry.path)
        return entry

    def _drop_older(self, cache_key: str, newest: CacheEntry) -> None:
        for entry, _ in entries.complete_entries(self._layout, cache_key):
            if entry != newest:
                self.drop_if_superseded(cache_key, entry)

    @contextlib.contextmanager
    def _fetch_lock(self, cache_key: str, on_progress: ProgressCallback | None) -> Iterator[None]:
        """Hold the location's fetch lock; while another process holds it, report its progress."""
        lock_path = self._layout.fetch_lock(cache_key)
        progress_file = self._layout.progress_file(cache_key)
        last_seen: DownloadProgress | None = None
        while (descriptor := entries.try_lock(lock_path)) is None:
            if on_progress is not None:
                progress = _read_progress(progress_file)
                if progress is not None and progress != last_seen:
                    on_progress(progress)
                    last_seen = progress
            time.sleep(_WAIT_POLL_S)
        try:
            yield
        finally:
            entries.unlock(descriptor)


def _reporter(progress_file: Path, on_progress: ProgressCallback | None) -> ProgressCallback:
    def report(progress: DownloadProgress) -> None:
        temporary = progress_file.with_name(f".progress.{uuid.uuid4().hex}")
        temporary.write_bytes(msgspec.json.encode(progress))
        os.replace(temporary, progress_file)
        if on_progress is not None:
            on_progress(progress)

    return report


def _read_progress(path: Path) -> DownloadProgress | None:
    try:
        return _progress_decoder.decode(path.read_bytes())
    except (FileNotFoundError, msgspec.DecodeError):
        return None


def _checked_key(cache_key: str) -> str:
    if not cache_key or "/" in cache_key or cache_key in (".", "..") or cache_key.startswith("."):
        raise SourceError(f"the cache key {cache_key!r} is not one folder name; this is a bug in its source")
    return cache_key


def _node_id(path: Path) -> str:
    """The id in `path`, made once: the first process to link its own file there wins."""
    with contextlib.suppress(FileNotFoundError):
        return path.read_text().strip()
    temporary = path.with_name(f".node-id.{uuid.uuid4().hex}")
    temporary.write_text(uuid.uuid4().hex[:12])
    with contextlib.suppress(FileExistsError):
        os.link(temporary, path)
    temporary.unlink()
    return path.read_text().strip()
