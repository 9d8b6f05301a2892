"""Fetching one manifest's files into a partial folder: several files at a time, chunks written as
they arrive, a killed fetch resumed from the bytes on disk, every file checked before it counts,
progress reported as it goes, and the node's measured download rate per store.

A file lands as `<name>.part` and becomes `<name>` only once its bytes pass `files.Checker`; the
partial folder remembers the listing it fills (`listing.json`), so that a later fetch resumes only
files whose listed version is the same and re-hashes their bytes on disk before it reads on.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from pathlib import Path

import msgspec

from switchboard.sources.cache_entries import MODEL_DIR, locked
from switchboard.sources.files import Checker, Manifest, RemoteFile, safe_name
from switchboard.sources.source import ModelSource, SourceError

LISTING = "listing.json"
PART_SUFFIX = ".part"
# How often progress is reported (to the callback and to the progress file other processes read).
PROGRESS_EVERY_S = 0.25
# A fetch smaller than this says too little about the store's rate to be recorded.
RATE_MIN_BYTES = 1024**2
RATE_SAMPLES = 10
_REHASH_BYTES = 1024**2

_manifest_decoder = msgspec.json.Decoder(Manifest)


class DownloadProgress(msgspec.Struct, frozen=True, kw_only=True):
    """How far one fetch of a model's files has come."""

    location: str
    # Bytes of the model on disk (checked or partial, resumed ones included) and in all.
    bytes_done: int
    bytes_total: int
    # Bytes per second read from the store by this fetch so far.
    rate_bps: float
    # When the fetch started (unix seconds).
    started: float

    @property
    def eta_s(self) -> float | None:
        """Seconds until the fetch is done at its rate so far; None before any byte arrived."""
        if self.rate_bps <= 0:
            return None
        return max(self.bytes_total - self.bytes_done, 0) / self.rate_bps


class ProgressMeter:
    """Counts a fetch's bytes from its threads and reports them at most every PROGRESS_EVERY_S."""

    def __init__(
        self, manifest: Manifest, bytes_present: int, report: Callable[[DownloadProgress], None]
    ) -> None:
        self._location = manifest.location
        self._total = manifest.total_bytes
        self._done = bytes_present
        self.fetched = 0
        self._report = report
        self._lock = threading.Lock()
        self._started_wall = time.time()
        self._started = time.monotonic()
        self._reported_at = 0.0

    def add(self, count: int) -> None:
        """Count bytes just written; report when the last report is old enough."""
        with self._lock:
            self._done += count
            self.fetched += count
            if time.monotonic() - self._reported_at < PROGRESS_EVERY_S:
                return
            self.report()

    def report(self) -> None:
        """Report now (the caller holds the lock, or no thread is fetching)."""
        self._reported_at = time.monotonic()
        elapsed = self._reported_at - self._started
        self._report(
            DownloadProgress(
                location=self._location,
                bytes_done=self._done,
                bytes_total=self._total,
                rate_bps=self.fetched / elapsed if elapsed > 0 else 0.0,
                started=self._started_wall,
            )
        )

    def seconds(self) -> float:
        """Seconds since the fetch started."""
        return time.monotonic() - self._started


def prepare_partial(partial: Path, manifest: Manifest, earlier: list[tuple[Manifest, Path]]) -> int:
    """Make `partial` the folder that fills `manifest`, keeping what an earlier fetch left of files
    whose listed version is the same, and linking in the files that `earlier` complete entries
    (their manifest and model folder) hold at the same version; the bytes kept."""
    previous = _previous_listing(partial)
    kept = {
        file.name: file
        for file in manifest.files
        if previous.get(file.name) == (file.version, file.size, file.digest)
    }
    model_dir = partial / MODEL_DIR
    present = 0
    for directory, _, names in os.walk(model_dir):
        for name in names:
            path = Path(directory, name)
            relative = path.relative_to(model_dir).as_posix().removesuffix(PART_SUFFIX)
            if relative in kept and path.stat().st_size <= kept[relative].size:
                present += path.stat().st_size
            else:
                path.unlink()
    model_dir.mkdir(parents=True, exist_ok=True)
    (partial / LISTING).write_bytes(msgspec.json.encode(manifest))
    return present + _link_unchanged(model_dir, manifest, earlier)


def _link_unchanged(model_dir: Path, manifest: Manifest, earlier: list[tuple[Manifest, Path]]) -> int:
    """Hard-link the checked files of earlier revisions that the new listing has unchanged (a moving
    revision often changes one small file): the bytes linked."""
    linked = 0
    for file in manifest.files:
        target = model_dir / safe_name(file.name)
        if target.exists() or target.with_name(target.name + PART_SUFFIX).exists():
            continue
        for listing, folder in earlier:
            if any(_same_version(file, old) for old in listing.files):
                with contextlib.suppress(FileNotFoundError):
                    target.parent.mkdir(parents=True, exist_ok=True)
                    os.link(folder / file.name, target)
                    linked += file.size
                    break
    return linked


def _same_version(file: RemoteFile, other: RemoteFile) -> bool:
    return (file.name, file.version, file.size, file.digest) == (
        other.name,
        other.version,
        other.size,
        other.digest,
    )


