"""A pooling job's last chunk into its answer: rows checked against the inputs, ties kept in order."""

from __future__ import annotations

from collections.abc import AsyncIterator

import numpy
import pytest

from router.intake.job import pooling_job
from router.openai.errors import EngineError, InvalidRequestError
from router.relay.pooled import pooled_answer, rerank_response
from switchboard.wire import Chunk, JobError, PoolingTask, Usage


def row(*values: float) -> bytes:
    return numpy.asarray(values, dtype="<f4").tobytes()


async def chunks_of(*chunks: Chunk) -> AsyncIterator[Chunk]:
    for chunk in chunks:
        yield chunk


JOB = pooling_job("ranker", PoolingTask(task="score", inputs=("a", "b", "c"), query="q"), timeout_s=5)
USAGE = Usage(prompt_tokens=3, completion_tokens=0)


@pytest.mark.parametrize(
    "pooled",
    [(row(0.5),) * 2, (row(0.5),) * 4, (row(0.5), row(0.5), b"\x00\x00"), (row(0.5), row(0.5), b"")],
    ids=["too few rows", "too many rows", "not float32", "empty row"],
)
async def test_an_answer_that_does_not_match_the_inputs_is_our_500(pooled: tuple[bytes, ...]) -> None:
    with pytest.raises(EngineError):
        await pooled_answer(chunks_of(Chunk(pooled=pooled, usage=USAGE)), JOB, "ranker")


async def test_a_workers_refusal_is_the_clients_400() -> None:
    refusal = JobError(code="invalid_request", message="token id 9 is outside", param="input")
    with pytest.raises(InvalidRequestError, match="token id 9"):
        await pooled_answer(chunks_of(Chunk(error=refusal)), JOB, "ranker")


async def test_equal_scores_keep_the_documents_order() -> None:
    chunk = Chunk(pooled=(row(0.5), row(0.9), row(0.5)), usage=USAGE)
    answer = await pooled_answer(chunks_of(chunk), JOB, "ranker")
    response = rerank_response(
        answer, JOB, "ranker", documents=("a", "b", "c"), top_n=0, return_documents=True
    )
    assert [result.index for result in response.results] == [1, 0, 2]
