"""The steps of `router.flow`, in order, against a real Redis: a chat, a completion and a resumed
stream go through, and a refusal at each step reaches the client with its status and code.

The tests play the worker's part by writing into Redis what a worker would (`tests.support`).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import msgspec
import redis.asyncio as aioredis

from switchboard import api_keys, keys
from switchboard.config import ApiKey, ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.ports import free_port
from switchboard.wire import Chunk, LoadFailure, ModelLimits, SlotStatus, Usage, encode
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

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
OTHER = "other"
LAST = Chunk(text="!", finish_reason="stop", usage=Usage(prompt_tokens=2, completion_tokens=2))


def error(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    """The response's OpenAI error object, once its status and code are checked."""
    assert response.status_code == status, response.text
    body: dict[str, Any] = response.json()["error"]
    assert body["code"] == code, body
    return body


# --- through every step --------------------------------------------------------------------------


async def test_chat_is_decoded_queued_for_its_key_and_relayed_whole(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        request = asyncio.create_task(client.post(CHAT, json=BODY))
        job = await next_job(redis)
        assert job.messages is not None and job.messages[0].content == "Hi"
        assert job.router_id is not None  # addressed to this front door
        await write_chunks(redis, job.id, Chunk(text="Hi"), LAST)
        response = await request
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == f"chatcmpl-{job.id}"
    assert body["choices"][0]["message"]["content"] == "Hi!"
    assert body["usage"]["total_tokens"] == 4
    assert not await redis.zcard(keys.in_flight())  # its admission ticket was given back


async def test_completion_is_queued_and_relayed_as_a_stream(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True}
    async with serving(settings_for(redis_server.url)) as client:
        request = asyncio.create_task(client.post(COMPLETIONS, json=body))
        job = await next_job(redis)
        assert job.prompts == ("Hi",)
        await write_chunks(redis, job.id, Chunk(text="Hi"), LAST)
        response = await request
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["x-request-id"] == job.id
    events = [e.strip("\n") for e in response.text.split("\n\n") if e.strip()]  # keep-alives: blank lines
    assert all(e.startswith("data: ") for e in events), "OpenAI's shape: no `id:` lines"
    assert events[-1] == "data: [DONE]"
    texts = [msgspec.json.decode(e.removeprefix("data: "))["choices"][0]["text"] for e in events[:-1]]
    assert "".join(texts) == "Hi!"


async def test_a_resumed_stream_relays_the_rest_and_queues_nothing(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=30)
    streamed = {**BODY, "stream": True}
    async with serving(settings) as client:
        resumable = {"X-Switchboard-Resumable": "1"}
        async with client.stream("POST", CHAT, json=streamed, headers=resumable) as response:
            job = await next_job(redis)
            await write_chunks(redis, job.id, Chunk(text="Hel"))
            last_id = ""
            async for line in response.aiter_lines():
                if line.startswith("id: "):
                    last_id = line.removeprefix("id: ")
                if line.startswith("data: ") and "Hel" in line:
                    break
        # The client lost its connection after "Hel"; it comes back with the last id it saw.
        resumed = asyncio.create_task(client.post(CHAT, json=streamed, headers={"Last-Event-ID": last_id}))
        await asyncio.sleep(0.2)
        await write_chunks(redis, job.id, Chunk(text="lo"), LAST)
        response = await resumed
    assert response.status_code == 200, response.text
    data = [line.removeprefix("data: ") for line in response.text.splitlines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    texts = [msgspec.json.decode(d)["choices"][0]["delta"].get("content") or "" for d in data[:-1]]
    assert "".join(texts) == "lo!", "only the rest of the answer"
    assert await redis.xlen(keys.job_stream(MODEL)) == 1, "nothing new was queued"


# --- a refusal at each step, in the order the pipeline meets them --------------------------------


async def test_decode_refuses_what_is_not_json_or_not_valid(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        not_json = await client.post(CHAT, content=b"{", headers={"content-type": "application/json"})
        form = await client.post(CHAT, content=b"a=1", headers={"content-type": "text/plain"})
        invalid = await client.post(CHAT, json={**BODY, "max_tokens": 0})
    assert not_json.status_code == 400, not_json.text
    error(form, 415, "unsupported_media_type")
    assert error(invalid, 400, "invalid_value")["param"] == "max_tokens"
    assert not await redis.exists(keys.job_stream(MODEL))


async def test_check_refuses_fields_that_do_not_go_together(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        response = await client.post(CHAT, json={**BODY, "top_logprobs": 2})
    assert error(response, 400, "invalid_value")["param"] == "top_logprobs"


async def test_resolve_model_refuses_an_unknown_model_and_one_the_key_may_not_use(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    models = [ModelConfig(name=name, path="/nonexistent") for name in (MODEL, OTHER)]
    settings = settings_for(redis_server.url, models=models)
    settings.auth.keys = [ApiKey(name="user", sha256=api_keys.digest("sk-user"), models=[MODEL])]
    headers = {"Authorization": "Bearer sk-user"}
    async with serving(settings) as client:
        unknown = await client.post(CHAT, json={**BODY, "model": "nope"}, headers=headers)
        not_allowed = await client.post(CHAT, json={**BODY, "model": OTHER}, headers=headers)
    error(unknown, 404, "model_not_found")
    error(not_allowed, 403, "model_not_allowed")


async def test_resume_point_refuses_an_event_id_of_another_server(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        response = await client.post(CHAT, json={**BODY, "stream": True}, headers={"Last-Event-ID": "7"})
    error(response, 400, "invalid_last_event_id")


async def test_a_resumed_stream_whose_results_are_gone_is_a_404(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    gone = f"{'0' * 32}:1-0"
    async with serving(settings_for(redis_server.url)) as client:
        response = await client.post(CHAT, json={**BODY, "stream": True}, headers={"Last-Event-ID": gone})
    error(response, 404, "stream_not_found")


async def test_a_redis_that_cannot_be_reached_is_a_503_with_retry_after() -> None:
    async with serving(settings_for(f"redis://127.0.0.1:{free_port()}")) as client:
        response = await client.post(CHAT, json=BODY)
    error(response, 503, "redis_unavailable")
    assert int(response.headers["Retry-After"]) >= 1


async def test_fits_refuses_what_the_model_context_cannot_hold(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    await redis.set(
        keys.model_limits(MODEL), encode(ModelLimits(max_model_len=64, vocab_size=100, max_token_chars=16))
    )
    async with serving(settings_for(redis_server.url)) as client:
        response = await client.post(CHAT, json={**BODY, "max_tokens": 64})
    assert error(response, 400, "context_length_exceeded")["param"] == "max_tokens"
    assert not await redis.exists(keys.job_stream(MODEL))


async def test_the_live_worker_gate_refuses_a_model_no_live_worker_may_hold(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    record = msgspec.structs.replace(
        worker_record("w1", SlotStatus(model=OTHER, state="warm")), allowed=(OTHER,)
    )
    await advertise(redis, record)
    async with serving(settings_for(redis_server.url)) as client:
        response = await client.post(CHAT, json=BODY)
    error(response, 503, "no_worker_for_model")
    assert int(response.headers["Retry-After"]) >= 1


async def test_admit_refuses_a_job_past_the_model_queue_depth(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url)
    settings.limits.max_queue_depth = 0
    async with serving(settings) as client:
        response = await client.post(CHAT, json=BODY)
    error(response, 429, "queue_full")
    assert not await redis.exists(keys.job_stream(MODEL))


async def test_enqueue_refuses_a_model_whose_last_load_failed(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    now = time.time()
    failure = LoadFailure(model=MODEL, worker_id="w1", reason="oom", failed_at=now, retry_at=now + 10)
    await redis.set(keys.load_failure(MODEL), encode(failure))
    async with serving(settings_for(redis_server.url)) as client:
        response = await client.post(CHAT, json=BODY)
    error(response, 503, "model_load_failed")
    assert not await redis.zcard(keys.in_flight()), "its admission ticket was given back"


async def test_relay_answers_a_job_that_never_started_with_its_deadline_error(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url, timeout_s=0.5)) as client:
        response = await client.post(CHAT, json=BODY)
    error(response, 503, "no_worker_alive")  # no worker ever advertised itself
