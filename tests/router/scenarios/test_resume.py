"""Resumable streams: every event names its job and result stream entry, and a client that lost its
connection re-sends the request with `Last-Event-ID` to any front door for the rest of the answer.

Two front doors share one Redis; a scripted worker writes chunks slowly and stops, as a real worker
does, once the job has a cancel mark.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import redis.asyncio as aioredis

from switchboard import api_keys, keys
from switchboard.config import ApiKey
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Job, Usage
from tests.support.front_door_harness import BODY, MODEL, next_job, serving, settings_for, write_chunks

WORDS = ["one ", "two ", "three ", "four ", "five ", "six ", "seven ", "eight"]
STREAM = {**BODY, "stream": True}


async def slow_worker(redis: aioredis.Redis, job: Job, every_s: float = 0.15) -> str:
    """Write WORDS one at a time, as a worker would; stop at a cancel mark. Returns how it finished."""
    for word in WORDS:
        if await redis.exists(keys.cancel_mark(job.id)):
            await write_chunks(
                redis, job.id, Chunk(finish_reason="abort", usage=Usage(prompt_tokens=1, completion_tokens=0))
            )
            return "abort"
        await write_chunks(redis, job.id, Chunk(text=word))
        await asyncio.sleep(every_s)
    await write_chunks(
        redis, job.id, Chunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=8))
    )
    return "stop"


async def events(lines: AsyncIterator[str], count: int | None = None) -> list[tuple[str, str]]:
    """(id, data) of the next `count` events (every event, if None) of an SSE stream."""
    found: list[tuple[str, str]] = []
    event_id = ""
    async for line in lines:
        if line.startswith("id: "):
            event_id = line[len("id: ") :]
        elif line.startswith("data: "):
            found.append((event_id, line[len("data: ") :]))
            if count is not None and len(found) == count:
                break
    return found


def text_of(found: list[tuple[str, str]]) -> str:
    parts = []
    for _, data in found:
        if data != "[DONE]":
            parts.extend(choice["delta"].get("content") or "" for choice in json.loads(data)["choices"])
    return "".join(parts)


async def test_a_stream_resumes_through_another_front_door_with_the_rest_of_the_answer(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    first_settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=2.0)
    second_settings = settings_for(redis_server.url, first_byte_budget_s=0.1)
    async with serving(first_settings) as first, serving(second_settings) as second, asyncio.timeout(30):
        async with first.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job))
            seen = await events(response.aiter_lines(), count=3)
        # The client's connection broke after three events; it comes back to the other front door.
        last_id = seen[-1][0]
        assert last_id.startswith(f"{job.id}:")
        resumed = await second.post("/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": last_id})
        assert resumed.status_code == 200
        rest = await events(aiter_lines(resumed.text))
        assert await worker == "stop"  # the worker was not cancelled: a client came back in time
        await asyncio.sleep(2.5)  # past the first front door's grace: still no cancel mark
        assert not await redis.exists(keys.cancel_mark(job.id))
        # Read to its end, the result stream and the job's record stay only briefly.
        for key in (keys.result_stream(job.id), keys.job_record(job.id)):
            assert 0 < await redis.ttl(key) <= keys.FINISHED_RESULT_TTL_S

    assert text_of(seen) + text_of(rest) == "".join(WORDS)
    assert rest[-1][1] == "[DONE]"
    first_payload, resumed_payload = json.loads(seen[0][1]), json.loads(rest[0][1])
    assert resumed_payload["id"] == first_payload["id"] == f"chatcmpl-{job.id}"
    assert resumed_payload["created"] == first_payload["created"]
    assert "role" not in resumed_payload["choices"][0]["delta"]  # the client had it already
    assert all(event_id.startswith(f"{job.id}:") for event_id, _ in rest)
    assert await redis.xlen(keys.job_stream(MODEL)) == 1  # no second job


async def aiter_lines(text: str) -> AsyncIterator[str]:
    for line in text.splitlines():
        yield line


async def test_a_client_that_does_not_come_back_cancels_its_job_after_the_grace(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=1.0)
    async with serving(settings) as client, asyncio.timeout(30):
        async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job, every_s=0.3))
            await events(response.aiter_lines(), count=2)
        left = asyncio.get_running_loop().time()
        await asyncio.sleep(0.5)
        assert not await redis.exists(keys.cancel_mark(job.id))  # within the grace
        # The stream is kept for a client that resumes, and expires on its own.
        assert 0 < await redis.ttl(keys.result_stream(job.id)) <= keys.RESULT_TTL_S
        assert await worker == "abort"
        assert asyncio.get_running_loop().time() - left >= 1.0


async def test_an_unknown_or_malformed_last_event_id_is_refused(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        unknown = await client.post(
            "/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": f"{'ab' * 16}:1-0"}
        )
        malformed = await client.post(
            "/v1/completions",
            json={"model": MODEL, "prompt": "x", "stream": True},
            headers={"Last-Event-ID": "nope"},
        )
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "stream_not_found"
    assert malformed.status_code == 400
    assert malformed.json()["error"]["code"] == "invalid_last_event_id"
    assert not await redis.exists(keys.job_stream(MODEL))  # neither queued a job


async def test_a_stream_read_to_its_end_can_still_be_resumed_for_its_last_events(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """A connection that broke just before the last events reached the client: they are still there."""
    async with (
        serving(settings_for(redis_server.url, first_byte_budget_s=0.1)) as client,
        asyncio.timeout(30),
    ):
        async with client.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            await slow_worker(redis, job, every_s=0)
            everything = await events(response.aiter_lines())
        # The client saw everything up to the fourth event only.
        resumed = await client.post(
            "/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": everything[3][0]}
        )
    assert resumed.status_code == 200
    rest = await events(aiter_lines(resumed.text))
    assert text_of(everything[:4]) + text_of(rest) == "".join(WORDS)
    assert rest[-1][1] == "[DONE]"


async def test_two_clients_reading_one_stream_both_get_the_end_and_one_leaving_cancels_nothing(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=0.5)
    async with serving(settings) as first, serving(settings) as second, asyncio.timeout(30):
        async with first.stream("POST", "/v1/chat/completions", json=STREAM) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job, every_s=0.3))
            seen = await events(response.aiter_lines(), count=2)
        # Two clients resume the same stream (say, two tabs); the second one leaves early.
        staying = asyncio.create_task(
            first.post("/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": seen[-1][0]})
        )
        await until_record(redis, job.id, "resumes", 1)
        leaving = second.stream(
            "POST", "/v1/chat/completions", json=STREAM, headers={"Last-Event-ID": seen[-1][0]}
        )
        async with leaving as early:
            await events(early.aiter_lines(), count=1)
        await until_record(redis, job.id, "readers", 1)
        assert await worker == "stop", "a reader was still there: nothing cancelled the job"
        rest = await events(aiter_lines((await staying).text))
    assert text_of(seen) + text_of(rest) == "".join(WORDS)
    assert rest[-1][1] == "[DONE]"


async def until_record(redis: aioredis.Redis, job_id: str, field: str, count: int) -> None:
    """Until the job's record counts `count` in `field` (readers, resumes)."""

    async def counted() -> bool:
        return int(await redis.hget(keys.job_record(job_id), field) or 0) == count  # type: ignore[misc]

    deadline = asyncio.get_running_loop().time() + 10
    while not await counted():
        assert asyncio.get_running_loop().time() < deadline, f"the job's {field} never reached {count}"
        await asyncio.sleep(0.02)


