"""The worker's fork server: engine processes forked from a helper that imported the engines once,
instead of spawned (opt-in, `worker.engine_process = "fork"`).

A spawned engine process is a new interpreter that imports vLLM (or torch and transformers) again,
which is most of a cold load. Here the helper is the standard library's fork server: started once
per worker (`start_fork_server`), it imports the engines' process side at its start
(`fork_server_preload`), then, single-threaded, forks one child per engine process on request: a
vLLM EngineCore (`workers.engines.vllm.engine.forked_core`) or a pooling model's process
(`workers.engines.torch_pooling.engine.process`). Each child starts with `become_engine_process`.

What this relies on:
- The fork server never starts a thread and never initialises CUDA before it forks: every child
  checks both (its parent's /proc task list, torch's CUDA flag) and refuses to start otherwise.
- OpenMP was loaded in the fork server without thread binding, so OMP_* variables come too late
  for the child: it pins itself (sched_setaffinity, torch.set_num_threads) before its first
  parallel region.
- Settings an engine puts in the worker's environment while it builds its config reach the child
  because the worker's environment is handed over and installed before the engine starts.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import threading
import time

from workers.engines.parent_death import die_with_parent
from workers.engines.process_env import engine_process_environment
from workers.runtime.cpu_placement import omp_environment, parse_cpu_list

PRELOAD_MODULE = "workers.engines.fork_server_preload"
_fork_server_lock = threading.Lock()
# The fork server last found safe to fork from (ensure_running starts a new one if it died).
_checked_server_pid: int | None = None


def start_fork_server() -> float:
    """Start the worker's fork server and wait until it can fork engines; the seconds it took.

    The server imports vLLM at its start (seconds, in its own process): call this at worker boot,
    off the event loop. Later calls return at once. A first child, forked at once, checks that the
    server is safe to fork from; RuntimeError if it is not.
    """
    global _checked_server_pid
    with _fork_server_lock:
        started = time.monotonic()
        multiprocessing.forkserver.set_forkserver_preload([PRELOAD_MODULE])
        # OpenMP reads its defaults once, when the server imports torch: one thread, unbound. A child
        # raises the count for itself; any thread it does not set keeps one, never more threads
        # than the cores it is pinned to.
        with engine_process_environment({"OMP_NUM_THREADS": "1"}, locked=True):
            multiprocessing.forkserver.ensure_running()
        if fork_server_pid() != _checked_server_pid:
            probe = multiprocessing.get_context("forkserver").Process(
                target=_check_fork_parent, name="ForkProbe"
            )
            probe.start()  # served only once the server has imported its preload
            probe.join()
            if probe.exitcode != 0:
                raise RuntimeError("the fork server cannot fork engines safely; its log says why")
            _checked_server_pid = fork_server_pid()
        return time.monotonic() - started


def fork_server_pid() -> int | None:
    """The fork server's pid, when it runs (for tests and measurements)."""
    server = multiprocessing.forkserver._forkserver
    return getattr(server, "_forkserver_pid", None)


# --- in a forked child ----------------------------------------------------------------------------


def become_engine_process(
    environ: dict[str, str], cpu_threads: str | None, *, forked: bool, title: str | None = None
) -> None:
    """What an engine's process does first (a vLLM EngineCore, `vllm.forked_core`; a pooling model's
    process, `torch_pooling.process`): check what it was forked from, end with its parent, take the worker's
    environment, pin its compute threads. `title`: its name in `ps` (vLLM names its own)."""
    if forked:
        _check_fork_parent()
    _die_with_parent()
    with contextlib.suppress(ImportError):
        # setproctitle (which vLLM names its processes with) finds the memory it may write the
        # title into through the environment as the process started with it: look before changing.
        import setproctitle

        setproctitle.getproctitle()
        if title is not None:
            setproctitle.setproctitle(title)
    for name in set(os.environ) - set(environ):
        del os.environ[name]
    os.environ.update(environ)
    _pin_compute_threads(cpu_threads)


def _check_fork_parent() -> None:
    """Refuse to run as a copy of a process that had threads or CUDA: the copy would be broken."""
    parent_threads = len(os.listdir(f"/proc/{os.getppid()}/task"))
    if parent_threads != 1:
        raise RuntimeError(f"the fork server has {parent_threads} threads; forking it is unsafe")
    import torch

    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        raise RuntimeError("the fork server initialised CUDA; a forked child cannot use the GPU")


def _die_with_parent() -> None:
    """The fork server ends with its worker; its engines end with it (SIGTERM: vLLM's clean stop)."""
    die_with_parent(signal.SIGTERM)


def _pin_compute_threads(cpu_threads: str | None) -> None:
    """Compute on the engine's cores (all this process may use when None), one thread per core.

    OpenMP's binding variables came too late for this process (the fork server loaded OpenMP), so
    the process is pinned instead, before its first parallel region starts OpenMP's threads.
    """
    if cpu_threads is not None:
        os.sched_setaffinity(0, parse_cpu_list(cpu_threads))  # threads started from now on inherit it
        # For processes this one may start (a multi-process executor): they read OMP_* afresh.
        os.environ.update(omp_environment(cpu_threads))
    import torch

    with contextlib.suppress(RuntimeError):
        torch.set_num_threads(len(os.sched_getaffinity(0)))
