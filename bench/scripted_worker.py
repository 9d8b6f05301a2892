"""The scripted worker of `front_door_path.py`: takes every job of the model's stream, answers it at once.

It is the tests' scripted worker (`tests.support.scripted_models`): it takes jobs with XREADGROUP, as a
worker's consumer does, and answers each with `chunks` chunks, handed together to the worker's own
result writer (`switchboard/lua/append_chunk.lua`, the last one acknowledging the job), while it
advertises itself with a heartbeat record holding the model warm. Run in a process of its own
(`run_scripted_worker`), so that its CPU is not the front door's.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import redis.asyncio as aioredis

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from switchboard.wire import Chunk, Job, Usage  # noqa: E402
from tests.support.scripted_models import Scripted, scripted_models  # noqa: E402

MODEL = "tiny"
WORKER_ID = "scripted-worker"


def answer_chunks(chunks: int, tokens: int) -> list[Chunk]:
    """The chunks of every answer: `tokens` words over `chunks` chunks, the last with usage."""
    per_chunk = max(1, tokens // chunks)
    texts = ["word " * per_chunk] * chunks
    last = Chunk(
        text=texts[-1], finish_reason="length", usage=Usage(prompt_tokens=8, completion_tokens=tokens)
    )
    return [*(Chunk(text=text) for text in texts[:-1]), last]


async def scripted_worker(redis_url: str, chunks: int, tokens: int) -> None:
    """Take every job of the model's stream and answer it at once, as `workers/jobs` would."""
    redis = aioredis.Redis.from_url(redis_url)
    answer = Scripted(answer_chunks(chunks, tokens))

    def script(model: str, job: Job) -> Scripted:
        return answer

    async with scripted_models(redis, [MODEL], script, holder=WORKER_ID):
        await asyncio.Event().wait()  # until the benchmark ends the process


def run_scripted_worker(redis_url: str, chunks: int, tokens: int) -> None:
    asyncio.run(scripted_worker(redis_url, chunks, tokens))
