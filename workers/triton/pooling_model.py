"""A pooling model's rows and answers as they cross Triton, and the bound model a slot holds.

Each Triton request is one job (or a part of a job larger than a batch): its inputs are rows along
the batch dimension, each a msgpack `PoolingRow`. Triton's dynamic batcher groups the requests that
arrive within its window; its stub hands the batch to the model's process
(`workers.triton.pooling_backend`), which answers every row (a `RowAnswer` each: the row's values
and tokens, or why the model refused it). A refusal answers its row only; the engine failing fails
the batch's requests.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from typing import TYPE_CHECKING, Any, TypeVar

import msgspec

from workers.engines.base import InvalidEngineRequest, PooledRow, PoolingRow

if TYPE_CHECKING:
    from workers.engines.base import PoolingEngine

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


class PoolingModel:
    """A pooling model bound into Triton, with the face a model slot uses of a generator's
    `GeneratorModel` (abort, stopping the engine, ending output streams), so that a pooling model is
    loaded, kept and unloaded the same way. Triton's stub sends it batches itself
    (`workers.triton.pooling_backend`); nothing in the worker runs per batch."""

    def __init__(self, engine: PoolingEngine) -> None:
        self._engine = engine

    def on_engine_loop(self, work: Callable[[], Coroutine[Any, Any, T]]) -> Future[T]:
        """A pooling model has no engine loop to run work on (it never sleeps)."""
        raise RuntimeError("a pooling model has no engine loop: it neither sleeps nor wakes")

    def abort(self, job_id: str, *, arriving: bool = False) -> Future[None]:
        """Nothing to abort: a pooling job is one engine call, over in milliseconds. (Its client having
        left, the consumer acknowledges it without writing its answer.)"""
        done: Future[None] = Future()
        done.set_result(None)
        return done

    async def stop_engine(self) -> None:
        """Stop the engine (its process ends once a batch in progress has)."""
        await self._engine.stop()

    def end_output_streams(self) -> None:
        """A pooling model has no output stream: every request is answered on its own."""
