"""Redis goes away and comes back: the front door answers at once meanwhile, recovers by itself, and
fails at once the requests whose jobs a restart lost (or goes on reading where persistence kept them).

Each test runs its own redis-server, stopped and started again on the same port.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Usage
from tests.support.front_door_harness import (
    BODY,
    MODEL,
    advertise,
    next_job,
    serving,
    settings_for,
    worker_record,
    write_chunks,
)

LAST = Chunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=2))


@pytest.fixture
async def own_redis() -> AsyncIterator[PrivateRedis]:
    server = PrivateRedis().start()
    try:
        yield server
    finally:
        server.stop()


async def restart(server: PrivateRedis) -> None:
    """Stop the server and start it again on the same port (off the event loop: both block)."""
    await asyncio.to_thread(server.stop)
    await asyncio.to_thread(server.start)


async def answered(client: httpx.AsyncClient, url: str, body: dict[str, object] = BODY) -> httpx.Response:
    """A non-streamed request, answered by a scripted worker on the server at `url`."""
    redis = aioredis.Redis.from_url(url)
    try:
        request = asyncio.create_task(client.post("/v1/chat/completions", json=body))
        job = await next_job(redis)
        await redis.delete(keys.job_stream(MODEL))
        await write_chunks(redis, job.id, Chunk(text="ok"), LAST)
        return await request
    finally:
        await redis.aclose()


async def test_while_redis_is_down_requests_are_503_at_once_and_it_recovers(own_redis: PrivateRedis) -> None:
    async with serving(settings_for(own_redis.url)) as client:
        redis = aioredis.Redis.from_url(own_redis.url)
        await advertise(redis, worker_record("w1"))
        await redis.aclose()
        assert (await client.get("/readyz")).status_code == 200
        await asyncio.to_thread(own_redis.stop)

        began = time.monotonic()
        for _ in range(5):
            response = await client.post("/v1/chat/completions", json=BODY)
            assert response.status_code == 503
            assert response.json()["error"]["code"] == "redis_unavailable"
            assert response.headers["Retry-After"] == "1"
            assert_says_nothing_of_redis(response.json()["error"]["message"], own_redis)
        # At once: no connect timeout, no long retries (the first request finds out, the rest know).
        assert time.monotonic() - began < 2.0
        not_ready = await client.get("/readyz")
        assert not_ready.status_code == 503
        assert not_ready.json()["error"]["code"] == "redis_unreachable"
        assert_says_nothing_of_redis(not_ready.json()["error"]["message"], own_redis)

        await asyncio.to_thread(own_redis.start)
        async with asyncio.timeout(10):
            # Up again by itself: requests are queued and answered.
            while True:
                probe = await client.get("/readyz")
                if probe.status_code == 200 or probe.json()["error"]["code"] != "redis_unreachable":
                    break
                await asyncio.sleep(0.1)
            assert (await answered(client, own_redis.url)).status_code == 200


def assert_says_nothing_of_redis(message: str, server: PrivateRedis) -> None:
    """Where Redis listens and what it (or the client library) said stay in the front door's log."""
    for secret in (str(server.port), "127.0.0.1", "Error", "refused", "Connection"):
        assert secret not in message, message


async def test_the_first_request_after_a_restart_uses_fresh_connections(own_redis: PrivateRedis) -> None:
    async with serving(settings_for(own_redis.url)) as client:
        assert (await answered(client, own_redis.url)).status_code == 200
        await restart(own_redis)
        # The pool's connections and the reader's are from before the restart: each is retried
        # once on a fresh connection, so the request never sees it.
        response = await answered(client, own_redis.url)
        assert response.status_code == 200, response.text
        assert response.json()["choices"][0]["message"]["content"] == "ok"


async def test_a_restart_that_loses_jobs_fails_their_requests_at_once(own_redis: PrivateRedis) -> None:
    # The deadline is far: only noticing the restart can end these requests in time.
    settings = settings_for(own_redis.url, timeout_s=120, first_byte_budget_s=0.1)
    async with serving(settings) as client, asyncio.timeout(20):
        redis = aioredis.Redis.from_url(own_redis.url)
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
        await next_job(redis)
        await redis.delete(keys.job_stream(MODEL))
        async with client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as streamed:
            job = await next_job(redis)
            await write_chunks(redis, job.id, Chunk(text="Hel"))
            lines = streamed.aiter_lines()
            async for line in lines:
                if line.startswith("data: "):
                    break
            await redis.aclose()
            await restart(own_redis)
            rest = [line async for line in lines if line]
        response = await waiting
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "redis_restarted"
    assert "Retry-After" in response.headers
    events = [json.loads(line[len("data: ") :]) for line in rest if line.startswith("data: {")]
    assert events[-1]["error"]["code"] == "redis_restarted"
    assert rest[-1] == "data: [DONE]"


async def test_a_restart_that_keeps_the_results_goes_on_reading(tmp_path: object) -> None:
    server = PrivateRedis(persist_dir=str(tmp_path)).start()
    try:
        settings = settings_for(server.url, timeout_s=120, first_byte_budget_s=0.1)
        async with serving(settings) as client, asyncio.timeout(20):
            redis = aioredis.Redis.from_url(server.url)
            body = {**BODY, "stream": True}
            async with client.stream("POST", "/v1/chat/completions", json=body) as streamed:
                job = await next_job(redis)
                await write_chunks(redis, job.id, Chunk(text="Hel"))
                lines = streamed.aiter_lines()
                async for line in lines:
                    if line.startswith("data: "):
                        break
                await redis.aclose()
                await restart(server)
                await asyncio.sleep(1.0)  # the reader has seen the new server by now
                redis = aioredis.Redis.from_url(server.url)
                await write_chunks(redis, job.id, Chunk(text="lo"), LAST)
                await redis.aclose()
                rest = [line async for line in lines if line]
        texts = [
            json.loads(line[len("data: ") :])["choices"][0]["delta"].get("content")
            for line in rest
            if line.startswith("data: {")
        ]
        assert "".join(t for t in texts if t) == "lo"
        assert rest[-1] == "data: [DONE]"
    finally:
        server.stop()
