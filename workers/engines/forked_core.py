"""EngineCore processes forked from a helper that imported vLLM once, instead of spawned (opt-in).

vLLM starts each model's EngineCore with `spawn`: a new interpreter that imports vLLM again, which
is most of a cold load. Here the helper is the standard library's fork server: started once per
worker (`start_fork_server`), it imports vLLM's engine side at its start (`fork_server_preload`),
then, single-threaded, forks one child per model on request. The child becomes that model's
EngineCore; the worker keeps the AsyncLLM front end and connects it the way vLLM's multi-API-server
mode connects front ends to engines they did not start (`client_addresses`).

What this relies on:
- vLLM internals: `EngineCoreProc.run_engine_core` and its keyword arguments, the start-up
  handshake (`wait_for_engine_startup`, `CoreEngine`, `CoreEngineLaunch`), `AsyncLLM`'s
  `client_addresses`, and the client's `resources.engine_dead` flag. These move between vLLM
  versions; each is used in one place below.
- The fork server never starts a thread and never initialises CUDA before it forks: every child
  checks both (its parent's /proc task list, torch's CUDA flag) and refuses to start otherwise.
- OpenMP was loaded in the fork server without thread binding, so OMP_* variables come too late
  for the child: it pins itself (sched_setaffinity, torch.set_num_threads) before its first
  parallel region.
- Settings vLLM puts in the worker's environment while it builds the engine's config reach the
  child because the worker's environment is handed over and installed before vLLM starts.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import multiprocessing.connection
import multiprocessing.forkserver
import os
import signal
import threading
import time
from multiprocessing.process import BaseProcess
from typing import Any

from workers.engines.parent_death import die_with_parent, original_run_engine_core
from workers.engines.process_env import engine_process_environment, stop_process
from workers.runtime.cpu_placement import omp_environment, parse_cpu_list

logger = logging.getLogger(__name__)

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


class ForkedEngineCore:
    """One EngineCore process forked from the fork server, and the AsyncLLM that talks to it."""

    def __init__(self, llm: Any, process: BaseProcess) -> None:
        self.llm = llm
        self._process = process
        self._stopping = threading.Event()
        # The exit status is read from the process's sentinel once; two threads reading it at once
        # (the monitor and a stop) would lose it.
        self._process_lock = threading.Lock()
        # vLLM watches the engines it starts and fails their requests when one dies; for an engine
        # it did not start, this thread does the same.
        self._monitor = threading.Thread(target=self._watch, name="ForkedEngineCoreMonitor", daemon=True)
        self._monitor.start()

    @property
    def pid(self) -> int | None:
        """The EngineCore's pid."""
        return self._process.pid

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Close the front end, then stop the EngineCore: SIGTERM, then SIGKILL after `timeout_s`."""
        self._stopping.set()
        self.llm.shutdown()
        with self._process_lock:
            stop_process(self._process, timeout_s)

    def _watch(self) -> None:
        multiprocessing.connection.wait([self._process.sentinel])
        with self._process_lock:
            if self._stopping.is_set():
                return
            exitcode = self._process.exitcode
        logger.error("forked EngineCore exited", extra={"pid": self.pid, "exitcode": exitcode})
        client = self.llm.engine_core
        client.resources.engine_dead = True
        client.shutdown()


def unsupported_reason(platform: Any) -> str | None:
    """Why engines cannot be forked here (None: they can). Checked before every forked start.

    Forking was verified on vLLM's CPU build 0.32; on GPUs it is untried. The vLLM internals it
    uses are checked by signature, so that another vLLM version falls back to spawn instead of
    failing in the middle of a start.
    """
    import inspect

    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.core import EngineCoreProc
    from vllm.v1.engine.utils import CoreEngineLaunch, wait_for_engine_startup

    if not platform.is_cpu():
        return f"forked engines are only verified on CPU builds, not on {platform.device_type}"
    expected: dict[Any, list[str]] = {
        wait_for_engine_startup: [
            "handshake_socket",
            "core_engines",
            "parallel_config",
            "coordinated_dp",
            "cache_config",
            "launch",
        ],
        EngineCoreProc.__init__: ["vllm_config", "local_client", "handshake_address", "executor_class"],
        # vLLM's own entry point, also where the worker wraps it (`parent_death`).
        original_run_engine_core(): ["dp_rank", "local_dp_rank"],
        AsyncLLM.__init__: ["vllm_config", "executor_class", "log_stats", "client_addresses"],
        CoreEngineLaunch: ["engine_manager", "coordinator", "addresses", "tensor_queue"],
    }
    for function, names in expected.items():
        parameters = list(inspect.signature(function).parameters)
        if not all(name in parameters for name in names):
            return f"vLLM's {function.__qualname__} has changed: {parameters}"
    if "watched_frontend_processes" not in inspect.signature(CoreEngineLaunch).parameters:
        return "vLLM's CoreEngineLaunch has changed"
    return None


def launch(
    vllm_config: Any, *, cpu_threads: str | None, log_stats: bool, log_requests: bool
) -> ForkedEngineCore:
    """Fork an EngineCore for `vllm_config` and return once it is ready, with its AsyncLLM."""
    import zmq
    from vllm.utils.network_utils import get_open_zmq_ipc_path, zmq_socket_ctx
    from vllm.v1.engine.async_llm import AsyncLLM
    from vllm.v1.engine.utils import CoreEngine, CoreEngineLaunch, EngineZmqAddresses, wait_for_engine_startup
    from vllm.v1.executor.abstract import Executor

    start_fork_server()
    executor_class = Executor.get_class(vllm_config)
    addresses = EngineZmqAddresses(inputs=[get_open_zmq_ipc_path()], outputs=[get_open_zmq_ipc_path()])
    handshake_address = get_open_zmq_ipc_path()
    engine_kwargs = {
        "vllm_config": vllm_config,
        "local_client": True,
        "handshake_address": handshake_address,
        "executor_class": executor_class,
        "log_stats": log_stats,
        "dp_rank": 0,
        "local_dp_rank": 0,
    }
    context = multiprocessing.get_context("forkserver")
    process = context.Process(
        target=_engine_core_main,
        name="EngineCore",
        args=(dict(os.environ), cpu_threads, engine_kwargs),
    )
    with zmq_socket_ctx(handshake_address, zmq.ROUTER, bind=True) as handshake_socket:
        process.start()
        try:
            startup = CoreEngineLaunch(None, None, addresses, None, watched_frontend_processes=[process])
            wait_for_engine_startup(
                handshake_socket,
                [CoreEngine(index=0, local=True)],
                vllm_config.parallel_config,
                False,
                vllm_config.cache_config,
                startup,
            )
        except BaseException as exc:
            stop_process(process, 5.0)
            if isinstance(exc, RuntimeError) and process.exitcode is not None:
                raise RuntimeError(
                    f"the forked EngineCore exited during start-up (exit code {process.exitcode}); "
                    "its log explains why"
                ) from exc
            raise
    try:
        llm = AsyncLLM(
            vllm_config=vllm_config,
            executor_class=executor_class,
            log_stats=log_stats,
            log_requests=log_requests,
            client_addresses={"input_address": addresses.inputs[0], "output_address": addresses.outputs[0]},
        )
    except BaseException:
        stop_process(process, 5.0)
        raise
    return ForkedEngineCore(llm, process)


# --- in the forked child ------------------------------------------------------------------------


def _engine_core_main(
    environ: dict[str, str], cpu_threads: str | None, engine_kwargs: dict[str, Any]
) -> None:
    """The child's life: check what it was forked from, take the worker's environment, pin, run."""
    become_engine_process(environ, cpu_threads, forked=True)
    from vllm.v1.engine.core import EngineCoreProc

    EngineCoreProc.run_engine_core(**engine_kwargs)


def become_engine_process(
    environ: dict[str, str], cpu_threads: str | None, *, forked: bool, title: str | None = None
) -> None:
    """What an engine's process does first (an EngineCore here, a pooling model's process in
    `pooling_process`): check what it was forked from, end with its parent, take the worker's
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
