"""A model's files on this worker: a local folder as it is, a remote model's through the node cache.

A slot loads from the folder `hold` hands it. For a model at `s3://` or `hf://`, that is the node
cache's checked copy, fetched first unless this host's cache has it (every worker of the host shares
the cache, so a model's files are fetched once per host); the slot holds the copy while the model is
held here, so that the cache never evicts it under the engine. What the controller weighs (whether
the files are here, how long fetching them would take) and what the heartbeat advertises (the models
cached on this node, a fetch's progress) are read here too.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from switchboard.config import ModelConfig, WorkerConfig
from switchboard.sources.locations import is_remote
from switchboard.sources.node_cache import CachedFiles, CacheFull, DownloadProgress, NodeCache
from switchboard.sources.source import ModelSource, SourceError
from switchboard.sources.stores import source_of
from switchboard.wire import DownloadStatus
from workers.runtime import worker_metrics as metrics

logger = logging.getLogger(__name__)

GIB = 1024**3
# How long a load waits for room in the node cache that models in use hold: another worker of this
# host may be unloading one of them right now (its controller decides on its own), and a load that
# fails at once turns that moment into a 503 for every caller waiting.
HELD_ROOM_WAIT_S = 30.0
HELD_ROOM_POLL_S = 0.5


class FetchFailed(RuntimeError):
    """A remote model's files could not be fetched into the node cache; the message says why, in
    words for the operator (its location and the store's answer, nothing of the worker's own)."""


@dataclass
class HeldFiles:
    """A model's files as one load uses them: `model.path` is the folder its engine loads from."""

    model: ModelConfig
    # What this load fetched from the store (0: a local folder, or a node-cache hit).
    fetched_bytes: int = 0
    # Seconds this load spent on the files (fetching, or waiting for another process's fetch).
    fetch_s: float = 0.0
    # The bytes of the model's files (0: a local folder, not measured).
    total_bytes: int = 0
    _held: CachedFiles | None = field(default=None, repr=False)

    def release(self) -> None:
        """The model left this worker: the node cache may evict its files again (idempotent)."""
        if self._held is not None:
            self._held.release()


