"""Redis goes away and comes back: the front door answers at once meanwhile, recovers by itself, and
fails at once the requests whose jobs a restart lost (or goes on reading where persistence kept them).

Each test of a restart runs its own redis-server, stopped (or killed) and started again on the same
port; lost writes are played on the session's server, by writing a result stream with a gap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Usage, encode
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
from tests.support.jobs import make_job
from tests.support.redis_nodes import RedisNode

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


# --- restarts and lost writes, judged by each job's record ----------------------------------------


async def until_queued(redis: aioredis.Redis, count: int) -> None:
    """Wait until the model's stream holds `count` jobs."""
    async with asyncio.timeout(10):
        while True:
            if await redis.xlen(keys.job_stream(MODEL)) >= count:
                return
            await asyncio.sleep(0.02)


async def until_answers(node: RedisNode) -> float:
    """Wait until the restarted `node` has loaded its data and answers commands; the loop's time then."""
    redis = aioredis.Redis.from_url(node.url)
    try:
        async with asyncio.timeout(20):
            while True:
                with contextlib.suppress(RedisError):
                    await redis.exists("any")
                    return asyncio.get_running_loop().time()
                await asyncio.sleep(0.05)
    finally:
        await redis.aclose()


async def test_a_restart_that_lost_a_queued_job_fails_it_though_its_models_queue_survived(
    tmp_path: Path,
) -> None:
    node = RedisNode(tmp_path).start()
    try:
        redis = aioredis.Redis.from_url(node.url)
        # A snapshot taken before the request holds the model's queue (an older job): the restart
        # brings the queue back, without the request's job.
        await redis.xadd(keys.job_stream(MODEL), {keys.JOB_FIELD: encode(make_job(MODEL, "older"))})
        await redis.save()
        settings = settings_for(node.url, timeout_s=120)
        async with serving(settings) as client, asyncio.timeout(30):
            waiting = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
            await until_queued(redis, 2)
            await redis.aclose()
            node.kill()
            node.start()  # on this thread: the server ends with the thread that started it
            back = asyncio.get_running_loop().time()
            response = await waiting
            assert asyncio.get_running_loop().time() - back < 5.0, "within seconds, not at its deadline"
            assert response.status_code == 503, response.text
            assert response.json()["error"]["code"] == "redis_restarted"
            redis = aioredis.Redis.from_url(node.url)
            await redis.delete(keys.job_stream(MODEL))  # the older job, which no worker takes here
            await redis.aclose()
            served = await answered(client, node.url)
            assert served.status_code == 200, served.text
    finally:
        node.kill()


async def test_a_restart_is_noticed_though_the_first_check_after_it_fails(tmp_path: Path) -> None:
    # The restarted server loads its snapshot slowly: it answers INFO (its new run id) while it
    # loads, and LOADING to the check of each job; the check must be made again once it has loaded.
    slow_load = ("--key-load-delay", "1000", "--loading-process-events-interval-bytes", "1024")
    node = RedisNode(tmp_path, password="secret", extra_args=slow_load).start()
    try:
        redis = aioredis.Redis.from_url(node.url)
        await redis.mset({f"filler:{i}": "x" for i in range(2000)})
        await redis.save()  # without the model's queue and without the job
        settings = settings_for(node.url, timeout_s=120)
        async with serving(settings) as client, asyncio.timeout(40):
            waiting = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
            await until_queued(redis, 1)
            await redis.aclose()
            node.kill()
            node.start(wait_loaded=False)  # on this thread: the server ends with the one that started it
            loaded = await until_answers(node)
            response = await waiting
            assert asyncio.get_running_loop().time() - loaded < 5.0, "failed within seconds of the load"
    finally:
        node.kill()
    assert response.status_code == 503, response.text
    assert response.json()["error"]["code"] == "redis_restarted"


def chunk_entry(chunk: Chunk) -> dict[str, bytes | str]:
    """A result stream entry as a worker's result writer writes it (`append_chunk.lua`)."""
    return {keys.CHUNK_FIELD: encode(chunk), keys.WRITER_FIELD: "w1"}


async def test_a_result_stream_that_lost_chunks_fails_its_request_instead_of_skipping_them(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, timeout_s=120, first_byte_budget_s=0.1)
    body = {**BODY, "stream": True}
    async with (
        serving(settings) as client,
        asyncio.timeout(20),
        client.stream("POST", "/v1/chat/completions", json=body) as streamed,
    ):
        job = await next_job(redis)
        results = keys.result_stream(job.id)
        await redis.xadd(results, chunk_entry(Chunk(text="one ")), id="0-1")
        await redis.xadd(results, chunk_entry(Chunk(text="two ")), id="0-2")
        lines = streamed.aiter_lines()
        texts = await stream_texts(lines, 2)
        # Entry 0-3 was written and lost (a replica promoted before it had it); 0-4 was not.
        await redis.xadd(results, chunk_entry(Chunk(text="four")), id="0-4")
        await redis.xadd(results, chunk_entry(LAST), id="0-5")
        rest = [line async for line in lines if line]
    assert texts == ["one ", "two "]
    events = [json.loads(line[len("data: ") :]) for line in rest if line.startswith("data: {")]
    assert [event["error"]["code"] for event in events] == ["redis_restarted"], "no text past the gap"
    assert rest[-1] == "data: [DONE]"


async def test_a_result_stream_behind_its_reader_goes_on_where_the_reader_is(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    # The reader had entries 0-1..0-3; the new primary kept only 0-1, and the worker that wrote
    # them writes on from 0-4: from the reader's point the answer is whole.
    settings = settings_for(redis_server.url, timeout_s=120, first_byte_budget_s=0.1)
    body = {**BODY, "stream": True}
    async with (
        serving(settings) as client,
        asyncio.timeout(20),
        client.stream("POST", "/v1/chat/completions", json=body) as streamed,
    ):
        job = await next_job(redis)
        results = keys.result_stream(job.id)
        for position, word in enumerate(("one ", "two ", "three "), start=1):
            await redis.xadd(results, chunk_entry(Chunk(text=word)), id=f"0-{position}")
        lines = streamed.aiter_lines()
        texts = await stream_texts(lines, 3)
        await redis.xdel(results, "0-2", "0-3")
        await redis.xadd(results, chunk_entry(Chunk(text="four")), id="0-4")
        await redis.xadd(results, chunk_entry(LAST), id="0-5")
        texts += await stream_texts(lines, 2)
        rest = [line async for line in lines if line]
    assert "".join(texts) == "one two three four"
    assert [line for line in rest if line.startswith("data: ")] == ["data: [DONE]"], "no error event"


async def stream_texts(lines: AsyncIterator[str], count: int) -> list[str]:
    """The text of the next `count` events of a streamed answer (the empty string for none)."""
    texts: list[str] = []
    async for line in lines:
        if line.startswith("data: {"):
            texts.append(json.loads(line[len("data: ") :])["choices"][0]["delta"].get("content") or "")
            if len(texts) == count:
                break
    return texts
