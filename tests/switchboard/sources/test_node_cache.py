"""The node cache within one process: hits without the store, re-listing, new revisions, checks,
resumes, threads sharing one fetch, the budget and the measured rate (switchboard/sources/node_cache.py)."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest

from switchboard.sources.node_cache import CacheFull, DownloadProgress, NodeCache
from switchboard.sources.source import SourceError
from tests.support.folder_source import FolderSource, write_model

MIB = 1024**2


def _cache(root: Path, *, budget: int | None = None, recheck_s: float = 600.0) -> NodeCache:
    return NodeCache(root, budget_bytes=budget, recheck_s=recheck_s, concurrency=4)


def _model(tmp_path: Path, name: str = "model", **kwargs: object) -> FolderSource:
    return FolderSource(write_model(tmp_path / name, seed=hash(name) % 1000), cache_key=name, **kwargs)  # type: ignore[arg-type]


def _same_files(folder: Path, expected: Path) -> bool:
    names = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    wanted = sorted(p.relative_to(expected).as_posix() for p in expected.rglob("*") if p.is_file())
    return names == wanted and all((folder / n).read_bytes() == (expected / n).read_bytes() for n in names)


def test_a_fetch_lands_the_checked_files_and_a_hit_asks_the_store_nothing(tmp_path: Path) -> None:
    source = _model(tmp_path)
    cache = _cache(tmp_path / "cache")
    with cache.fetch(source) as first:
        assert _same_files(first.folder, source.folder)
        assert first.fetched_bytes == source.total_bytes()
    calls = source.calls()
    with cache.fetch(source) as again:
        assert again.fetched_bytes == 0
        assert again.folder == first.folder
    assert source.calls() == calls
    assert cache.has("model") and cache.cached_keys() == {"model"}
    assert cache.used_bytes() == source.total_bytes()


def test_a_stale_entry_is_listed_again_and_kept_when_its_revision_is_the_same(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _model(tmp_path)
    cache = _cache(tmp_path / "cache", recheck_s=0.05)
    cache.fetch(source).release()
    read = source.bytes_read()
    time.sleep(0.1)
    with caplog.at_level(logging.INFO), cache.fetch(source) as again:
        assert again.fetched_bytes == 0
    assert source.list_calls() == 2 and source.bytes_read() == read
    assert "listed s3://test/model again" in caplog.text
    # The listing was renewed: within recheck_s of it, no listing.
    with cache.fetch(source):
        assert source.list_calls() == 2


def test_a_pinned_revision_is_never_listed_again(tmp_path: Path) -> None:
    source = _model(tmp_path, pinned=True)
    cache = _cache(tmp_path / "cache", recheck_s=0.0)
    cache.fetch(source).release()
    cache.fetch(source).release()
    assert source.list_calls() == 1


def test_a_new_revision_is_fetched_as_a_new_entry_while_the_old_one_serves_its_holders(
    tmp_path: Path,
) -> None:
    source = _model(tmp_path)
    cache = _cache(tmp_path / "cache", recheck_s=0.0)
    old = cache.fetch(source)
    source.change_file("config.json", b'{"model_type": "test", "seed": "new"}')
    read = source.bytes_read()
    with cache.fetch(source) as new:
        assert new.folder != old.folder
        assert new.manifest.revision != old.manifest.revision
        assert (new.folder / "config.json").read_bytes() == b'{"model_type": "test", "seed": "new"}'
        # Only the changed file was read: the unchanged shards were linked from the old entry.
        assert source.bytes_read() - read == len(b'{"model_type": "test", "seed": "new"}')
        assert new.fetched_bytes == source.bytes_read() - read
        assert (old.folder / "config.json").read_text().startswith('{"model_type": "test", "seed": ')
        old_folder = old.folder
        old.release()
        assert not old_folder.exists(), "an older revision nobody holds leaves at once"
    assert cache.used_bytes() == source.total_bytes()


def test_a_failed_listing_falls_back_to_the_cached_entry(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = _model(tmp_path)
    cache = _cache(tmp_path / "cache", recheck_s=0.0)
    cache.fetch(source).release()
    source.fail_listing = True
    with caplog.at_level(logging.WARNING), cache.fetch(source) as held:
        assert held.fetched_bytes == 0 and _same_files(held.folder, source.folder)
    assert "listing s3://test/model failed" in caplog.text
    empty = _cache(tmp_path / "other")
    with pytest.raises(SourceError, match="did not answer"):
        empty.fetch(source)


def test_threads_of_one_process_share_one_fetch(tmp_path: Path) -> None:
    source = _model(tmp_path, delay_s=0.01)
    cache = _cache(tmp_path / "cache")
    results = []
    threads = [threading.Thread(target=lambda: results.append(cache.fetch(source))) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 4 and len({held.folder for held in results}) == 1
    assert source.bytes_read() == source.total_bytes() and source.list_calls() == 1
    assert sum(held.fetched_bytes for held in results) == source.total_bytes()
    for held in results:
        held.release()


def test_a_dropped_fetch_leaves_nothing_usable_and_the_next_resumes(tmp_path: Path) -> None:
    source = _model(tmp_path, fail_after_bytes=MIB, chunk_bytes=32 * 1024)
    cache = _cache(tmp_path / "cache")
    with pytest.raises(SourceError, match="connection dropped"):
        cache.fetch(source)
    assert not cache.has("model") and cache.progress("model") is None
    assert cache.used_bytes() > 0, "the partial folder is counted"
    read = source.bytes_read()
    source.fail_after_bytes = None
    with cache.fetch(source) as held:
        assert _same_files(held.folder, source.folder)
        assert held.fetched_bytes == source.total_bytes() - read
    assert source.bytes_read() == source.total_bytes()


def test_corrupted_bytes_are_refused_and_nothing_enters_the_cache(tmp_path: Path) -> None:
    source = _model(tmp_path)
    source.corrupt("model-00001.safetensors")
    cache = _cache(tmp_path / "cache")
    with pytest.raises(SourceError) as refused:
        cache.fetch(source)
    message = str(refused.value)
    assert "model-00001.safetensors: md5" in message and "differ from its listing" in message
    assert not cache.has("model")
    assert not list((tmp_path / "cache" / "models" / "model").glob("rev-*"))
    assert not list((tmp_path / "cache").rglob("model-00001.safetensors*")), "the bad file was discarded"


def test_a_file_changed_during_the_fetch_restarts_it_from_a_new_listing(tmp_path: Path) -> None:
    source = _model(tmp_path)
    cache = _cache(tmp_path / "cache")
    listed = source.list_files()
    source.change_file("config.json", b"{}")
    original = source.list_files

    def stale_first() -> object:
        source.list_files = original  # type: ignore[method-assign]
        return listed

    source.list_files = stale_first  # type: ignore[method-assign,assignment]
    with cache.fetch(source) as held:
        assert (held.folder / "config.json").read_bytes() == b"{}"
        assert held.manifest.revision != listed.revision


def test_the_budget_evicts_the_least_recently_used_unheld_entry(tmp_path: Path) -> None:
    sources = [_model(tmp_path, name) for name in ("a", "b", "c")]
    size = sources[0].total_bytes()
    cache = _cache(tmp_path / "cache", budget=2 * size + size // 2)
    cache.fetch(sources[0]).release()
    held_b = cache.fetch(sources[1])
    time.sleep(0.01)
    cache.fetch(sources[0]).release()  # a is now more recently used than b, but b is held
    with cache.fetch(sources[2]):
        assert cache.cached_keys() == {"b", "c"}
    assert cache.used_bytes() <= cache.budget_bytes  # type: ignore[operator]
    held_b.release()


def test_of_the_unheld_entries_the_least_recently_used_leaves_first(tmp_path: Path) -> None:
    sources = [_model(tmp_path, name) for name in ("a", "b", "c")]
    size = sources[0].total_bytes()
    cache = _cache(tmp_path / "cache", budget=2 * size + size // 2)
    cache.fetch(sources[0]).release()
    time.sleep(0.01)
    cache.fetch(sources[1]).release()
    time.sleep(0.01)
    cache.fetch(sources[0]).release()  # a hit: a is used again, after b
    cache.fetch(sources[2]).release()
    assert cache.cached_keys() == {"a", "c"}


def test_cache_full_names_the_budget_what_is_needed_and_what_is_held(tmp_path: Path) -> None:
    sources = [_model(tmp_path, name) for name in ("a", "b")]
    size = sources[0].total_bytes()
    cache = _cache(tmp_path / "cache", budget=size + size // 2)
    with cache.fetch(sources[0]), pytest.raises(CacheFull) as full:
        cache.fetch(sources[1])
    message = str(full.value)
    assert f"budget of {cache.budget_bytes / 1e9:.2f} GB" in message  # type: ignore[operator]
    assert f"needs {size / 1e9:.2f} GB more" in message
    assert "held by models in use on this host: a (" in message
    assert "model_cache_gib" in message
    assert full.value.held, "room may come when a leaves"
    assert not cache.has("b") and cache.has("a")


def test_cache_full_with_nothing_held_says_the_budget_is_too_small(tmp_path: Path) -> None:
    sources = [_model(tmp_path, name) for name in ("a", "b")]
    size = sources[0].total_bytes()
    cache = _cache(tmp_path / "cache", budget=size // 2)
    with pytest.raises(CacheFull) as full:
        cache.fetch(sources[0])
    assert not full.value.held
    assert "held by models in use on this host: nothing" in str(full.value)


def test_progress_is_reported_and_the_rate_recorded(tmp_path: Path) -> None:
    source = _model(tmp_path, delay_s=0.02, chunk_bytes=32 * 1024)
    cache = _cache(tmp_path / "cache")
    seen: list[DownloadProgress] = []
    assert cache.rate_bps(source.rate_key) is None
    with cache.fetch(source, seen.append) as held:
        assert held.fetch_s > 0
    assert len(seen) >= 2
    assert seen[-1].bytes_total == source.total_bytes() and seen[-1].location == source.location
    assert [p.bytes_done for p in seen] == sorted(p.bytes_done for p in seen)
    assert seen[-1].rate_bps > 0 and seen[-1].eta_s is not None
    assert cache.progress("model") is None, "the progress file leaves with the fetch"
    rate = cache.rate_bps(source.rate_key)
    assert rate is not None and 0 < rate < source.total_bytes() / 0.1


def test_the_node_id_is_made_once_for_the_folder(tmp_path: Path) -> None:
    first = _cache(tmp_path / "cache")
    assert first.node_id and first.node_id == _cache(tmp_path / "cache").node_id
    assert _cache(tmp_path / "other").node_id != first.node_id