class ModelFiles:
    """Where this worker's models' files are, and the node cache that fetches the remote ones."""

    def __init__(self, settings: WorkerConfig, models: list[ModelConfig]) -> None:
        self._settings = settings
        self._sources: dict[str, ModelSource] = {}
        # Made with the first remote model (an adapter registered at run time may be the first).
        self._cache: NodeCache | None = None
        for model in models:
            self.add(model)
        # The fetches this process runs or waits for now, with their last progress.
        self._fetching: dict[str, DownloadProgress | None] = {}

    def add(self, model: ModelConfig) -> None:
        """Know where `model`'s files are (a model configured, or an adapter registered at run time)."""
        if not is_remote(model.path):
            return
        settings = self._settings
        source = source_of(model, concurrency=settings.download_concurrency)
        assert source is not None
        self._sources[model.name] = source
        if self._cache is None:
            budget = int(settings.model_cache_gib * GIB) if settings.model_cache_gib else None
            self._cache = NodeCache(
                Path(settings.model_cache_dir).expanduser(),
                budget_bytes=budget,
                recheck_s=settings.source_recheck_s,
                concurrency=settings.download_concurrency,
            )

    def remove(self, name: str) -> None:
        """Forget `name` (an adapter whose registration was removed); its cached files stay for the
        cache's budget to evict."""
        self._sources.pop(name, None)

    @property
    def node_id(self) -> str:
        """The node cache's id, the same for every worker of this host ("" without remote models)."""
        return self._cache.node_id if self._cache is not None else ""

    def remote(self, name: str) -> bool:
        """Whether the model's files are fetched from a store rather than read from a local folder."""
        return name in self._sources

    def here(self, name: str) -> bool:
        """Whether a load of the model here finds its files on this node (no network)."""
        source = self._sources.get(name)
        if source is None or self._cache is None:
            return True
        return self._cache.has(source.cache_key)

    def cached(self) -> tuple[str, ...]:
        """The remote models whose files this node's cache holds complete."""
        if self._cache is None:
            return ()
        keys = self._cache.cached_keys()
        return tuple(sorted(name for name, source in self._sources.items() if source.cache_key in keys))

    def fetching(self, name: str) -> bool:
        """Whether the model's files are being fetched into this node's cache (by any worker here)."""
        return name in self._fetching or self._progress_on_node(name) is not None

    def download_s(self, name: str, total_bytes: int | None) -> float | None:
        """Seconds a load here would spend fetching the model's files: 0 when they are here, None
        when its size or this node's rate from its store was never measured."""
        source = self._sources.get(name)
        if source is None or self._cache is None or self._cache.has(source.cache_key):
            return 0.0
        rate = self._cache.rate_bps(source.rate_key)
        if not total_bytes or not rate:
            return None
        return total_bytes / rate

    def progress(self, name: str) -> DownloadStatus | None:
        """How far the fetch of the model's files has come, while one runs on this node."""
        progress = self._fetching.get(name) or self._progress_on_node(name)
        if progress is None:
            return None
        return DownloadStatus(
            bytes_done=progress.bytes_done,
            bytes_total=progress.bytes_total,
            rate_bps=round(progress.rate_bps, 1),
            eta_s=None if progress.eta_s is None else round(progress.eta_s, 1),
        )

    async def hold(self, model: ModelConfig) -> HeldFiles:
        """The model's files, held for one load: a local folder at once; a remote model's fetched
        into the node cache first unless it holds them. FetchFailed when that fails."""
        source = self._sources.get(model.name)
        if source is None or self._cache is None:
            return HeldFiles(model=model)
        self._fetching[model.name] = None
        started = time.monotonic()
        try:
            cached = await self._fetch_when_room(model.name, source)
        except SourceError as exc:
            metrics.MODEL_FETCHES.labels(model.name, "failed").inc()
            raise FetchFailed(
                f"fetching the files of {model.name} from {source.location} failed: {exc}"
            ) from exc
        finally:
            self._fetching.pop(model.name, None)
        seconds = time.monotonic() - started
        self._count(model.name, cached, seconds)
        return HeldFiles(
            model=msgspec.structs.replace(model, path=str(cached.folder)),
            fetched_bytes=cached.fetched_bytes,
            fetch_s=seconds,
            total_bytes=cached.manifest.total_bytes,
            _held=cached,
        )

    async def _fetch_when_room(self, name: str, source: ModelSource) -> CachedFiles:
        """The node cache's fetch, tried again while only entries held by models in use keep it
        from fitting (for at most HELD_ROOM_WAIT_S)."""
        assert self._cache is not None
        deadline = time.monotonic() + HELD_ROOM_WAIT_S
        waited = False
        while True:
            try:
                return await asyncio.to_thread(self._cache.fetch, source, self._progress_of(name))
            except CacheFull as full:
                if not full.held or time.monotonic() >= deadline:
                    raise
                if not waited:
                    logger.info(
                        f"waiting up to {HELD_ROOM_WAIT_S:.0f} s for room in the node cache for {name}: "
                        "models in use hold it",
                        extra={"model": name},
                    )
                    waited = True
                await asyncio.sleep(HELD_ROOM_POLL_S)

    async def prefetch(self, model: ModelConfig) -> HeldFiles:
        """Fetch the model's files into the node cache without holding them (a later load finds them)."""
        files = await self.hold(model)
        files.release()
        return files

    def _progress_of(self, name: str) -> Callable[[DownloadProgress], None]:
        def on_progress(progress: DownloadProgress) -> None:
            # Called from the fetching thread: one dict assignment, read by the event loop's beats.
            if name in self._fetching:
                self._fetching[name] = progress

        return on_progress

    def _progress_on_node(self, name: str) -> DownloadProgress | None:
        source = self._sources.get(name)
        if source is None or self._cache is None:
            return None
        return self._cache.progress(source.cache_key)

    def _count(self, name: str, cached: CachedFiles, seconds: float) -> None:
        outcome = "fetched" if cached.fetched_bytes else "cached"
        metrics.MODEL_FETCHES.labels(name, outcome).inc()
        if cached.fetched_bytes:
            metrics.MODEL_FETCH_BYTES.labels(name).inc(cached.fetched_bytes)
            metrics.MODEL_FETCH_TIME.labels(name).observe(seconds)
            rate = cached.fetched_bytes / seconds if seconds > 0 else 0.0
            logger.info(
                f"fetched the files of {name} ({cached.fetched_bytes / 1e6:.1f} MB) in {seconds:.1f} s"
                f" ({rate / 1e6:.1f} MB/s) into the node cache",
                extra={"model": name, "bytes": cached.fetched_bytes, "seconds": round(seconds, 2)},
            )
