"""A pooling model's own process: the runner computes there; batches come from Triton's stub over a
Unix socket, and from the worker over a pipe.

In the worker's process the runner's Python glue between torch's kernels (a few hundred calls per
forward pass of even a tiny BERT) needed the GIL the worker's event loop holds most of the time
under load: a batch of 7 rows took 5.5 ms alone and 11-12 ms beside a thread busy with Python 60 %
of the time, on cores of their own. In a process of its own the runner has its interpreter to
itself, as vLLM's model runner has beside its API server.

The child is forked from the worker's fork server (`workers.engines.fork_server`), which imported torch and
transformers once, so a load costs the model's files, not the imports; with `engine_process =
"spawn"` it starts afresh instead. Its first message says what it loaded (`LoadedModel`) or why it
could not, and from then on it listens at the socket the worker named (`batch_socket`): Triton's
stub for the model (`workers.triton.pooling.backend`) connects there and sends the batches Triton's
dynamic batcher made, straight from the stub to the model. The pipe takes the worker's own batches.
Either way one batch computes at a time, in order. It ends when the worker closes the pipe or sends
None, and with the fork server (or the worker) when that ends.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from multiprocessing.connection import Connection, Listener
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from switchboard import gc_heap
from switchboard.config import EngineProcess, ModelConfig
from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingRow
from workers.engines.process_env import stop_process
from workers.engines.torch_pooling.runner import LoadedModel, PoolingRunner
from workers.triton.pooling.backend import FAILED, OK, frame, unframe
from workers.triton.pooling.model import answer_of, decoded_rows, row_encoder

Answers = list[PooledRow | InvalidEngineRequest]


class PoolingProcessFailed(RuntimeError):
    """The pooling process could not load its model, failed a batch, or exited."""


class PoolingProcess:
    """The worker's end of one pooling model's process. Its calls block: run them off the event loop."""

    def __init__(
        self, model: ModelConfig, process: BaseProcess, connection: Any, loaded: LoadedModel
    ) -> None:
        self.model = model
        self.loaded = loaded
        self._process = process
        self._connection = connection
        # One batch in the pipe at a time: the child computes them one by one anyway.
        self._lock = threading.Lock()

    @classmethod
    def launch(
        cls, model: ModelConfig, *, cpu_threads: str | None, start: EngineProcess, batch_socket: Path
    ) -> PoolingProcess:
        """Start the model's process and wait until it has loaded the model (or failed to) and listens
        for Triton's batches at `batch_socket`."""
        if start == "fork":
            from workers.engines.fork_server import start_fork_server

            start_fork_server()
        context = (
            multiprocessing.get_context("forkserver")
            if start == "fork"
            else multiprocessing.get_context("spawn")
        )
        connection, child_end = context.Pipe(duplex=True)
        process: BaseProcess = context.Process(
            target=_pooling_main,
            name=f"pooling-{model.name}",
            args=(child_end, dict(os.environ), cpu_threads, model, start == "fork", str(batch_socket)),
        )
        process.start()
        child_end.close()
        try:
            kind, payload = _received(connection, process, model.name)
        except BaseException:
            stop_process(process, 5.0)
            raise
        if kind != "loaded":
            stop_process(process, 5.0)
            raise PoolingProcessFailed(f"{model.name} could not be loaded: {payload}")
        return cls(model, process, connection, payload)

    @property
    def pid(self) -> int | None:
        """The process's pid."""
        return self._process.pid

    @property
    def sentinel(self) -> int:
        """Ready once the process has ended (for `multiprocessing.connection.wait`)."""
        return self._process.sentinel

    @property
    def exited(self) -> bool:
        """Whether the process has ended (killed, or out of memory)."""
        return not self._process.is_alive()

    def pool(self, rows: list[PoolingRow]) -> Answers:
        """Each row's answer, or its refusal, computed in the model's process."""
        with self._lock:
            try:
                self._connection.send(rows)
            except (BrokenPipeError, OSError) as exc:
                raise self._exited() from exc
            kind, payload = _received(self._connection, self._process, self.model.name)
        if kind != "pooled":
            raise PoolingProcessFailed(f"{self.model.name} failed a batch: {payload}")
        answers: Answers = payload
        return answers

    def stop(self, timeout_s: float) -> None:
        """Ask the process to end, then end it: SIGTERM, then SIGKILL after `timeout_s`."""
        with contextlib.suppress(OSError):
            self._connection.send(None)
        self._process.join(timeout_s)
        stop_process(self._process, timeout_s)
        self._connection.close()

    def _exited(self) -> PoolingProcessFailed:
        return _exited(self._process, self.model.name)


