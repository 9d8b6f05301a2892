"""The Triton model for one pooling engine: batched and decoupled; rows in, one answer per row out.

Each request is one job (or a part of a job larger than a batch): its inputs are rows along the
batch dimension, each a msgpack `PoolingRow`. Triton's dynamic batcher groups the requests that
arrive within its window; the callable gets them all, runs every row as one `pool` call, and gives
each request exactly its own rows' answers back, in order (a `RowAnswer` each: the row's values and
tokens, or why the model refused it). A refusal answers its row only; the engine failing fails the
batch's requests. Decoupled only so that Triton's one instance of the model takes the next batch while
the engine computes this one: every request gets exactly one answer.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

import msgspec
import numpy as np
import numpy.typing as npt
from pytriton.proxy.types import Request

from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingEngine, PoolingRow
from workers.runtime.pooling_metrics import (
    POOLING_BATCH_ROWS,
    POOLING_BATCHER_WAIT,
    POOLING_INPUT_TOKENS,
    POOLING_REQUESTS,
    POOLING_ROWS,
)

ROWS_INPUT = "rows"
ANSWERS_OUTPUT = "answers"
# When the worker's client sent the request (time.time_ns()): the callable measures the time it was
# held in Triton's batcher from it.
SENT_PARAMETER = "sent_ns"

T = TypeVar("T")


class RowAnswer(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """One row's answer as it crosses Triton: little-endian float32 values and the row's tokens, or
    the model's refusal of the row (`error`, with the parameter at fault and OpenAI's code)."""

    values: bytes = b""
    prompt_tokens: int = 0
    error: str | None = None
    param: str | None = None
    code: str | None = None


row_encoder = msgspec.msgpack.Encoder()
row_decoder = msgspec.msgpack.Decoder(PoolingRow)
answer_decoder = msgspec.msgpack.Decoder(RowAnswer)


def answer_of(result: PooledRow | InvalidEngineRequest) -> RowAnswer:
    """A row's answer, or its refusal, as it crosses Triton."""
    if isinstance(result, InvalidEngineRequest):
        return RowAnswer(error=str(result), param=result.param, code=result.code)
    return RowAnswer(values=result.values, prompt_tokens=result.prompt_tokens)


class PoolingCallable:
    """Triton infer function of a pooling model: every request of a batch in one engine call.

    Has the face the model's slot uses of a generator's `EngineCallable` (the loop it runs on, abort,
    stopping the engine), so that a pooling model is loaded, kept and unloaded the same way.
    """

    def __init__(self, engine: PoolingEngine) -> None:
        self._engine = engine
        self._loop: asyncio.AbstractEventLoop | None = None
        model = engine.model.name
        self._batch_rows = POOLING_BATCH_ROWS.labels(model)
        self._batcher_wait = POOLING_BATCHER_WAIT.labels(model)
        self._requests = POOLING_REQUESTS.labels(model)
        self._rows = POOLING_ROWS.labels(model)
        self._tokens = POOLING_INPUT_TOKENS.labels(model)

    async def __call__(self, requests: list[Request]) -> list[dict[str, npt.NDArray[np.object_]]]:
        """Each request's answers, its rows pooled together with every other request's."""
        arrived_ns = time.time_ns()
        rows_of = [
            [row_decoder.decode(bytes(element)) for element in request[ROWS_INPUT].reshape(-1)]
            for request in requests
        ]
        for request in requests:
            sent_ns = (request.parameters or {}).get(SENT_PARAMETER)
            if isinstance(sent_ns, int):
                self._batcher_wait.observe(max(0, arrived_ns - sent_ns) / 1e9)
        rows = [row for own in rows_of for row in own]
        self._batch_rows.observe(len(rows))
        results = await self._engine.pool(rows)
        answers = [answer_of(result) for result in results]
        self._requests.inc(len(requests))
        self._rows.inc(len(rows))
        self._tokens.inc(sum(answer.prompt_tokens for answer in answers))
        responses = []
        start = 0
        for own in rows_of:
            mine = answers[start : start + len(own)]
            start += len(own)
            encoded = np.empty((len(mine), 1), dtype=np.object_)
            for index, answer in enumerate(mine):
                encoded[index, 0] = row_encoder.encode(answer)
            responses.append({ANSWERS_OUTPUT: encoded})
        return responses

    # --- the face a model slot uses -----------------------------------------------------------

    def attach_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop that PyTriton calls this model on."""
        self._loop = loop

    def on_engine_loop(self, work: Callable[[], Coroutine[Any, Any, T]]) -> Future[T]:
        """Run `work()` on the model's loop from any thread."""
        if self._loop is None or self._loop.is_closed():
            raise RuntimeError("the model is not bound into Triton")
        return asyncio.run_coroutine_threadsafe(work(), self._loop)

    def abort(self, job_id: str, *, arriving: bool = False) -> Future[None]:
        """Nothing to abort: a pooling job is one engine call, over in milliseconds. (Its client having
        left, the consumer acknowledges it without writing its answer.)"""
        done: Future[None] = Future()
        done.set_result(None)
        return done

    async def stop_engine(self) -> None:
        """Stop the engine (its thread ends once a call in progress has)."""
        await self._engine.stop()

    def end_output_streams(self) -> None:
        """A pooling model has no output stream: every request is answered on its own."""
