"""A pooling model's rows and answers as they cross Triton, and the bound model a slot holds.

Each Triton request is one job (or a part of a job larger than a batch): its inputs are rows along
the batch dimension, each a msgpack `PoolingRow`. Triton's dynamic batcher groups the requests that
arrive within its window; its stub hands the batch to the model's process
(`workers.triton.pooling.backend`), which answers every row (a `RowAnswer` each: the row's values
and tokens, or why the model refused it). A refusal answers its row only; the engine failing fails
the batch's requests.

A rerank's query crosses once per request, not once per row: a row whose query is the row before's
carries none, and takes the row before's when decoded (Triton and the stub keep a request's rows
together and in order). A 9.5 MB query with 2,048 documents was once 19 GB of rows.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine, Iterable, Iterator
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


def encoded_rows(rows: Iterable[PoolingRow]) -> Iterator[bytes]:
    """Rows as they cross Triton, in order: a query only where it is not the row before's."""
    previous: str | None = None
    for row in rows:
        query = row.query
        if query is not None and (query is previous or query == previous):
            row = msgspec.structs.replace(row, query=None)
        previous = query
        yield row_encoder.encode(row)


def decoded_rows(items: Iterable[bytes]) -> list[PoolingRow]:
    """Rows as `encoded_rows` sent them, each score row with its query again (one string, shared)."""
    rows: list[PoolingRow] = []
    query: str | None = None
    for item in items:
        row = row_decoder.decode(item)
        if row.query is not None:
            query = row.query
        elif row.task == "score":
            row = msgspec.structs.replace(row, query=query)
        rows.append(row)
    return rows


def answer_of(result: PooledRow | InvalidEngineRequest) -> RowAnswer:
    """A row's answer, or its refusal, as it crosses Triton."""
    if isinstance(result, InvalidEngineRequest):
        return RowAnswer(error=str(result), param=result.param, code=result.code)
    return RowAnswer(values=result.values, prompt_tokens=result.prompt_tokens)


class PoolingModel:
    """A pooling model bound into Triton, with the face a model slot uses of a generator's
    `GeneratorModel` (abort, stopping the engine, ending output streams), so that a pooling model is
    loaded, kept and unloaded the same way. Triton's stub sends it batches itself
    (`workers.triton.pooling.backend`); nothing in the worker runs per batch."""

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
