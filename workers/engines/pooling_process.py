"""A pooling model's own process: the runner computes there, the worker sends it batches over a pipe.

In the worker's process the runner's Python glue between torch's kernels (a few hundred calls per
forward pass of even a tiny BERT) needed the GIL the worker's event loop holds most of the time
under load: a batch of 7 rows took 5.5 ms alone and 11-12 ms beside a thread busy with Python 60 %
of the time, on cores of their own. In a process of its own the runner has its interpreter to
itself, as vLLM's model runner has beside its API server.

The child is forked from the worker's fork server (`forked_core`), which imported torch and
transformers once, so a load costs the model's files, not the imports; with `engine_process =
"spawn"` it starts afresh instead. Its first message says what it loaded (`LoadedModel`) or why it
could not; then it answers one batch at a time, in order. It ends when the worker closes the pipe or
sends None, and with the fork server (or the worker) when that ends.

Batches are sent without waiting for the answer before them: the next batch is in the pipe while the
child computes one, so the child goes from batch to batch without waiting for the worker's threads
(each needs the GIL of a busy worker to read an answer and send the next; waiting for them, the child
computed only half of the time at 32 clients). A thread of its own reads the answers, in the order
the batches went, and hands each to its batch's future.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
from collections import deque
from concurrent.futures import Future, InvalidStateError
from multiprocessing.process import BaseProcess
from typing import Any

from switchboard.config import EngineProcess, ModelConfig
from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingRow
from workers.engines.process_env import stop_process
from workers.engines.torch_pooling_runner import LoadedModel, PoolingRunner

Answers = list[PooledRow | InvalidEngineRequest]


class PoolingProcessFailed(RuntimeError):
    """The pooling process could not load its model, failed a batch, or exited."""


class BatchNotComputed(PoolingProcessFailed):
    """The process exited with this batch waiting behind the one it computed: another may compute it."""


class PoolingProcess:
    """The worker's end of one pooling model's process. `submit` and `stop` block: call them off the
    event loop."""

    def __init__(
        self, model: ModelConfig, process: BaseProcess, connection: Any, loaded: LoadedModel
    ) -> None:
        self.model = model
        self.loaded = loaded
        self._process = process
        self._connection = connection
        # The futures of the batches sent and not answered yet, in the order they were sent.
        self._in_flight: deque[Future[Answers]] = deque()
        self._in_flight_lock = threading.Lock()
        # Set by the answers' reader once the pipe has ended: nothing more is sent.
        self._ended = False
        # A batch is sent whole before the next (its bytes must not interleave with another's).
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(
            target=self._read_answers, name=f"pooling-{model.name}-answers", daemon=True
        )
        self._reader.start()

    @classmethod
    def launch(cls, model: ModelConfig, *, cpu_threads: str | None, start: EngineProcess) -> PoolingProcess:
        """Start the model's process and wait until it has loaded the model (or failed to)."""
        if start == "fork":
            from workers.engines.forked_core import start_fork_server

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
            args=(child_end, dict(os.environ), cpu_threads, model, start == "fork"),
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
    def exited(self) -> bool:
        """Whether the process has ended (killed, or out of memory)."""
        return self._ended or not self._process.is_alive()

    def submit(self, rows: list[PoolingRow], answered: Future[Answers]) -> None:
        """Send a batch to the process; `answered` gets each row's answer (or its refusal) once the
        process has computed it, or PoolingProcessFailed if it failed the batch or exited computing
        it, or BatchNotComputed if it exited before it came to the batch."""
        # Batches are in flight in the order they are sent, which is the order the answers come.
        with self._send_lock:
            with self._in_flight_lock:
                if self._ended:
                    settle(answered, BatchNotComputed(f"the process of {self.model.name} has ended"))
                    return
                self._in_flight.append(answered)
            try:
                self._connection.send(rows)
            except OSError:
                pass  # the process is gone, which ends the pipe: the reader fails the batch then
            except BaseException as exc:
                # Not sent at all (it could not be pickled): no answer will come for it.
                with self._in_flight_lock:
                    self._in_flight.remove(answered)
                settle(answered, exc)

    def stop(self, timeout_s: float) -> None:
        """Ask the process to end once it has answered the batches sent, then end it: SIGTERM, then
        SIGKILL after `timeout_s`."""
        with self._send_lock, contextlib.suppress(OSError):
            self._connection.send(None)
        self._process.join(timeout_s)
        stop_process(self._process, timeout_s)
        self._connection.close()
        self._reader.join(timeout_s)

    def _read_answers(self) -> None:
        """On the reader's thread: each answer to the oldest batch in flight, until the pipe ends."""
        while True:
            try:
                kind, payload = self._connection.recv()
            except (EOFError, OSError):
                break
            with self._in_flight_lock:
                answered = self._in_flight.popleft() if self._in_flight else None
            if answered is None:
                continue  # not one of ours: nothing was sent for it
            if kind == "pooled":
                settle(answered, payload)
            else:
                settle(answered, PoolingProcessFailed(f"{self.model.name} failed a batch: {payload}"))
        self._fail_in_flight()

    def _fail_in_flight(self) -> None:
        """The pipe ended: the batch the process was computing fails with it; those behind it were
        never started, and say so, so that they may be sent again."""
        with self._in_flight_lock:
            self._ended = True
            waiting, self._in_flight = list(self._in_flight), deque()
        if not waiting:
            return
        exited = self._exited()
        settle(waiting[0], exited)
        for answered in waiting[1:]:
            settle(answered, BatchNotComputed(str(exited)))

    def _exited(self) -> PoolingProcessFailed:
        return _exited(self._process, self.model.name)


def settle(answered: Future[Answers], outcome: Answers | BaseException) -> None:
    """Give a batch's future its answers or its error, unless its caller gave up on it (cancelled)."""
    try:
        if isinstance(outcome, BaseException):
            answered.set_exception(outcome)
        else:
            answered.set_result(outcome)
    except InvalidStateError:
        pass  # cancelled: nobody waits for it


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
    connection: Any, environ: dict[str, str], cpu_threads: str | None, model: ModelConfig, forked: bool
) -> None:
    """The child's life: become the model's process, load it, then answer batches until told to end."""
    from workers.engines.forked_core import become_engine_process

    become_engine_process(environ, cpu_threads, forked=forked, title=f"switchboard::pooling::{model.name}")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the worker, which stops this
    runner = PoolingRunner(model)
    try:
        loaded = runner.load()
    except Exception as exc:
        connection.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    connection.send(("loaded", loaded))
    while True:
        try:
            rows = connection.recv()
        except (EOFError, OSError):
            return  # the worker is gone
        if rows is None:
            return
        try:
            answers = runner.pool_now(rows)
        except Exception as exc:
            connection.send(("error", f"{type(exc).__name__}: {exc}"))
            continue
        connection.send(("pooled", answers))
