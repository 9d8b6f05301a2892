"""A pooling job's one last chunk → the endpoint's answer: embeddings, classes, or reranked documents.

A pooling job is never streamed: the handler waits for its last chunk, which holds one row per input
in input order (little-endian float32 values, `switchboard.wire.Chunk.pooled`) and the usage. A base64
embedding is that row as it came; floats are decoded only for the answers that need numbers.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import AsyncIterator, Sequence

from router.openai.classify import Classification, ClassificationList, PoolingUsage
from router.openai.embeddings import Embedding, EmbeddingList, EmbeddingRequest, EmbeddingUsage
from router.openai.errors import EngineError
from router.openai.rerank import RerankDocument, RerankResponse, RerankResult, RerankUsage
from router.relay.sse import error_for
from switchboard.wire import Chunk, Job

_FLOAT32 = 4


class PooledAnswer:
    """The rows of a pooling job's answer, checked against its inputs, and the tokens it read."""

    def __init__(self, rows: Sequence[bytes], labels: Sequence[str], prompt_tokens: int) -> None:
        self.rows = rows
        self.labels = labels
        self.prompt_tokens = prompt_tokens

    def floats(self, row: bytes) -> list[float]:
        """One row's values."""
        return list(struct.unpack(f"<{len(row) // _FLOAT32}f", row))


async def pooled_answer(chunks: AsyncIterator[Chunk], job: Job, model: str) -> PooledAnswer:
    """The job's answer, once its last chunk came; the job's error (a worker's `invalid_request` is
    the client's 400) raised, and a 500 for an answer that does not match the inputs."""
    async for chunk in chunks:
        if chunk.error is not None:
            raise error_for(chunk.error, model)
        if chunk.is_last:
            return _checked(chunk, job)
    raise EngineError(f"The worker ended job {job.id} without its answer.")


def _checked(chunk: Chunk, job: Job) -> PooledAnswer:
    inputs = len(job.pooling.inputs) if job.pooling is not None else 0
    if len(chunk.pooled) != inputs or any(len(row) % _FLOAT32 or not row for row in chunk.pooled):
        raise EngineError(
            f"The worker answered job {job.id} with {len(chunk.pooled)} rows for {inputs} inputs, "
            "or with a row that is not float32 values."
        )
    prompt_tokens = chunk.usage.prompt_tokens if chunk.usage is not None else 0
    return PooledAnswer(chunk.pooled, chunk.labels, prompt_tokens)


def embedding_list(answer: PooledAnswer, request: EmbeddingRequest) -> EmbeddingList:
    """OpenAI's embeddings response, floats or base64 as the request asked."""
    data = [
        Embedding(
            index=index,
            embedding=(
                base64.b64encode(row).decode("ascii")
                if request.encoding_format == "base64"
                else answer.floats(row)
            ),
        )
        for index, row in enumerate(answer.rows)
    ]
    usage = EmbeddingUsage(prompt_tokens=answer.prompt_tokens, total_tokens=answer.prompt_tokens)
    return EmbeddingList(data=data, model=request.model, usage=usage)


def classification_list(answer: PooledAnswer, job: Job, model: str) -> ClassificationList:
    """vLLM's classification response: each input's most probable label and every label's probability."""
    data = []
    for index, row in enumerate(answer.rows):
        probs = answer.floats(row)
        best = max(range(len(probs)), key=probs.__getitem__)
        label = answer.labels[best] if best < len(answer.labels) else None
        data.append(Classification(index=index, label=label, probs=probs, num_classes=len(probs)))
    return ClassificationList(
        id=f"classify-{job.id}",
        created=int(job.created),
        model=model,
        data=data,
        usage=PoolingUsage(prompt_tokens=answer.prompt_tokens, total_tokens=answer.prompt_tokens),
    )


def rerank_response(
    answer: PooledAnswer,
    job: Job,
    model: str,
    *,
    documents: Sequence[str],
    top_n: int,
    return_documents: bool,
) -> RerankResponse:
    """The rerank response: documents by relevance, most relevant first (ties in request order),
    the first `top_n` (0: all)."""
    results = [
        RerankResult(
            index=index,
            relevance_score=answer.floats(row)[0],
            document=RerankDocument(text=documents[index]) if return_documents else None,
        )
        for index, row in enumerate(answer.rows)
    ]
    results.sort(key=lambda result: -result.relevance_score)
    if top_n:
        results = results[:top_n]
    return RerankResponse(
        id=f"rerank-{job.id}",
        model=model,
        usage=RerankUsage(prompt_tokens=answer.prompt_tokens, total_tokens=answer.prompt_tokens),
        results=results,
    )
