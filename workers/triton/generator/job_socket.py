"""Where a generator's Triton model hands its requests to the engine's loop: a Unix socket.

Triton's model (the worker's own backend inside tritonserver, `workers.triton.native_backend`, or a
Python-backend stub, `workers.triton.generator.backend`; both called "the stub" below) connects once
as it loads and sends each request as one message; this side serves every request as a task on the
engine's loop and answers with its responses and its end (`GeneratorModel.serve`). The socket lives
in a folder only the worker's user can enter (`workers.runtime.private_runtime`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from workers.triton.generator.backend import END, FAILED, HEADER, JOB, NO_TAG, RESPONSE, message
from workers.triton.generator.engine_thread import EngineThread
from workers.triton.generator.model import GeneratorModel

logger = logging.getLogger(__name__)

# How long opening or closing may wait for the engine's loop.
LOOP_WAIT_S = 10.0


class JobSocket:
    """Serves one model's Triton requests on the engine's loop (a thread of its own)."""

    def __init__(
        self, path: Path, model: GeneratorModel, thread: EngineThread, on_stub_lost: Callable[[], None]
    ) -> None:
        self.path = path
        self._model = model
        self._thread = thread
        self._on_stub_lost = on_stub_lost
        self._stub_may_end = False
        self._server: asyncio.Server | None = None
        self._requests: set[asyncio.Task[None]] = set()
        # Each stub's connection, with the task that reads it: closing ends them (`_close`).
        self._connections: dict[asyncio.StreamWriter, asyncio.Task[Any]] = {}

    @classmethod
    def open(
        cls, path: Path, model: GeneratorModel, name: str, *, on_stub_lost: Callable[[], None]
    ) -> JobSocket:
        """Start the model's engine loop and listen at `path` on it (before Triton loads the model:
        its stub connects as it starts); the model is driven from that loop from now on.

        `on_stub_lost` is called (on the engine's loop) when a stub ends that was not told to:
        Triton does not start a decoupled model's stub again by itself, and fails every request
        sent to the model until it is loaded anew."""
        thread = EngineThread(f"engine-{name}")
        model.attach_loop(thread.loop)
        opened = cls(path, model, thread, on_stub_lost)
        try:
            asyncio.run_coroutine_threadsafe(opened._listen(), thread.loop).result(LOOP_WAIT_S)
        except BaseException:
            thread.stop()
            raise
        return opened

    def expect_stub_end(self) -> None:
        """The model is being unloaded: its stub's end is no loss."""
        self._stub_may_end = True

    def close(self) -> None:
        """From any thread but the loop's: stop listening, end the requests still served (their stub
        has gone or is told so now: its connection is closed) and stop the loop. The engine must have
        been stopped before (`stop_engine`)."""
        self._stub_may_end = True
        if self._thread.loop.is_closed():
            return
        with contextlib.suppress(Exception):
            asyncio.run_coroutine_threadsafe(self._close(), self._thread.loop).result(LOOP_WAIT_S)
        self._thread.stop()

    async def _listen(self) -> None:
        self.path.unlink(missing_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))

    async def _close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for task in list(self._requests):
            task.cancel()
        await asyncio.gather(*self._requests, return_exceptions=True)
        # A stub still connected (the model's load failed, or the worker stops) is hung up on, so
        # that its reader ends at the connection's end, as when a stub goes, and not by a cancel at
        # the loop's stop (which asyncio's server logs as an error in its callback).
        for writer in list(self._connections):
            writer.close()
        await asyncio.gather(*self._connections.values(), return_exceptions=True)
        self.path.unlink(missing_ok=True)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read a stub's requests until it closes the connection; each is served as a task. A stub
        that ends with requests still served has died (Triton waits for every request before it
        unloads a model): nobody can be answered on them, so they are cancelled, and with them
        their jobs' work in the engine (Triton fails them to their clients; a new stub connects anew)."""
        served: set[asyncio.Task[None]] = set()
        reading = asyncio.current_task()
        assert reading is not None
        self._connections[writer] = reading
        try:
            while True:
                length, kind, key, stream, tag = HEADER.unpack(await reader.readexactly(HEADER.size))
                payload = await reader.readexactly(length) if length else b""
                if kind != JOB:
                    logger.warning("the Triton stub sent an unknown message", extra={"kind": kind})
                    continue
                task = asyncio.create_task(
                    self._request(writer, key, payload, stream, None if tag == NO_TAG else tag)
                )
                for tasks in (served, self._requests):
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the stub has ended (its model unloaded, or it died)
        finally:
            self._connections.pop(writer, None)
            for task in served:
                task.cancel()
            with contextlib.suppress(Exception):
                writer.close()
            if not self._stub_may_end:
                logger.warning("the model's Triton stub ended", extra={"requests_failed": len(served)})
                self._on_stub_lost()

    async def _request(
        self, writer: asyncio.StreamWriter, key: int, payload: bytes, stream: int, tag: int | None
    ) -> None:
        """Serve one request: its responses, then its end; a failure ends it with the error."""
        try:
            async for response in self._model.serve(payload, stream=stream, tag=tag):
                writer.write(message(RESPONSE, key, response))
                await writer.drain()  # at once unless the stub falls behind
            ending = message(END, key)
        except asyncio.CancelledError:
            raise
        except ConnectionError:
            return  # its stub has gone: there is nobody to answer
        except Exception as exc:
            logger.exception("a Triton request failed", extra={"key": key})
            ending = message(FAILED, key, f"the request failed: {exc}".encode())
        if not writer.is_closing():
            writer.write(ending)