def _received(connection: Any, process: BaseProcess, name: str) -> tuple[str, Any]:
    try:
        kind, payload = connection.recv()
    except (EOFError, OSError) as exc:
        raise _exited(process, name) from exc
    return str(kind), payload


def _exited(process: BaseProcess, name: str) -> PoolingProcessFailed:
    process.join(1.0)
    return PoolingProcessFailed(
        f"the process of pooling model {name} exited (exit code {process.exitcode}); the worker's log "
        "may say why"
    )


# --- in the child -------------------------------------------------------------------------------


def _pooling_main(
    connection: Any,
    environ: dict[str, str],
    cpu_threads: str | None,
    model: ModelConfig,
    forked: bool,
    batch_socket: str,
) -> None:
    """The child's life: become the model's process, load it, then answer batches until told to end."""
    from workers.engines.fork_server import become_engine_process

    become_engine_process(environ, cpu_threads, forked=forked, title=f"switchboard::pooling::{model.name}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the worker, which stops this
    runner = PoolingRunner(model)
    try:
        loaded = runner.load()
        listener = _listen(batch_socket)
    except Exception as exc:
        connection.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    # The model and the runtime live as long as this process: full collections need not walk them.
    gc_heap.freeze_long_lived()
    computing = threading.Lock()
    threading.Thread(
        target=_serve_triton, args=(listener, runner, computing), name="triton-batches", daemon=True
    ).start()
    connection.send(("loaded", loaded))
    while True:
        try:
            rows = connection.recv()
        except (EOFError, OSError):
            return  # the worker is gone
        if rows is None:
            return
        try:
            with computing:
                answers = runner.pool_now(rows)
        except Exception as exc:
            connection.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        connection.send(("pooled", answers))


def _listen(path: str) -> Listener:
    """Listen at `path` (in the worker's private folder), replacing a socket a process before this one left."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return Listener(path, family="AF_UNIX")


def _serve_triton(listener: Listener, runner: PoolingRunner, computing: threading.Lock) -> None:
    """Answer the batches of Triton's stubs, one connection per model instance, each on a thread of
    its own (a stub that replaces one connects anew); `computing` lets one batch compute at a time."""
    while True:
        try:
            stub = listener.accept()
        except OSError:
            return
        threading.Thread(
            target=_serve_stub, args=(stub, runner, computing), name="triton-stub", daemon=True
        ).start()


def _serve_stub(stub: Connection, runner: PoolingRunner, computing: threading.Lock) -> None:
    """One stub's batches, each answered in turn, until it closes its connection."""
    with contextlib.closing(stub):
        while True:
            try:
                message = stub.recv_bytes()
                answer = _answered(message, runner, computing)
                stub.send_bytes(answer)
            except (EOFError, OSError):
                return  # the stub has ended: unloaded, or died (then its batch failed with it)


def _answered(message: bytes, runner: PoolingRunner, computing: threading.Lock) -> bytes:
    """A batch's reply: every row's encoded answer (or refusal), or why the batch failed."""
    try:
        rows = decoded_rows(unframe(message))
        with computing:
            answers = runner.pool_now(rows)
    except Exception as exc:
        return FAILED + f"{type(exc).__name__}: {exc}".encode()
    return OK + frame(row_encoder.encode(answer_of(answer)) for answer in answers)
