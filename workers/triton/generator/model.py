"""What one generator's Triton model does with a request: takes a Job and streams its Chunks.

Triton's model hands each request to the engine's own event loop (`workers.triton.native_backend`
or `workers.triton.generator.backend`, and `workers.triton.generator.job_socket`), and the engine is driven from
there; a pump task moves the engine's deltas into an inbox, and the coalescer groups those that
arrive together. The job and the chunks keep their wire encoding end to end, so the consumer
appends Triton's output to Redis as it is.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import msgspec

from switchboard.config import WorkerConfig
from switchboard.wire import Chunk, JobError, Usage, encode
from workers.engines.base import Adapter, Delta, Engine, EngineRequest, InvalidEngineRequest
from workers.triton.engine_job import EngineJob, engine_job_decoder
from workers.triton.generator.coalesce import DeltaInbox, coalesce
from workers.triton.generator.fan_in import fan_in
from workers.triton.generator.observer import EngineObserver
from workers.triton.generator.output_stream import (
    CLOSE_OUTPUT,
    OPEN_OUTPUT,
    OutputStreams,
    Posted,
    posted_batch_encoder,
)
from workers.triton.generator.token_pace import StreamPace, TokenPace

logger = logging.getLogger(__name__)

T = TypeVar("T")

# Jobs aborted on their way to the engine are remembered until they arrive; the latest so many.
EARLY_ABORTS_KEPT = 1024


def chunk_for(delta: Delta) -> Chunk:
    """The wire chunk for a (merged) delta; the request's last one carries usage."""
    usage = None
    if delta.last:
        usage = Usage(prompt_tokens=delta.prompt_tokens, completion_tokens=delta.completion_tokens)
    return Chunk(
        text=delta.text,
        index=delta.index,
        logprobs=delta.logprobs,
        tool_calls=delta.tool_calls,
        finish_reason=delta.finish_reason,
        usage=usage,
    )


def engine_requests(
    job: EngineJob, *, output_every: int = 1, adapter: Adapter | None = None
) -> list[EngineRequest]:
    """What the engine runs for a job: the conversation, or one request per prompt (each handing
    its output over every `output_every` tokens, see `EngineRequest.output_every`)."""
    if job.prompts is None:
        chat = EngineRequest(
            request_id=job.id,
            sampling=job.sampling,
            messages=job.messages,
            tools=job.tools,
            parse_tool_calls=job.parse_tool_calls,
            images=job.images,
            continuation=job.continuation,
            output_every=output_every,
            cache_salt=job.cache_salt,
            adapter=adapter,
        )
        return [chat]
    if len(job.prompts) == 1:
        only = EngineRequest(
            request_id=job.id,
            sampling=job.sampling,
            prompt=job.prompts[0],
            continuation=job.continuation,
            output_every=output_every,
            cache_salt=job.cache_salt,
            adapter=adapter,
        )
        return [only]
    return [
        EngineRequest(
            request_id=f"{job.id}/{i}",
            sampling=job.sampling,
            prompt=prompt,
            output_every=output_every,
            cache_salt=job.cache_salt,
            adapter=adapter,
        )
        for i, prompt in enumerate(job.prompts)
    ]


class CoalescingPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """How long a stream's chunk may wait for more tokens, given how many streams are running.

    A chunk costs the same at every hop whatever it carries, so the model's total chunk rate is
    what costs CPU. One stream keeps the shortest window; as streams are added the window widens so
    that all of them together send at most `max_chunks_per_s`, up to `max_window_s`.
    """

    min_window_s: float
    max_window_s: float
    max_chunks_per_s: float

    @classmethod
    def of(cls, worker: WorkerConfig) -> CoalescingPolicy:
        """The worker's coalescing settings as the Triton models use them."""
        return cls(
            min_window_s=worker.coalesce_ms / 1000,
            max_window_s=worker.coalesce_max_ms / 1000,
            max_chunks_per_s=worker.max_chunks_per_s,
        )

    def window_s(self, streams: int) -> float:
        """The window for each of `streams` concurrent streams."""
        return min(self.max_window_s, max(self.min_window_s, streams / self.max_chunks_per_s))


