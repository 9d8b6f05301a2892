"""A Responses stream resumes as a chat stream does (tests/router/scenarios/test_resume.py): through
another front door, by event id or by counting events, with the same items and the next sequence
numbers, and the answer is never asked of a model twice."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import redis.asyncio as aioredis
from openai import AsyncOpenAI

from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from tests.router.scenarios.test_resume import WORDS, aiter_lines, events, limited, serving, slow_worker
from tests.support.front_door_harness import MODEL, next_job, settings_for
from tests.support.front_door_harness import serving as plain_serving

RESPONSE_STREAM = {"model": MODEL, "input": "Count.", "stream": True}


def payloads(found: list[tuple[str, str]]) -> list[dict[str, Any]]:
    return [json.loads(data) for _, data in found]


def text_of(found: list[dict[str, Any]]) -> str:
    return "".join(event["delta"] for event in found if event["type"] == "response.output_text.delta")


async def test_a_response_stream_resumes_by_event_id_through_another_front_door(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    first_settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=2.0)
    second_settings = settings_for(redis_server.url, first_byte_budget_s=0.1)
    async with serving(first_settings) as first, serving(second_settings) as second, asyncio.timeout(30):
        async with first.stream("POST", "/v1/responses", json=RESPONSE_STREAM) as response:
            job = await next_job(redis)
            worker = asyncio.create_task(slow_worker(redis, job))
            seen = await events(response.aiter_lines(), count=7)  # the beginning and two words
        last_id = seen[-1][0]
        resumed = await second.post("/v1/responses", json=RESPONSE_STREAM, headers={"Last-Event-ID": last_id})
        assert resumed.status_code == 200, resumed.text
        rest = await events(aiter_lines(resumed.text))
        assert await worker == "stop"
    found = payloads(seen) + payloads(rest)
    assert [event["sequence_number"] for event in found] == list(range(len(found)))
    assert text_of(found) == "".join(WORDS)
    assert found[-1]["type"] == "response.completed"
    assert found[-1]["response"]["id"] == f"resp_{job.id}"
    (item,) = found[-1]["response"]["output"]
    assert item["content"][0]["text"] == "".join(WORDS)
    assert {event["item_id"] for event in found if "item_id" in event} == {item["id"]}
    assert "[DONE]" not in resumed.text
    assert await redis.xlen(keys.job_stream(MODEL)) == 1  # no second job


async def test_the_sdk_resumes_a_response_stream_by_counting_its_events(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    first_settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=5.0)
    second_settings = settings_for(redis_server.url, first_byte_budget_s=0.1)
    async with (
        plain_serving(first_settings) as first,
        plain_serving(second_settings) as second,
        asyncio.timeout(30),
    ):
        sdk = AsyncOpenAI(base_url=f"{first.base_url}/v1", api_key="unused", max_retries=0)
        stream = await sdk.responses.create(model=MODEL, input="Count.", stream=True)
        job = await next_job(redis)
        worker = asyncio.create_task(slow_worker(redis, job))
        request_id = stream.response.headers["x-request-id"]
        had = [event async for event in limited(stream, 6)]
        await stream.close()  # the connection broke after six events

        elsewhere = AsyncOpenAI(base_url=f"{second.base_url}/v1", api_key="unused", max_retries=0)
        again = await elsewhere.responses.create(
            model=MODEL, input="Count.", stream=True, extra_headers={"Last-Event-ID": f"{request_id}:6"}
        )
        rest = [event async for event in again]
        assert await worker == "stop"
    found = had + rest
    assert [event.sequence_number for event in found] == list(range(len(found)))
    deltas = "".join(e.delta for e in found if e.type == "response.output_text.delta")
    assert deltas == "".join(WORDS)
    assert found[-1].type == "response.completed"
    assert await redis.xlen(keys.job_stream(MODEL)) == 1
