"""The node cache shared by several processes of one host: one fetch for all of them, progress seen
from another process, and a fetcher killed half way resumed by the next (switchboard/sources/node_cache.py).

The children are real processes started by multiprocessing's 'spawn', as worker processes are."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

from switchboard.sources.node_cache import DownloadProgress, NodeCache
from tests.support.folder_source import FolderSource, write_model

SPAWN = multiprocessing.get_context("spawn")
KIB = 1024


def _cache(root: Path) -> NodeCache:
    return NodeCache(root, budget_bytes=None, recheck_s=600.0, concurrency=4)


def fetch_in_child(root: str, source: FolderSource, barrier: Barrier | None, results: Any) -> None:
    """A worker process's fetch: the bytes it fetched, its folder and how many progress reports it saw."""
    cache = _cache(Path(root))
    seen: list[DownloadProgress] = []
    if barrier is not None:
        barrier.wait(timeout=60)
    with cache.fetch(source, seen.append) as held:
        results.put((held.fetched_bytes, str(held.folder), len(seen), cache.node_id))


def _start(*args: Any) -> BaseProcess:
    process = SPAWN.Process(target=fetch_in_child, args=args, daemon=True)
    process.start()
    return process


def _wait_for(probe: Any, child: BaseProcess, what: str, timeout_s: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while (value := probe()) is None or value is False:
        assert child.is_alive(), f"the child exited ({child.exitcode}) before {what}"
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        time.sleep(0.02)
    return value


def test_two_processes_fetch_a_model_once(tmp_path: Path) -> None:
    source = FolderSource(write_model(tmp_path / "model"), cache_key="model", delay_s=0.05)
    root = tmp_path / "cache"
    barrier, results = SPAWN.Barrier(2), SPAWN.Queue()
    children = [_start(str(root), source, barrier, results) for _ in range(2)]
    outcomes = sorted(results.get(timeout=60) for _ in children)
    for child in children:
        child.join(timeout=10)
    (waited, waiter_folder, waiter_reports, node_a), (fetched, folder, _, node_b) = outcomes
    assert waited == 0 and fetched == source.total_bytes()
    assert waiter_folder == folder and node_a == node_b
    assert source.bytes_read() == source.total_bytes() and source.list_calls() == 1
    assert waiter_reports >= 1, "the waiting process saw the fetcher's progress"


def test_progress_is_readable_from_another_process_while_a_slow_fetch_runs(tmp_path: Path) -> None:
    source = FolderSource(
        write_model(tmp_path / "model"), cache_key="model", delay_s=0.05, chunk_bytes=32 * KIB
    )
    root = tmp_path / "cache"
    results = SPAWN.Queue()
    child = _start(str(root), source, None, results)
    cache = _cache(root)
    progress = _wait_for(lambda: cache.progress("model"), child, "a fetch's progress")
    assert progress.location == source.location and progress.bytes_total == source.total_bytes()
    assert not cache.has("model")
    fetched, *_ = results.get(timeout=60)
    child.join(timeout=10)
    assert fetched == source.total_bytes()
    assert cache.progress("model") is None and cache.has("model")
    assert cache.rate_bps(source.rate_key) is not None, "the child's rate is the node's"


def test_a_fetcher_killed_half_way_leaves_nothing_used_and_the_next_fetch_resumes(tmp_path: Path) -> None:
    slow = FolderSource(
        write_model(tmp_path / "model"), cache_key="model", delay_s=0.05, chunk_bytes=32 * KIB
    )
    root = tmp_path / "cache"
    results = SPAWN.Queue()  # kept: the child unpickles it after its start
    child = _start(str(root), slow, None, results)
    cache = _cache(root)
    _wait_for(
        lambda: (progress := cache.progress("model")) is not None and progress.bytes_done >= 512 * KIB,
        child,
        "half the model fetched",
    )
    assert child.pid is not None
    os.kill(child.pid, signal.SIGKILL)
    child.join(timeout=10)
    assert (root / "models" / "model" / "progress.json").exists(), "the killed fetcher left its progress"
    assert cache.progress("model") is None, "a dead fetcher's progress is not reported"
    assert not cache.has("model")
    read_before = slow.bytes_read()
    assert 0 < read_before < slow.total_bytes()
    fast = FolderSource(slow.folder, cache_key="model", record=slow.record)
    with cache.fetch(fast) as held:
        assert 0 < held.fetched_bytes <= fast.total_bytes() - read_before + 4 * 32 * KIB
        for name in ("config.json", "model-00000.safetensors", "model-00001.safetensors"):
            assert (held.folder / name).read_bytes() == (fast.folder / name).read_bytes()