async def test_a_stream_resumes_only_for_the_key_that_sent_its_request(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    alice, bob = api_keys.new_secret(), api_keys.new_secret()
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1)
    settings.auth.keys = [
        ApiKey(name="alice", sha256=api_keys.digest(alice)),
        ApiKey(name="bob", sha256=api_keys.digest(bob)),
    ]
    async with serving(settings) as client, asyncio.timeout(30):
        async with client.stream(
            "POST", "/v1/chat/completions", json=STREAM, headers={"Authorization": f"Bearer {alice}"}
        ) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job, every_s=0.1))
            seen = await events(response.aiter_lines(), count=2)
        as_bob = await client.post(
            "/v1/chat/completions",
            json=STREAM,
            headers={"Authorization": f"Bearer {bob}", "Last-Event-ID": seen[-1][0]},
        )
        as_alice = await client.post(
            "/v1/chat/completions",
            json=STREAM,
            headers={"Authorization": f"Bearer {alice}", "Last-Event-ID": seen[-1][0]},
        )
        await worker
    assert as_bob.status_code == 404, "another key's answer is not revealed, nor that it exists"
    assert as_bob.json()["error"]["code"] == "stream_not_found"
    assert as_alice.status_code == 200
    assert text_of(seen) + text_of(await events(aiter_lines(as_alice.text))) == "".join(WORDS)
