"""The Triton model for one engine: a decoupled callable that takes a Job and streams Chunks.

PyTriton runs this callable on its own event loop thread, while the engine lives on the worker's
main loop; a pump task on the engine's loop forwards deltas across, and the coalescer on this side
groups those that arrive together. The job and the chunks keep their wire encoding end to end, so
the consumer appends Triton's output to Redis as it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from concurrent.futures import Future

import numpy as np
import numpy.typing as npt

from switchboard.wire import Chunk, Job, JobError, Usage, encode, job_decoder
from workers.coalesce import coalesce
from workers.engines.base import Delta, Engine, EngineRequest, InvalidEngineRequest

logger = logging.getLogger(__name__)

JOB_INPUT = "job"
CHUNK_OUTPUT = "chunk"

Responses = list[dict[str, npt.NDArray[np.object_]]]


def chunk_for(delta: Delta) -> Chunk:
    """The wire chunk for a (merged) delta; the final one carries usage."""
    if delta.finish_reason is None:
        return Chunk(text=delta.text)
    usage = Usage(prompt_tokens=delta.prompt_tokens, completion_tokens=delta.completion_tokens)
    return Chunk(text=delta.text, finish_reason=delta.finish_reason, usage=usage)


def engine_request(job: Job) -> EngineRequest:
    """What the engine needs of a job."""
    return EngineRequest(request_id=job.id, sampling=job.sampling, messages=job.messages, prompt=job.prompt)


class EngineCallable:
    """Triton infer function: one request in, a stream of coalesced chunks out."""

    def __init__(
        self, engine: Engine, engine_loop: asyncio.AbstractEventLoop, coalesce_window_s: float
    ) -> None:
        self._engine = engine
        self._engine_loop = engine_loop
        self._window_s = coalesce_window_s

    async def __call__(self, requests: list[object]) -> AsyncIterator[Responses]:
        """Decoupled inference: yields one response per coalesced chunk, the last one final."""
        (request,) = requests  # batching is off for decoupled models: one request per call
        job = job_decoder.decode(request[JOB_INPUT][0])  # type: ignore[index]
        queue: asyncio.Queue[Delta | BaseException] = asyncio.Queue()
        pump = asyncio.run_coroutine_threadsafe(
            self._pump(engine_request(job), queue, asyncio.get_running_loop()), self._engine_loop
        )
        try:
            async for delta in coalesce(queue, self._window_s):
                yield _response(chunk_for(delta))
        except InvalidEngineRequest as exc:
            yield _response(Chunk(error=JobError(code="invalid_request", message=str(exc))))
        except Exception as exc:
            logger.exception("generation failed", extra={"job_id": job.id, "model": job.model})
            yield _response(Chunk(error=JobError(code="engine_error", message=f"generation failed: {exc}")))
        finally:
            _cancel(pump)

    async def _pump(
        self,
        request: EngineRequest,
        queue: asyncio.Queue[Delta | BaseException],
        target: asyncio.AbstractEventLoop,
    ) -> None:
        """Runs on the engine's loop: forward every delta (or the error) to the callable's loop."""
        try:
            async for delta in self._engine.generate(request):
                target.call_soon_threadsafe(queue.put_nowait, delta)
        except Exception as exc:
            target.call_soon_threadsafe(queue.put_nowait, exc)


def _response(chunk: Chunk) -> Responses:
    return [{CHUNK_OUTPUT: np.array([encode(chunk)], dtype=np.object_)}]


def _cancel(pump: Future[None]) -> None:
    # Cancelling the pump closes the engine's stream, which aborts the request in the engine.
    if not pump.done():
        pump.cancel()