class GeneratorModel:
    """A generator's Triton model, worker side: one job per request, its coalesced chunks out on the
    model's output stream.

    A request tagged by the worker's client (`TAG_PARAMETER`) lasts as long as its job and posts
    the job's chunks to the model's output stream (`workers.triton.generator.output_stream`), which the one
    request that opened it (`OPEN_OUTPUT`) answers; an untagged request, as any Triton client sends
    it, gets its chunks as its own responses. Requests arrive on the engine's loop (the thread of
    `workers.triton.generator.engine_thread`) and the engine is driven from it, so deltas reach the
    coalescer without crossing threads; `abort` and the other calls from elsewhere go through
    `on_engine_loop`.
    """

    def __init__(self, engine: Engine, policy: CoalescingPolicy) -> None:
        self._engine = engine
        self._policy = policy
        self._outputs = OutputStreams(gap_s=policy.min_window_s)
        self._streams = 0
        self._pace = TokenPace()
        self._loop: asyncio.AbstractEventLoop | None = None
        # The engine's request ids of each running job (one per prompt), for abort.
        self._running: dict[str, list[str]] = {}
        # Jobs aborted on their way here (the consumer sends a fresh job before it has heard whether
        # its client is still there): they end as they arrive, without reaching the engine.
        self._aborted_early: OrderedDict[str, None] = OrderedDict()
        # The LoRA adapters loaded into the engine, by the model name their jobs carry; touched on
        # the engine's loop only.
        self._adapters: dict[str, Adapter] = {}
        # Adapters unloaded since: a job of one must fail, never be answered by the base.
        self._adapters_gone: set[str] = set()

    async def serve(self, payload: bytes, *, stream: int, tag: int | None) -> AsyncIterator[bytes]:
        """One Triton request of this model (`workers.triton.generator.job_socket` hands them over): a job's
        chunks as its responses, or posted to the output stream `stream` when the job's request is
        tagged, or the output stream's batches when the request opens it."""
        if payload == OPEN_OUTPUT:
            async for batch in self._outputs.of(stream).listen():
                yield posted_batch_encoder.encode(batch)
            return
        if payload == CLOSE_OUTPUT:
            self._outputs.end(stream)
            return
        job = engine_job_decoder.decode(payload)
        if tag is None:
            async for chunk, _ in self._chunks(job):
                yield chunk
            return
        output = self._outputs.of(stream)
        first = True
        async for chunk, last in self._chunks(job):
            output.post(tag, chunk, last=last, urgent=first)
            first = False

    async def _chunks(self, job: EngineJob) -> AsyncIterator[tuple[bytes, bool]]:
        """The job's encoded chunks, coalesced, each with whether it is the last (usage, or an error)."""
        if job.id in self._aborted_early:
            del self._aborted_early[job.id]
            yield (
                encode(Chunk(finish_reason="abort", usage=Usage(prompt_tokens=0, completion_tokens=0))),
                True,
            )
            return
        adapter = self._adapters.get(job.model)
        if adapter is None and job.model in self._adapters_gone:
            # Its adapter left this engine while the job was on its way: never answer as the base.
            message = f"adapter {job.model} is not loaded on this worker any more; retry the request"
            yield encode(Chunk(error=JobError(code="engine_error", message=message))), True
            return
        inbox = DeltaInbox()
        requests_ = engine_requests(
            job, output_every=self._pace.output_every(self._window_s(joining=1)), adapter=adapter
        )
        self._running[job.id] = [r.request_id for r in requests_]
        observer = EngineObserver(job)
        with observer.current():
            pump = asyncio.create_task(self._pump(requests_, job.sampling.n, inbox, observer))
        self._streams += 1
        loop = asyncio.get_running_loop()
        # A job of one choice measures the pace of its tokens (a job of several counts them all).
        single = len(requests_) == 1 and job.sampling.n == 1
        measured = StreamPace(self._pace, loop.time()) if single else None
        try:
            async for deltas in coalesce(inbox, self._window_s):
                if measured is not None:
                    measured.chunk(deltas[-1].completion_tokens, loop.time())
                for delta in deltas:
                    observer.sent()
                    yield encode(chunk_for(delta)), delta.last
        except InvalidEngineRequest as exc:
            error = JobError(code="invalid_request", message=str(exc), param=exc.param, client_code=exc.code)
            yield encode(Chunk(error=error)), True
        except Exception:
            logger.exception("generation failed", extra={"job_id": job.id, "model": job.model})
            # The reason goes to the log; the client gets the job's id to quote.
            message = f"The engine failed while generating (job {job.id}); the worker's log has the reason."
            yield encode(Chunk(error=JobError(code="engine_error", message=message))), True
        finally:
            self._streams -= 1
            self._running.pop(job.id, None)
            # Cancelling the pump closes the engine's streams, which aborts the requests in the engine.
            pump.cancel()
            observer.ended()

    def open_local_output(self, stream: int, deliver: Callable[[list[Posted] | None], None]) -> Future[None]:
        """From any thread: hand the batches of output stream `stream` to `deliver`, in this process.

        For a client in the model's own process (the worker's consumer): its jobs still go through
        Triton, each a request that lasts as long as the job, but their chunks come back as objects
        handed over between two threads, not as responses through Triton's model, tritonserver and
        gRPC (about 0.6 ms of CPU and a millisecond of latency per response, measured by
        `bench/triton_hop.py`). The pacing is the output stream's own. `deliver` is called on the
        model's loop, with None once the stream has ended (the model is being unbound, or the client
        opened a newer stream).
        """

        async def forward() -> None:
            try:
                async for batch in self._outputs.of(stream).listen():
                    deliver(batch)
            finally:
                deliver(None)

        return self.on_engine_loop(forward)

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop that requests arrive on; the engine is driven from it alone."""
        self._loop = loop

    def on_engine_loop(self, work: Callable[[], Coroutine[Any, Any, T]]) -> Future[T]:
        """Run `work()` on the engine's loop from any thread (abort, stop, sleep, wake).

        vLLM's output task lives on the loop its first request ran on, so every call that touches
        the engine after that runs there too.
        """
        if self._loop is None or self._loop.is_closed():
            raise RuntimeError("the model is not bound into Triton")
        return asyncio.run_coroutine_threadsafe(work(), self._loop)

    def abort(self, job_id: str, *, arriving: bool = False) -> Future[None]:
        """Abort a running job; its choices end with finish reason "abort".

        `arriving`: the job may still be on its way here; if so, it ends as soon as it arrives.
        (Only for a job whose client has left: a job aborted for another reason may come back to
        this worker later, put back in line, and must run then.)
        """

        async def abort_all() -> None:
            request_ids = self._running.get(job_id)
            if request_ids is None:
                if arriving:
                    self._remember_early_abort(job_id)
                return
            for request_id in request_ids:
                await self._engine.abort(request_id)

        return self.on_engine_loop(abort_all)

    def load_adapter(self, adapter: Adapter) -> Future[None]:
        """From any thread: load a LoRA adapter into the engine; then the jobs of its model run on it."""

        async def load() -> None:
            await self._engine.load_adapter(adapter)
            self._adapters[adapter.name] = adapter
            self._adapters_gone.discard(adapter.name)

        return self.on_engine_loop(load)

    def unload_adapter(self, name: str) -> Future[None]:
        """From any thread: drop a loaded adapter (its jobs have ended)."""

        async def unload() -> None:
            adapter = self._adapters.pop(name, None)
            self._adapters_gone.add(name)
            if adapter is not None:
                await self._engine.unload_adapter(adapter)

        return self.on_engine_loop(unload)

    def _remember_early_abort(self, job_id: str) -> None:
        self._aborted_early[job_id] = None
        if len(self._aborted_early) > EARLY_ABORTS_KEPT:
            self._aborted_early.popitem(last=False)

    async def stop_engine(self) -> None:
        """Stop the engine on the loop that drives it (or here, if it was never bound), and end the
        output stream's request: Triton waits for every request in flight before it unloads a model."""

        async def stop() -> None:
            await self._engine.stop()
            self._outputs.close()

        if self._loop is None or self._loop.is_closed():
            await stop()
            return
        await asyncio.wrap_future(self.on_engine_loop(stop))

    def end_output_streams(self) -> None:
        """End the output streams' requests, from any thread (the model is being unbound)."""
        if self._loop is None or self._loop.is_closed():
            self._outputs.close()
            return
        self._loop.call_soon_threadsafe(self._outputs.close)

    def _window_s(self, joining: int = 0) -> float:
        return self._policy.window_s(self._streams + joining)

    async def _pump(
        self,
        requests: list[EngineRequest],
        n: int,
        inbox: DeltaInbox,
        observer: EngineObserver,
    ) -> None:
        """Move deltas into the inbox the coalescer takes them from (it may wait; the engine must not)."""
        try:
            if len(requests) == 1:
                async for delta in self._engine.generate(requests[0]):
                    observer.output(delta)
                    inbox.put_nowait(delta)
            else:
                await fan_in(self._engine, requests, n, inbox)
        except Exception as exc:
            inbox.put_nowait(exc)
