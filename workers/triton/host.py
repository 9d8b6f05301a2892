"""The worker's PyTriton host: one Triton server, one decoupled model per engine it holds, bound and
unbound while the server runs as models are loaded and unloaded.

Only the worker's user reaches this Triton: it serves gRPC on a Unix socket in a private folder
(see `unix_socket`) and no HTTP, with no access token on its command line, and the shared memory
that carries jobs to the models is closed to other users (see `shm_regions`).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from pytriton.client.utils import create_client_from_url
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.proxy.data import TensorStore
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

from switchboard.config import triton_model_name
from switchboard.pooling_config import BatchingConfig
from switchboard.ports import free_port
from workers.engines.base import Engine, PoolingEngine
from workers.runtime.private_runtime import remove_runtime_dir, remove_stale_runtime_dirs, runtime_dir
from workers.triton import unix_socket
from workers.triton.model import CHUNK_OUTPUT, JOB_INPUT, CoalescingPolicy, EngineCallable
from workers.triton.pooling_model import ANSWERS_OUTPUT, ROWS_INPUT, PoolingCallable
from workers.triton.shm_regions import ShmRegions, remove_stale_regions
from workers.triton.workspace import make_private, new_workspace_path, remove_stale_workspaces

logger = logging.getLogger(__name__)


def use_own_libpython() -> None:
    """Make Triton's Python backend stub load this interpreter's libpython.

    The stub links `libpython3.X.so` and would otherwise find the system's copy, which differs
    from the interpreter of pyenv, conda or a venv's base and kills the stub at model load.
    """
    libdir = sysconfig.get_config_var("LIBDIR")
    if not libdir:
        return
    paths = [p for p in os.environ.get("LD_LIBRARY_PATH", "").split(":") if p and p != libdir]
    os.environ["LD_LIBRARY_PATH"] = ":".join([libdir, *paths])


def send_tensors_inline() -> None:
    """Make PyTriton carry tensors inside its messages between Triton's stub and this process.

    By default every request and every response takes a block of shared memory from a manager
    process and hands it back after: four blocking round trips to a third process for a job of a
    few hundred bytes and chunks of a few dozen, which at 32 streams took a tenth of the worker's
    samples and almost half of the stub's. Read by PyTriton here at bind and by the stub at its start.
    """
    os.environ["PYTRITON_NO_TENSORSTORE"] = "1"


# Triton instances of a pooling model: one, decoupled (`batched_config`). A decoupled model's instance
# is free again as soon as it has handed a batch to PyTriton, so Triton's batcher sends the next batch
# while the engine computes one (in its own process, one batch after another): the hops of one batch
# overlap the computation of the one before, which several instances gave before without their race.
# (PyTriton's stubs of a model's later instances read their configuration from a handshake server
# that the first instance's stub starts, and Triton starts the instances together: under load a later
# one found no server yet, "Connection refused", and the model failed to load.) Not decoupled, one
# instance held every batch until it was answered: 10-40 rows per batch waited 20-60 ms in the queue.
POOLING_INSTANCES = 1

# Triton's metrics endpoint listens here (PyTriton's default is every address); it serves no
# HTTP API, and gRPC on a Unix socket.
LISTEN_ADDRESS = "127.0.0.1"
# No endpoint needs PyTriton's access token: nothing but this user reaches the socket. (With
# one, the token would be on Triton's command line, which every local user can read.)
NO_RESTRICTED_ENDPOINTS = TritonSecurityConfig(restricted_endpoints=[])

# How long Triton may take to finish unloading a model (its in-flight requests have ended).
UNLOAD_TIMEOUT_S = 30.0
# Tries at starting Triton when its binary is briefly "busy" (see _run_triton).
TRITON_START_ATTEMPTS = 3


def _still_loaded(index: list[dict[str, str]], name: str) -> bool:
    return any(entry.get("name") == name and entry.get("state") != "UNAVAILABLE" for entry in index)


class TritonHost:
    """Starts Triton on free ports and binds engines to it as streaming models."""

    def __init__(self, *, coalescing: CoalescingPolicy) -> None:
        # No TCP port but the metrics one: Triton serves no HTTP, and gRPC on a Unix socket.
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = free_port()
        self._coalescing = coalescing
        self._triton: Triton | None = None
        self._socket_dir: Path | None = None
        self._shm: ShmRegions | None = None
        # Models being unbound in the background: the thread, and the old stub's data socket.
        self._unbinding: dict[str, tuple[threading.Thread, Path | None]] = {}
        # The Triton model of each bound model: their output streams end before Triton stops.
        self._bound: dict[str, EngineCallable | PoolingCallable] = {}
        # start() runs in a thread that a worker stopping early cannot interrupt: stop() marks the
        # host closed and waits for a start in progress, which then stops what it started.
        self._lifecycle = threading.Lock()
        self._closed = False

    @property
    def grpc_address(self) -> str:
        """Where the consumer reaches this Triton over gRPC (a Unix socket)."""
        if self._socket_dir is None:
            raise RuntimeError("start() the Triton host first")
        return unix_socket.client_target(self._socket_dir)

    def start(self) -> None:
        """Launch the Triton server process (a few seconds); nothing once the host was stopped."""
        with self._lifecycle:
            if self._closed:
                return
            self._start()

    def _start(self) -> None:
        use_own_libpython()
        send_tensors_inline()
        unix_socket.teach_pytriton()
        # What workers of this user killed outright left: their sockets' folders, their regions.
        remove_stale_runtime_dirs()
        remove_stale_regions()
        remove_stale_workspaces()
        self._socket_dir = runtime_dir("triton")
        try:
            unix_socket.check_length(self._socket_dir)
            self._triton = _run_triton(self._config(self._socket_dir))
        except BaseException:
            remove_runtime_dir(self._socket_dir)
            self._socket_dir = None
            raise
        self._shm = ShmRegions(_shm_prefix(self._triton))
        self._shm.watch()
        logger.info("triton started", extra={"grpc": self.grpc_address, "metrics_port": self.metrics_port})

    def _config(self, socket_dir: Path) -> TritonConfig:
        return TritonConfig(
            # Only this worker talks to its Triton: no other user, nothing on the network.
            allow_http=False,
            grpc_address=unix_socket.socket_address(socket_dir),
            grpc_port=unix_socket.SOCKET_PORT,
            metrics_address=LISTEN_ADDRESS,
            metrics_port=self.metrics_port,
            log_verbose=0,
            # Ready means the server is up: models come and go, and each is asked about itself.
            # (Strict readiness would read "not ready" while any model unloads, and PyTriton's
            # bind waits for readiness in steps of a second.)
            strict_readiness=False,
        )

    def bind(self, model: str, engine: Engine) -> EngineCallable | PoolingCallable:
        """Serve `engine` as the Triton model `triton_model_name(model)` (about 2 s): decoupled for a
        generator, batched by Triton's dynamic batcher for a pooling engine.

        The engine need not be started yet: Triton sends it nothing until the consumer does.
        """
        triton = self._running()
        callable_: EngineCallable | PoolingCallable
        instances = 1
        if isinstance(engine, PoolingEngine):
            callable_ = PoolingCallable(engine)
            instances = POOLING_INSTANCES
            inputs = [Tensor(name=ROWS_INPUT, dtype=np.bytes_, shape=(1,))]
            outputs = [Tensor(name=ANSWERS_OUTPUT, dtype=np.bytes_, shape=(1,))]
            config = batched_config(engine.model.batching)
        else:
            callable_ = EngineCallable(engine, self._coalescing)
            inputs = [Tensor(name=JOB_INPUT, dtype=np.bytes_, shape=(1,))]
            outputs = [Tensor(name=CHUNK_OUTPUT, dtype=np.bytes_, shape=(1,))]
            config = ModelConfig(decoupled=True, batching=False)
        name = triton_model_name(model)
        self._wait_until_unloaded(name)
        try:
            with self._private_shm():
                triton.bind(
                    model_name=name,
                    infer_func=[callable_] * instances,
                    inputs=inputs,
                    outputs=outputs,
                    config=config,
                    strict=False,
                )
        except BaseException:
            # PyTriton registers the model before Triton loads it: a load that failed would
            # make every later bind of the name fail ("same name twice") for the worker's life.
            self._forget(name)
            raise
        # PyTriton drives the callable from one event loop thread per instance; a generator's engine is
        # driven from that same loop (its only one), so it is handed over explicitly here.
        callable_.attach_loop(self._handler_loop(name))
        self._bound[name] = callable_
        return callable_

    def unbind(self, model: str) -> None:
        """Remove the model from Triton, finishing in the background; returns at once.

        Its handler thread takes a second to end and Triton's Python stub a few more; nothing
        waits for that but a later bind of the same name (and `stop`).
        """
        name = triton_model_name(model)
        callable_ = self._bound.pop(name, None)
        if callable_ is not None:
            callable_.end_output_streams()
        bound = self._running()._model_manager._models.pop((name.lower(), 1), None)  # (name, version)
        if bound is None:
            return
        unbinding = threading.Thread(target=self._unbind, args=(name, bound), name=f"unbind-{name}")
        tensor_store = getattr(bound._serializer_deserializer, "_tensor_store", None)
        data_socket = Path(tensor_store.address) if tensor_store is not None else None
        self._unbinding[name] = (unbinding, data_socket)
        unbinding.start()

    def _forget(self, name: str) -> None:
        """Drop what a failed bind of `name` left registered, so that the next one starts afresh."""
        bound = self._running()._model_manager._models.pop((name.lower(), 1), None)
        if bound is None:
            return
        try:
            self._unbind(name, bound)
        except Exception:
            logger.warning("could not clean up after a failed bind", extra={"model": name}, exc_info=True)

    def _unbind(self, name: str, bound: Any) -> None:
        """What PyTriton's own shutdown does, for one model (PyTriton 0.7 binds but cannot unbind)."""
        triton = self._running()
        tensor_store = getattr(bound._serializer_deserializer, "_tensor_store", None)
        # Drop PyTriton's observers first, so that this model's stub ending does not read as the
        # whole server terminating (PyTriton stops Triton on that event); then let Triton unload
        # the stub while the model's own threads wind down (about a second) here.
        with bound._observers_lock:
            bound._model_events_observers.clear()
        with contextlib.closing(create_client_from_url(triton._url)) as client:
            client.unload_model(name, headers=self._control_headers())
        bound.clean()
        if tensor_store is not None:
            # PyTriton caches one tensor store per socket path for the process's life, with the
            # old stub's key; a later bind of the same name must make a new one.
            TensorStore._instances.pop(tensor_store.address, None)

    def _wait_until_unloaded(self, name: str) -> None:
        """Wait for Triton to finish unloading `name`: a new stub of the same name would otherwise
        meet the old one's handshake and data sockets (and fail to start)."""
        unbinding, data_socket = self._unbinding.pop(name, (None, None))
        if unbinding is None:
            return
        unbinding.join(UNLOAD_TIMEOUT_S)
        triton = self._running()
        deadline = time.monotonic() + UNLOAD_TIMEOUT_S
        with contextlib.closing(create_client_from_url(triton._url)) as client:
            while _still_loaded(self._repository_index(client), name) or (
                data_socket is not None and data_socket.exists()
            ):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"Triton did not unload {name} within {UNLOAD_TIMEOUT_S:g} s")
                time.sleep(0.02)

    def _repository_index(self, client: Any) -> list[dict[str, str]]:
        """Triton's models and their states (the gRPC client's answer, as dicts)."""
        index = client.get_model_repository_index(headers=self._control_headers(), as_json=True)
        return list(index.get("models", []))

    def _control_headers(self) -> dict[str, str] | None:
        # None: model control is guarded by the socket's folder, not by a token (see the module).
        headers: dict[str, str] | None = self._running()._model_manager._headers
        return headers

    def _private_shm(self) -> contextlib.AbstractContextManager[None]:
        return self._shm.kept_private() if self._shm is not None else contextlib.nullcontext()

    def _running(self) -> Triton:
        if self._triton is None:
            raise RuntimeError("start() the Triton host before binding models")
        return self._triton

    def _handler_loop(self, name: str) -> asyncio.AbstractEventLoop:
        bound = self._running()._model_manager._models[(name.lower(), 1)]
        # A pooling model's instances share its engine, which takes calls from any loop: the first's.
        loop: asyncio.AbstractEventLoop = bound._inference_handlers[0]._loop
        return loop

    def stop(self) -> None:
        """Stop Triton and every model bound to it, after a start in progress; idempotent."""
        self._closed = True
        with self._lifecycle:
            self._stop()

    def _stop(self) -> None:
        for unbinding, _ in list(self._unbinding.values()):
            unbinding.join(UNLOAD_TIMEOUT_S)
        self._unbinding.clear()
        # A model still bound (its unload failed or timed out) keeps its output stream's request
        # open, which Triton would wait for until its own timeout.
        for callable_ in self._bound.values():
            callable_.end_output_streams()
        self._bound.clear()
        if self._triton is not None:
            self._triton.stop()
            self._triton = None
        # Triton removes its regions on a clean stop; whatever a stub that died left goes too.
        if self._shm is not None:
            self._shm.remove()
            self._shm = None
        if self._socket_dir is not None:
            remove_runtime_dir(self._socket_dir)
            self._socket_dir = None


