"""The worker's Triton host: one Triton server (started by PyTriton), one model per engine it holds,
loaded and unloaded while the server runs as the worker's models are.

Each model is Switchboard's own, written into Triton's model repository at load (`model_folders`): a
generator's (decoupled) hands its requests to the engine's loop over a Unix socket; a pooling model's
(batched by Triton's dynamic batcher) hands its batches to the model's process. Both do so from inside
tritonserver on the worker's own backend (`native_backend`) or, where that is not built, from a
Python-backend stub (`generator.backend`, `pooling.backend`).

Only the worker's user reaches this Triton: it serves gRPC on a Unix socket in a private folder
(see `unix_socket`) and no HTTP, with no access token on its command line. On the worker's own
backend no job crosses shared memory; a Python-backend stub's region, which Triton makes readable by
every local user, is closed as it appears (see `shm_regions`).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import os
import shutil
import sysconfig
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pytriton.client.utils import create_client_from_url
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

from switchboard.config import triton_model_name
from switchboard.ports import free_port
from workers.engines.base import Engine, PoolingEngine
from workers.runtime.private_runtime import remove_runtime_dir, remove_stale_runtime_dirs, runtime_dir
from workers.triton import model_folders, native_backend, unix_socket
from workers.triton.generator.job_socket import JobSocket
from workers.triton.generator.model import CoalescingPolicy, GeneratorModel
from workers.triton.pooling.model import PoolingModel
from workers.triton.shm_regions import ShmRegions, remove_stale_regions
from workers.triton.workspace import new_workspace_path, remove_stale_workspaces, remove_workspace

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


# Triton's metrics endpoint listens here (PyTriton's default is every address); it serves no
# HTTP API, and gRPC on a Unix socket.
LISTEN_ADDRESS = "127.0.0.1"
# No endpoint needs PyTriton's access token: nothing but this user reaches the socket. (With
# one, the token would be on Triton's command line, which every local user can read.)
NO_RESTRICTED_ENDPOINTS = TritonSecurityConfig(restricted_endpoints=[])

# How long Triton may take to finish unloading a model (its in-flight requests have ended).
UNLOAD_TIMEOUT_S = 30.0
# How long Triton's stop waits for requests still in flight.
EXIT_TIMEOUT_S = 5
# Tries at starting Triton when its binary is briefly "busy" (see _run_triton).
TRITON_START_ATTEMPTS = 3


def _still_loaded(index: list[dict[str, str]], name: str) -> bool:
    return any(entry.get("name") == name and entry.get("state") != "UNAVAILABLE" for entry in index)


class TritonHost:
    """Starts Triton on free ports and binds engines to it as streaming models."""

    def __init__(self, *, coalescing: CoalescingPolicy, native: bool | None = None) -> None:
        """`native`: serve models on the worker's own Triton backend (True; it must be built), on
        Triton's Python backend (False), or on the former where it is built (None)."""
        # No TCP port but the metrics one: Triton serves no HTTP, and gRPC on a Unix socket.
        self.http_port = 0
        self.grpc_port = 0
        self.metrics_port = free_port()
        self._coalescing = coalescing
        self._native_library = None if native is False else native_backend.built_library()
        if native and self._native_library is None:
            raise RuntimeError(
                "the worker's Triton backend is not built: run `make install` "
                "(or `python -m workers.triton.native_backend`)"
            )
        self._triton: Triton | None = None
        self._socket_dir: Path | None = None
        self._shm: ShmRegions | None = None
        # Models being unloaded in the background, and the threads that unload them.
        self._unbinding: dict[str, threading.Thread] = {}
        # The Triton model of each bound model: their output streams end before Triton stops.
        self._bound: dict[str, GeneratorModel | PoolingModel] = {}
        # Each bound generator's engine loop and the socket its stub hands requests to.
        self._job_sockets: dict[str, JobSocket] = {}
        self._socket_numbers = itertools.count()
        # Models being loaded again after their stub died (`_load_again`), one reload each at a time.
        self._reloading: set[str] = set()
        self._reloads_lock = threading.Lock()
        # start() runs in a thread that a worker stopping early cannot interrupt: stop() marks the
        # host closed and waits for a start in progress, which then stops what it started.
        self._lifecycle = threading.Lock()
        self._closed = False

    @property
    def native(self) -> bool:
        """Whether models are served on the worker's own Triton backend (`native_backend`)."""
        return self._native_library is not None

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
        if self._native_library is None:
            logger.warning(
                "models go through Triton's Python backend (a stub process per model, a slower path "
                "for every job, and shared memory that Triton opens to every local user until the "
                "worker closes it): the worker's own backend is not built; `make install` builds it "
                "(or `python -m workers.triton.native_backend`, with a C compiler)"
            )

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
            # The worker has drained its jobs before it stops Triton: what Triton still counts in
            # flight then is a dead stub's (it never ends them), which held every stop 30 s.
            exit_timeout_secs=EXIT_TIMEOUT_S,
        )

    def bind(self, model: str, engine: Engine) -> GeneratorModel | PoolingModel:
        """Serve `engine` as the Triton model `triton_model_name(model)`: decoupled for a generator,
        its requests handed to the engine's own loop (`model_folders.write_generator`); batched by
        Triton's dynamic batcher for a pooling engine, its batches handed to the model's process
        (`model_folders.write_pooling`). Milliseconds on the worker's own backend, about 1.4 s with a
        Python stub.

        The engine need not be started yet: Triton sends it nothing until the consumer does.
        """
        name = triton_model_name(model)
        self._wait_until_unloaded(name)
        library = self._native_library
        if isinstance(engine, PoolingEngine):
            batching, batch_socket = engine.model.batching, engine.batch_socket
            self._load_own_model(
                name,
                lambda folder: model_folders.write_pooling(folder, name, batching, batch_socket, library),
            )
            pooling = PoolingModel(engine)
            self._bound[name] = pooling
            return pooling
        generator = GeneratorModel(engine, self._coalescing)
        path = self._socket_folder() / f"jobs-{next(self._socket_numbers)}"
        job_socket = JobSocket.open(path, generator, name, on_stub_lost=lambda: self._load_again(name))
        try:
            self._load_own_model(
                name, lambda folder: model_folders.write_generator(folder, name, path, library)
            )
        except BaseException:
            job_socket.close()
            raise
        self._job_sockets[name] = job_socket
        self._bound[name] = generator
        return generator

    def load_again_after_stub_loss(self, model: str) -> None:
        """A pooling model's Triton stub has died (its client saw Triton call it unhealthy): load the
        model into Triton again, in the background; a reload under way already is enough."""
        self._load_again(triton_model_name(model))

    def _load_again(self, name: str) -> None:
        """Load a model whose stub died into Triton again, in the background: Triton starts no new
        stub by itself (for a decoupled model, nor for a batched one), and fails the model's requests
        until it is loaded anew."""
        with self._reloads_lock:
            if name in self._reloading:
                return
            self._reloading.add(name)

        def load() -> None:
            try:
                if name not in self._bound or self._closed:
                    return  # unloaded meanwhile
                logger.warning("loading the model into Triton again: its stub ended", extra={"model": name})
                self._triton_load(name)
            except Exception:
                logger.exception("could not load the model into Triton again", extra={"model": name})
            finally:
                with self._reloads_lock:
                    self._reloading.discard(name)

        threading.Thread(target=load, name=f"reload-{name}", daemon=True).start()

    def _load_own_model(self, name: str, write: Callable[[Path], None]) -> None:
        """Write a model's folder into Triton's repository (`write`, into the emptied folder) and load it."""
        folder = self._running()._workspace.model_store_path / name
        shutil.rmtree(folder, ignore_errors=True)
        write(folder)
        try:
            self._triton_load(name)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def _triton_load(self, name: str) -> None:
        """Ask Triton to load (or load again) the model in its repository's folder `name`."""
        with (
            self._private_shm(),
            contextlib.closing(create_client_from_url(self._running()._url)) as client,
        ):
            client.load_model(name, headers=self._control_headers())

    def unbind(self, model: str) -> None:
        """Remove the model from Triton, finishing in the background; returns at once.

        Triton's Python stub takes a second or more to end; nothing waits for that but a later bind
        of the same name (and `stop`). A generator's engine must have been stopped before.
        """
        name = triton_model_name(model)
        bound = self._bound.pop(name, None)
        if bound is None:
            return
        bound.end_output_streams()
        unloading = threading.Thread(
            target=self._unload_own_model,
            args=(name, self._job_sockets.pop(name, None)),
            name=f"unbind-{name}",
        )
        self._unbinding[name] = unloading
        unloading.start()

    def _unload_own_model(self, name: str, job_socket: JobSocket | None) -> None:
        """Unload the model from Triton; once its stub has ended, close the generator's engine loop."""
        if job_socket is not None:
            job_socket.expect_stub_end()
        try:
            with contextlib.closing(create_client_from_url(self._running()._url)) as client:
                client.unload_model(name, headers=self._control_headers())
                self._wait_for_unload(client, name)
        finally:
            if job_socket is not None:
                job_socket.close()

    def _wait_until_unloaded(self, name: str) -> None:
        """Wait for Triton to finish unloading `name`: a new stub of the same name would otherwise
        meet the old one's (and fail to start)."""
        unbinding = self._unbinding.pop(name, None)
        if unbinding is None:
            return
        unbinding.join(UNLOAD_TIMEOUT_S)
        with contextlib.closing(create_client_from_url(self._running()._url)) as client:
            self._wait_for_unload(client, name)

    def _wait_for_unload(self, client: Any, name: str) -> None:
        deadline = time.monotonic() + UNLOAD_TIMEOUT_S
        while _still_loaded(self._repository_index(client), name):
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

    def _socket_folder(self) -> Path:
        if self._socket_dir is None:
            raise RuntimeError("start() the Triton host before binding models")
        return self._socket_dir

    def stop(self) -> None:
        """Stop Triton and every model bound to it, after a start in progress; idempotent."""
        self._closed = True
        with self._lifecycle:
            self._stop()

    def _stop(self) -> None:
        for unbinding in list(self._unbinding.values()):
            unbinding.join(UNLOAD_TIMEOUT_S)
        self._unbinding.clear()
        # A model still bound keeps its output stream's request open, which Triton would wait for
        # until its own timeout; its stub ends as Triton stops, then its engine loop closes.
        for name in list(self._bound):
            self._bound.pop(name).end_output_streams()
            with contextlib.suppress(Exception):
                self._unload_own_model(name, self._job_sockets.pop(name, None))
        if self._triton is not None:
            workspace = self._triton._workspace.path
            self._triton.stop()
            self._triton = None
            remove_workspace(workspace)
        for job_socket in self._job_sockets.values():
            job_socket.close()
        self._job_sockets.clear()
        # Triton removes its regions on a clean stop; whatever a stub that died left goes too.
        if self._shm is not None:
            self._shm.remove()
            self._shm = None
        if self._socket_dir is not None:
            remove_runtime_dir(self._socket_dir)
            self._socket_dir = None


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
        triton: Triton | None = None
        try:
            triton = Triton(config=config, workspace=workspace, security_config=NO_RESTRICTED_ENDPOINTS)
            triton.run()
            return triton
        except BaseException as exc:
            if triton is not None:
                with contextlib.suppress(Exception):
                    triton.stop()  # cleans the failed try's workspace
            remove_workspace(workspace)
            if (
                not (isinstance(exc, OSError) and exc.errno == errno.ETXTBSY)
                or attempt == TRITON_START_ATTEMPTS
            ):
                raise
            logger.warning("triton's binary was busy (another process forked meanwhile); starting again")
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")