def fetch_files(
    source: ModelSource, manifest: Manifest, partial: Path, meter: ProgressMeter, *, concurrency: int
) -> None:
    """Fetch every file of `manifest` into `partial` (prepared), `concurrency` at a time; the first
    failure stops the others and is raised."""
    stop = threading.Event()
    # The largest first, so that the last file to finish is a small one.
    files = sorted(manifest.files, key=lambda file: file.size, reverse=True)
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="model-fetch") as pool:
        futures: list[Future[None]] = [
            pool.submit(_fetch_file, source, file, partial / MODEL_DIR, meter, stop) for file in files
        ]
        done, _ = wait(futures, return_when=FIRST_EXCEPTION)
        failed = next((future for future in done if future.exception() is not None), None)
        if failed is not None:
            stop.set()
            wait(futures)
            raise _first_failure(futures, failed)


def _first_failure(futures: list[Future[None]], failed: Future[None]) -> BaseException:
    # Every file stopped by the first failure raises _Stopped: the failure itself is the one to tell.
    for future in [failed, *futures]:
        exception = future.exception()
        if exception is not None and not isinstance(exception, _Stopped):
            return exception
    exception = failed.exception()
    assert exception is not None
    return exception


class _Stopped(Exception):
    """Another file of the same fetch failed: this one stops too."""


def _fetch_file(
    source: ModelSource, file: RemoteFile, model_dir: Path, meter: ProgressMeter, stop: threading.Event
) -> None:
    final = model_dir / safe_name(file.name)
    if final.exists():
        return  # checked by an earlier fetch of this same version
    part = final.with_name(final.name + PART_SUFFIX)
    checker = Checker(file)
    try:
        part.parent.mkdir(parents=True, exist_ok=True)
        offset = _rehash(part, checker)
        if offset < file.size:
            with part.open("ab") as out:
                for chunk in source.read(file, offset):
                    if stop.is_set():
                        raise _Stopped
                    out.write(chunk)
                    checker.update(chunk)
                    meter.add(len(chunk))
    except OSError as exc:
        raise SourceError(
            f"{source.location}: writing {file.name} into the node cache at {model_dir} failed: {exc};"
            " check that disk"
        ) from exc
    why = checker.mismatch()
    if why is not None:
        part.unlink(missing_ok=True)
        raise SourceError(
            f"{source.location}: {why}: the store's bytes differ from its listing (a corrupt object, or"
            " one replaced without a new version); the file was discarded, so a retry reads it anew."
            " If it fails again, upload the file again"
        )
    os.replace(part, final)


def _rehash(part: Path, checker: Checker) -> int:
    """Feed the bytes already on disk to `checker`: the offset to resume from (0 when none)."""
    offset = 0
    with contextlib.suppress(FileNotFoundError), part.open("rb") as existing:
        while block := existing.read(_REHASH_BYTES):
            checker.update(block)
            offset += len(block)
    return offset


def _previous_listing(partial: Path) -> dict[str, tuple[str, int, str]]:
    try:
        previous = _manifest_decoder.decode((partial / LISTING).read_bytes())
    except (FileNotFoundError, msgspec.DecodeError):
        # Nothing there, or a folder of unknown making: start it afresh.
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True, exist_ok=True)
        return {}
    return {file.name: (file.version, file.size, file.digest) for file in previous.files}


class _RateSamples(msgspec.Struct, kw_only=True):
    rate_key: str
    # (bytes, seconds) of the node's recent fetches from this store, the oldest first.
    samples: list[tuple[int, float]] = []


_rates_decoder = msgspec.json.Decoder(_RateSamples)


def record_rate(rates_dir: Path, rate_key: str, fetched_bytes: int, seconds: float) -> None:
    """Remember one fetch's rate from this store (kept: the last RATE_SAMPLES)."""
    if fetched_bytes < RATE_MIN_BYTES or seconds <= 0:
        return
    path = _rates_file(rates_dir, rate_key)
    with locked(path.with_suffix(".lock")):
        samples = _read_rates(path, rate_key)
        samples.samples = [*samples.samples, (fetched_bytes, seconds)][-RATE_SAMPLES:]
        temporary = path.with_suffix(".tmp")
        temporary.write_bytes(msgspec.json.encode(samples))
        os.replace(temporary, path)


def median_rate(rates_dir: Path, rate_key: str) -> float | None:
    """The median of this node's recent rates from the store, in bytes per second; None if unmeasured."""
    samples = _read_rates(_rates_file(rates_dir, rate_key), rate_key).samples
    if not samples:
        return None
    return statistics.median(count / seconds for count, seconds in samples)


def _rates_file(rates_dir: Path, rate_key: str) -> Path:
    return rates_dir / f"{hashlib.sha256(rate_key.encode()).hexdigest()[:16]}.json"


def _read_rates(path: Path, rate_key: str) -> _RateSamples:
    try:
        return _rates_decoder.decode(path.read_bytes())
    except (FileNotFoundError, msgspec.DecodeError):
        return _RateSamples(rate_key=rate_key)
