"""The pooling endpoints' front-door scenarios: their models, and a worker's part played on Redis.

The worker's part writes what a pooling worker writes (`switchboard.wire.Chunk.pooled`): one last
chunk with a little-endian float32 row per input, the classifier's labels and the usage.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import numpy
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig, Settings
from switchboard.wire import Chunk, Job, Usage, job_decoder
from tests.support.front_door_harness import MODEL, settings_for, write_chunks

EMBEDDER = "embedder"
# An embedder trained to be cut to 4 or 8 dimensions, and one whose vectors are whole only.
WHOLE_EMBEDDER = "whole-embedder"
# And one that may be cut to any size up to its own.
ANY_SIZE_EMBEDDER = "any-size-embedder"
CLASSIFIER = "classifier"
RERANKER = "reranker"
LABELS = ("negative", "neutral", "positive")
POOLING_MODELS = [
    ModelConfig(name=MODEL, path="/nonexistent"),
    ModelConfig(name=EMBEDDER, path="/nonexistent", kind="embed", matryoshka_dimensions=[4, 8]),
    ModelConfig(name=WHOLE_EMBEDDER, path="/nonexistent", kind="embed"),
    ModelConfig(name=ANY_SIZE_EMBEDDER, path="/nonexistent", kind="embed", matryoshka_dimensions=[]),
    ModelConfig(name=CLASSIFIER, path="/nonexistent", kind="classify"),
    ModelConfig(name=RERANKER, path="/nonexistent", kind="score"),
]
ALL_MODELS = [model.name for model in POOLING_MODELS]

Answer = Callable[[Job], Chunk]


def pooling_settings(redis_url: str, timeout_s: float = 10.0) -> Settings:
    """A front door routing a generator and one model of each pooling kind."""
    return settings_for(redis_url, timeout_s, models=list(POOLING_MODELS))


def rows(*values: Sequence[float]) -> tuple[bytes, ...]:
    """Rows as a worker writes them: little-endian float32 bytes."""
    return tuple(numpy.asarray(row, dtype="<f4").tobytes() for row in values)


def answer_rows(*values: Sequence[float], prompt_tokens: int = 7, labels: tuple[str, ...] = ()) -> Answer:
    """Answer every job with these rows (one per input), `labels` and `prompt_tokens`."""
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=0)
    return lambda job: Chunk(pooled=rows(*values), labels=labels, usage=usage)


@contextlib.asynccontextmanager
async def pooling_worker(
    redis: aioredis.Redis, model: str, answer: Answer | None
) -> AsyncIterator[list[Job]]:
    """Read every job queued for `model` (no consumer group: nothing is taken from the stream) and,
    unless `answer` is None, write its answer; yields the jobs seen."""
    seen: list[Job] = []

    async def loop() -> None:
        last_id: bytes | str = "0-0"
        while True:
            response: Any = await redis.xread({keys.job_stream(model): last_id}, block=100)
            for _, entries in response or ():
                for entry_id, fields in entries:
                    last_id = entry_id
                    job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                    seen.append(job)
                    if answer is not None:
                        await write_chunks(redis, job.id, answer(job))

    task = asyncio.create_task(loop())
    try:
        yield seen
    finally:
        task.cancel()
        await asyncio.wait([task], timeout=5)


async def queued_jobs(redis: aioredis.Redis) -> int:
    """Jobs on every configured model's stream."""
    return sum([await redis.xlen(keys.job_stream(name)) for name in ALL_MODELS])
