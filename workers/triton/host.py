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
import json
import logging
import os
import shutil
import sysconfig
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
from pytriton.client.utils import create_client_from_url
from pytriton.model_config import ModelConfig, Tensor
from pytriton.proxy.data import TensorStore
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

from switchboard.config import triton_model_name
from switchboard.pooling_config import BatchingConfig
from switchboard.ports import free_port
from workers.engines.base import Engine, PoolingEngine
from workers.runtime.private_runtime import remove_runtime_dir, remove_stale_runtime_dirs, runtime_dir
from workers.triton import pooling_backend, unix_socket
from workers.triton.model import CHUNK_OUTPUT, JOB_INPUT, CoalescingPolicy, EngineCallable
from workers.triton.pooling_model import PoolingModel
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
        self._bound: dict[str, EngineCallable | PoolingModel] = {}
        # start() runs in a thread that a worker stopping early cannot interrupt: stop() marks the
        # host closed and waits for a start in progress, which then stops what it started.
        self._lifecycle = threading.Lock()
        self._closed = False
        # Pooling models: written into Triton's repository and loaded there (not bound by PyTriton).
        self._pooling_models: set[str] = set()

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

    def bind(self, model: str, engine: Engine) -> EngineCallable | PoolingModel:
        """Serve `engine` as the Triton model `triton_model_name(model)` (about 2 s): decoupled for a
        generator, bound through PyTriton; batched by Triton's dynamic batcher for a pooling engine,
        a Python-backend model of its own (`pooling_backend`).

        The engine need not be started yet: Triton sends it nothing until the consumer does.
        """
        name = triton_model_name(model)
        self._wait_until_unloaded(name)
        if isinstance(engine, PoolingEngine):
            self._load_pooling_model(name, engine)
            pooling = PoolingModel(engine)
            self._bound[name] = pooling
            return pooling
        triton = self._running()
        callable_ = EngineCallable(engine, self._coalescing)
        try:
            with self._private_shm():
                triton.bind(
                    model_name=name,
                    infer_func=callable_,
                    inputs=[Tensor(name=JOB_INPUT, dtype=np.bytes_, shape=(1,))],
                    outputs=[Tensor(name=CHUNK_OUTPUT, dtype=np.bytes_, shape=(1,))],
                    config=ModelConfig(decoupled=True, batching=False),
                    strict=False,
                )
        except BaseException:
            # PyTriton registers the model before Triton loads it: a load that failed would
            # make every later bind of the name fail ("same name twice") for the worker's life.
            self._forget(name)
            raise
        # PyTriton drives the callable from one event loop thread; the generator's engine is driven
        # from that same loop (its only one), so it is handed over explicitly here.
        callable_.attach_loop(self._handler_loop(name))
        self._bound[name] = callable_
        return callable_

    def _load_pooling_model(self, name: str, engine: PoolingEngine) -> None:
        """Write the pooling model's Triton model (`pooling_backend`, its batching in `config.pbtxt`)
        into Triton's repository and load it; its stub sends batches to the engine's process."""
        folder = self._running()._workspace.model_store_path / name
        shutil.rmtree(folder, ignore_errors=True)
        (folder / "1").mkdir(parents=True)
        shutil.copyfile(pooling_backend.__file__, folder / "1" / "model.py")
        config = pooling_config(name, engine.model.batching, engine.batch_socket)
        (folder / "config.pbtxt").write_text(config)
        try:
            with (
                self._private_shm(),
                contextlib.closing(create_client_from_url(self._running()._url)) as client,
            ):
                client.load_model(name, headers=self._control_headers())
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        self._pooling_models.add(name)

    def unbind(self, model: str) -> None:
        """Remove the model from Triton, finishing in the background; returns at once.

        Its handler thread takes a second to end and Triton's Python stub a few more; nothing
        waits for that but a later bind of the same name (and `stop`).
        """
        name = triton_model_name(model)
        callable_ = self._bound.pop(name, None)
        if callable_ is not None:
            callable_.end_output_streams()
        if name in self._pooling_models:
            self._pooling_models.discard(name)
            unloading = threading.Thread(
                target=self._unload_pooling_model, args=(name,), name=f"unbind-{name}"
            )
            self._unbinding[name] = (unloading, None)
            unloading.start()
            return
        bound = self._running()._model_manager._models.pop((name.lower(), 1), None)  # (name, version)
        if bound is None:
            return
        unbinding = threading.Thread(target=self._unbind, args=(name, bound), name=f"unbind-{name}")
        tensor_store = getattr(bound._serializer_deserializer, "_tensor_store", None)
        data_socket = Path(tensor_store.address) if tensor_store is not None else None
        self._unbinding[name] = (unbinding, data_socket)
        unbinding.start()

    def _unload_pooling_model(self, name: str) -> None:
        with contextlib.closing(create_client_from_url(self._running()._url)) as client:
            client.unload_model(name, headers=self._control_headers())

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
        # Pooling models are Triton's own, not PyTriton's: unloaded here, or Triton's stop waits for them.
        for name in list(self._pooling_models):
            with contextlib.suppress(Exception):
                self._unload_pooling_model(name)
        self._pooling_models.clear()
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


def pooling_config(name: str, batching: BatchingConfig, batch_socket: Path) -> str:
    """A pooling model's Triton config: rows along the batch dimension, up to `max_batch_size` per
    engine call; with batching enabled, Triton's dynamic batcher groups requests that arrive within
    `queue_delay_ms` (a batch of a preferred size leaves at once); without, each request runs alone.
    One instance, not decoupled: while its batch computes, the batcher gathers the next."""
    backend = pooling_backend
    lines = [
        f"name: {json.dumps(name)}",
        'backend: "python"',
        f"max_batch_size: {batching.max_batch_size}",
        "instance_group [ { kind: KIND_CPU count: 1 } ]",
        f'input [ {{ name: "{backend.ROWS_INPUT}" data_type: TYPE_STRING dims: [ 1 ] }} ]',
        "output [",
        f'  {{ name: "{backend.ANSWERS_OUTPUT}" data_type: TYPE_STRING dims: [ 1 ] }},',
        f'  {{ name: "{backend.BATCH_OUTPUT}" data_type: TYPE_INT64 dims: [ {backend.BATCH_COLUMNS} ] }}',
        "]",
        f'parameters {{ key: "{backend.SOCKET_PARAMETER}" value {{ string_value: {json.dumps(str(batch_socket))} }} }}',
    ]
    if batching.enabled:
        preferred = ", ".join(str(size) for size in batching.preferred_batch_sizes)
        lines.append(
            f"dynamic_batching {{ max_queue_delay_microseconds: {int(batching.queue_delay_ms * 1000)}"
            + (f" preferred_batch_size: [ {preferred} ]" if preferred else "")
            + " }"
        )
    return "\n".join(lines) + "\n"


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
