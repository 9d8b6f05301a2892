"""What an engine's own processes start with, and how they are found, measured and reaped.

Shared by the two ways an EngineCore process starts: spawned by vLLM (`vllm.engine`) and forked from the
worker's fork server (`fork_server`). Both set the environment a new process inherits here, under
one lock, and neither imports the other.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from multiprocessing.process import BaseProcess
from pathlib import Path

import psutil

DEFAULT_CACHE_ROOT = "~/.cache/switchboard/vllm"

# A new engine process inherits the environment of the moment it is spawned, and its thread
# pinning travels in OMP_* variables: one CPU engine start at a time sets them.
_spawn_lock = threading.Lock()


def set_process_defaults() -> None:
    """vLLM settings this process needs before vLLM reads them; the environment's own values win."""
    os.environ.setdefault("VLLM_CACHE_ROOT", str(Path(DEFAULT_CACHE_ROOT).expanduser()))
    # CPU builds: run the executor inside the EngineCore process instead of in a Worker process of
    # its own (one interpreter importing vLLM per engine instead of two). GPU builds' AsyncLLM
    # ignores it.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


@contextlib.contextmanager
def engine_process_environment(overrides: dict[str, str], *, locked: bool) -> Iterator[None]:
    """`overrides` set in the environment while a process is spawned, then restored.

    `locked`: under the process-wide spawn lock, so that no other start sees them (CPU builds).
    """
    with _spawn_lock if locked else contextlib.nullcontext():
        saved = {name: os.environ.get(name) for name in overrides}
        os.environ.update(overrides)
        try:
            yield
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value


def stop_process(process: BaseProcess, timeout_s: float) -> None:
    """End a process this one started: SIGTERM, then SIGKILL after `timeout_s`."""
    if process.exitcode is None:
        process.terminate()
        process.join(timeout_s)
    if process.exitcode is None:
        process.kill()
        process.join()


def process_tree(pids: list[int]) -> list[psutil.Process]:
    """The processes `pids` and all their descendants (those still there)."""
    processes: list[psutil.Process] = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(pid)
            processes += [root, *root.children(recursive=True)]
    return processes


def reap(processes: list[psutil.Process], timeout_s: float) -> list[int]:
    """Wait for `processes` to exit, kill what is left; the pids that had to be killed."""
    _, alive = psutil.wait_procs(processes, timeout=timeout_s)
    for process in alive:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(alive, timeout=timeout_s)
    return [process.pid for process in alive]


def resident_bytes(pids: list[int]) -> int:
    """The resident memory of `pids` and their descendants."""
    return sum(_rss(process) for process in process_tree(pids))


def _rss(process: psutil.Process) -> int:
    try:
        return int(process.memory_info().rss)
    except psutil.Error:
        return 0