def batched_config(batching: BatchingConfig) -> ModelConfig:
    """A pooling model's Triton config: rows along the batch dimension, up to `max_batch_size` per
    engine call; with batching enabled, Triton's dynamic batcher groups requests that arrive within
    `queue_delay_ms` (a batch of a preferred size leaves at once); without, each request runs alone.
    Decoupled (each request answered once, on the stream it came by): the instance takes the next
    batch while the engine computes this one."""
    batcher = None
    if batching.enabled:
        batcher = DynamicBatcher(
            max_queue_delay_microseconds=int(batching.queue_delay_ms * 1000),
            preferred_batch_size=list(batching.preferred_batch_sizes),
        )
    # PyTriton's type says a batcher, but None is how it leaves the dynamic batcher out.
    return ModelConfig(
        batching=True,
        max_batch_size=batching.max_batch_size,
        batcher=batcher,  # type: ignore[arg-type]
        decoupled=True,
    )


def _shm_prefix(triton: Triton) -> str:
    """PyTriton's prefix for the shared memory regions of this Triton's models."""
    prefix: str = triton._python_backend_config["shm-region-prefix-name"]
    return prefix


def _run_triton(config: TritonConfig) -> Triton:
    """Start a Triton server, trying again when its freshly copied binary is "busy".

    PyTriton copies the server binary into a fresh workspace and executes it. A process forked by
    another thread while that copy is open for writing inherits the open file, and the exec then
    fails with ETXTBSY until that child has exec'd or exited, a fraction of a second later.
    """
    for attempt in range(1, TRITON_START_ATTEMPTS + 1):
        workspace = new_workspace_path()
        triton = Triton(config=config, workspace=workspace, security_config=NO_RESTRICTED_ENDPOINTS)
        make_private(workspace)
        try:
            triton.run()
            return triton
        except OSError as exc:
            if exc.errno != errno.ETXTBSY or attempt == TRITON_START_ATTEMPTS:
                raise
            logger.warning("triton's binary was busy (another process forked meanwhile); starting again")
            with contextlib.suppress(Exception):
                triton.stop()  # cleans the failed try's workspace
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")
