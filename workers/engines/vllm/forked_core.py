"""vLLM EngineCore processes forked from the worker's fork server, instead of spawned (opt-in).

vLLM starts each model's EngineCore with `spawn`: a new interpreter that imports vLLM again, which
is most of a cold load. Here the EngineCore is forked from the worker's fork server
(`workers.engines.fork_server`), which imported vLLM's engine side once at its start. The child
becomes that model's EngineCore; the worker keeps the AsyncLLM front end and connects it the way
vLLM's multi-API-server mode connects front ends to engines they did not start (`client_addresses`).

What this relies on:
- vLLM internals: `EngineCoreProc.run_engine_core` and its keyword arguments, the start-up
  handshake (`wait_for_engine_startup`, `CoreEngine`, `CoreEngineLaunch`), `AsyncLLM`'s
  `client_addresses`, and the client's `resources.engine_dead` flag. These move between vLLM
  versions; each is used in one place below.
- What the fork server guarantees its children (no threads, no CUDA, the worker's environment,
  pinned compute threads): `workers.engines.fork_server`.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import threading
from multiprocessing.process import BaseProcess
from typing import Any

from workers.engines.fork_server import become_engine_process, start_fork_server
from workers.engines.parent_death import original_run_engine_core
from workers.engines.process_env import stop_process

logger = logging.getLogger(__name__)


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
