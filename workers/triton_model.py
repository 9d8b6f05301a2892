"""The Triton model for one engine: a decoupled callable that takes a Job and streams Chunks.

PyTriton runs this callable on its own event loop thread, and the engine is driven from there; a
pump task moves the engine's deltas into a queue, and the coalescer groups those that arrive
together. The job and the chunks keep their wire encoding end to end, so
the consumer appends Triton's output to Redis as it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt

from switchboard.wire import Chunk, Job, JobError, Usage, encode, job_decoder
from workers.coalesce import coalesce
from workers.engines.base import Delta, Engine, EngineRequest, InvalidEngineRequest

logger = logging.getLogger(__name__)

JOB_INPUT = "job"
CHUNK_OUTPUT = "chunk"

Responses = list[dict[str, npt.NDArray[np.object_]]]
T = TypeVar("T")


def chunk_for(delta: Delta) -> Chunk:
    """The wire chunk for a (merged) delta; the final one carries usage."""
    if delta.finish_reason is None:
        return Chunk(text=delta.text)
    usage = Usage(prompt_tokens=delta.prompt_tokens, completion_tokens=delta.completion_tokens)
    return Chunk(text=delta.text, finish_reason=delta.finish_reason, usage=usage)


def engine_request(job: Job) -> EngineRequest:
    """What the engine needs of a job."""
    return EngineRequest(request_id=job.id, sampling=job.sampling, messages=job.messages, prompt=job.prompt)


class CoalescingPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How long a stream's chunk may wait for more tokens, given how many streams are running.

    A chunk costs the same at every hop whatever it carries, so the model's total chunk rate is
    what costs CPU. One stream keeps the shortest window; as streams are added the window widens so
    that all of them together send at most `max_chunks_per_s`, up to `max_window_s`.
    """

    min_window_s: float
    max_window_s: float
    max_chunks_per_s: float

    def window_s(self, streams: int) -> float:
        """The window for each of `streams` concurrent streams."""
        return min(self.max_window_s, max(self.min_window_s, streams / self.max_chunks_per_s))


class EngineCallable:
    """Triton infer function: one request in, a stream of coalesced chunks out.

    The engine is driven from PyTriton's own event loop (the thread that calls this), so deltas
    reach the coalescer without crossing threads; `abort` is the only way in from elsewhere.
    """

    def __init__(self, engine: Engine, policy: CoalescingPolicy) -> None:
        self._engine = engine
        self._policy = policy
        self._streams = 0
        self._loop: asyncio.AbstractEventLoop | None = None

    async def __call__(self, requests: list[object]) -> AsyncIterator[Responses]:
        """Decoupled inference: yields one response per coalesced chunk, the last one final."""
        (request,) = requests  # batching is off for decoupled models: one request per call
        job = job_decoder.decode(request[JOB_INPUT][0])  # type: ignore[index]
        queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
        pump = asyncio.create_task(self._pump(engine_request(job), queue))
        self._streams += 1
        try:
            async for delta in coalesce(queue, self._window_s):
                yield _response(chunk_for(delta))
        except InvalidEngineRequest as exc:
            yield _response(Chunk(error=JobError(code="invalid_request", message=str(exc))))
        except Exception as exc:
            logger.exception("generation failed", extra={"job_id": job.id, "model": job.model})
            yield _response(Chunk(error=JobError(code="engine_error", message=f"generation failed: {exc}")))
        finally:
            self._streams -= 1
            # Cancelling the pump closes the engine's stream, which aborts the request in the engine.
            pump.cancel()

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop that PyTriton calls this model on; the engine is driven from it alone."""
        self._loop = loop

    def on_engine_loop(self, work: Callable[[], Coroutine[Any, Any, T]]) -> Future[T]:
        """Run `work()` on the engine's loop from any thread (abort, stop, sleep, wake).

        vLLM's output task lives on the loop its first request ran on, so every call that touches
        the engine after that runs there too.
        """
        if self._loop is None or self._loop.is_closed():
            raise RuntimeError("the model is not bound into Triton")
        return asyncio.run_coroutine_threadsafe(work(), self._loop)

    def abort(self, request_id: str) -> Future[None]:
        """Abort a running request; its stream ends with finish reason "abort"."""
        return self.on_engine_loop(lambda: self._engine.abort(request_id))

    async def stop_engine(self) -> None:
        """Stop the engine on the loop that drives it (or here, if it was never bound)."""
        if self._loop is None or self._loop.is_closed():
            await self._engine.stop()
            return
        await asyncio.wrap_future(self.on_engine_loop(self._engine.stop))

    def _window_s(self) -> float:
        return self._policy.window_s(self._streams)

    async def _pump(self, request: EngineRequest, queue: asyncio.Queue[Delta | BaseException]) -> None:
        """Move deltas into the queue the coalescer waits on (it may time out; the engine must not)."""
        try:
            async for delta in self._engine.generate(request):
                queue.put_nowait(delta)
        except Exception as exc:
            queue.put_nowait(exc)


def _response(chunk: Chunk) -> Responses:
    return [{CHUNK_OUTPUT: np.array([encode(chunk)], dtype=np.object_)}]
