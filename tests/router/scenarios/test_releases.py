"""When a request's admission slots are given back: before its answer for a key limited to some
requests at a time (its next request must find the slot free), after it for every other caller (the
answer does not wait for Redis). Real Redis, the front door on a real port; the test plays the worker.

Redis is made to hold every write back (`CLIENT PAUSE ... WRITE`, which the release script is, and
the result stream's read is not) right after the answer's chunk is written: an answer that waits
for its release waits for the pause, one that does not arrives at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.api_keys import digest
from switchboard.config import ApiKey
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Usage, encode
from tests.support.front_door_harness import BODY, MODEL, next_job, serving, settings_for

LIMITED, UNLIMITED = "sb-one-at-a-time", "sb-as-many-as-it-likes"
PAUSE_MS = 2000
ANSWER = Chunk(text="ok", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1))


@pytest.fixture
async def front_door(redis: aioredis.Redis, redis_server: PrivateRedis) -> AsyncIterator[httpx.AsyncClient]:
    settings = settings_for(redis_server.url)
    settings.auth.keys = [
        ApiKey(name="limited", sha256=digest(LIMITED), max_parallel=1),
        ApiKey(name="unlimited", sha256=digest(UNLIMITED)),
    ]
    async with serving(settings) as client:
        yield client


async def answer_then_pause_writes(redis: aioredis.Redis, job_id: str) -> None:
    """The job's answer and a pause of every write, in one round trip: the front door reads the
    answer, and whatever it writes after it waits PAUSE_MS."""
    pipe = redis.pipeline(transaction=False)
    pipe.xadd(keys.result_stream(job_id), {keys.CHUNK_FIELD: encode(ANSWER)})
    pipe.execute_command("CLIENT", "PAUSE", PAUSE_MS, "WRITE")
    await pipe.execute()


async def ask(front_door: httpx.AsyncClient, redis: aioredis.Redis, key: str) -> tuple[httpx.Response, float]:
    """A non-streamed request answered by the test; the seconds from its answer's write to the response."""
    request = asyncio.ensure_future(
        front_door.post("/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {key}"})
    )
    job = await next_job(redis, MODEL)
    answered = time.monotonic()
    await answer_then_pause_writes(redis, job.id)
    response = await request
    return response, time.monotonic() - answered


async def unpaused(redis: aioredis.Redis) -> None:
    await redis.execute_command("CLIENT", "UNPAUSE")


async def test_an_answer_without_a_parallel_limit_does_not_wait_for_its_release(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    try:
        response, seconds = await ask(front_door, redis, UNLIMITED)
        assert response.status_code == 200, response.text
        assert seconds < PAUSE_MS / 1000 / 2, "the answer waited for Redis to take writes again"
        assert await redis.zcard(keys.in_flight()) == 1, "the release is still held by the pause"
    finally:
        await unpaused(redis)
    for _ in range(200):  # the release goes through once Redis takes writes again
        if await redis.zcard(keys.in_flight()) == 0:
            break
        await asyncio.sleep(0.01)
    assert await redis.zcard(keys.in_flight()) == 0


async def test_a_key_limited_to_one_request_at_a_time_gets_its_answer_once_its_slot_is_free(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    try:
        response, seconds = await ask(front_door, redis, LIMITED)
    finally:
        await unpaused(redis)
    assert response.status_code == 200, response.text
    assert seconds >= PAUSE_MS / 1000 * 0.9, "the answer left before its slot was given back"
    assert await redis.zcard(keys.key_in_flight(digest(LIMITED))) == 0
    # So the key's next request, sent the moment it has the answer, is never refused.
    for _ in range(5):
        await redis.delete(keys.job_stream(MODEL))  # next_job reads the stream from its start
        request = asyncio.ensure_future(
            front_door.post("/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {LIMITED}"})
        )
        job = await next_job(redis, MODEL)
        await redis.xadd(keys.result_stream(job.id), {keys.CHUNK_FIELD: encode(ANSWER)})
        response = await request
        assert response.status_code == 200, response.text
        assert await redis.zcard(keys.key_in_flight(digest(LIMITED))) == 0
