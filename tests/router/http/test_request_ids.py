"""`x-request-id` on every response (the job's id where there is a job), and on every log line and span
of the request; a client's own `x-request-id` kept as the trace's correlation id, not echoed.

Real Redis, real HTTP, the real `openai` client; spans go to a JSON-lines file (`switchboard.tracing`).
"""

from __future__ import annotations

import asyncio
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI, BadRequestError

from router.http.connections import error_response
from router.openai.errors import RequestTimeoutError
from switchboard import keys, tracing
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Usage
from tests.support.front_door_harness import BODY, MODEL, next_job, serving, settings_for, write_chunks
from tests.support.span_file import read_spans

CHAT = "/v1/chat/completions"
LAST = Chunk(text="!", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=2))
AN_ID = re.compile(r"[0-9a-f]{32}")


async def answered(client: httpx.AsyncClient, redis: aioredis.Redis, body: dict[str, Any], **kw: Any) -> Any:
    """The response to `body`, whose job a scripted worker answers; and the job."""
    request = asyncio.create_task(client.post(CHAT, json=body, **kw))
    job = await next_job(redis)
    await redis.delete(keys.job_stream(MODEL))  # so that the next request's job is the next one read
    await write_chunks(redis, job.id, Chunk(text="Hi"), LAST)
    return await request, job


async def test_every_response_carries_its_jobs_id_or_one_of_its_own(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        whole, job = await answered(client, redis, BODY)
        streamed, streamed_job = await answered(client, redis, {**BODY, "stream": True})
        not_json = await client.post(CHAT, content=b"{", headers={"content-type": "application/json"})
        no_route = await client.get("/v1/nothing")
        health = await client.get("/healthz")
        models = await client.get("/v1/models")
    assert whole.headers["x-request-id"] == job.id
    assert streamed.headers["x-request-id"] == streamed_job.id
    assert (not_json.status_code, no_route.status_code) == (400, 404)
    made = [r.headers["x-request-id"] for r in (not_json, no_route, health, models)]
    assert all(AN_ID.fullmatch(i) for i in made) and len(set(made)) == 4, made


async def test_the_openai_sdk_reads_the_request_id_of_answers_and_errors(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        sdk = AsyncOpenAI(base_url=f"{client.base_url}/v1", api_key="unused", max_retries=0)
        request = asyncio.create_task(
            sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
        )
        job = await next_job(redis)
        await write_chunks(redis, job.id, Chunk(text="Hi"), LAST)
        completion = await request
        with pytest.raises(BadRequestError) as refused:
            await sdk.chat.completions.create(model=MODEL, messages=[], temperature=9)
    assert completion._request_id == job.id
    assert refused.value.request_id is not None and AN_ID.fullmatch(refused.value.request_id)


async def test_a_clients_request_id_is_the_traces_correlation_id_and_every_span_names_the_job(
    redis: aioredis.Redis, redis_server: PrivateRedis, span_file: Path
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        response, job = await answered(client, redis, BODY, headers={"x-request-id": "client-42"})
        odd, odd_job = await answered(client, redis, BODY, headers={"x-request-id": "has space"})
    assert response.headers["x-request-id"] == job.id, "the server's id, as OpenAI's API answers"
    found = [s for s in read_spans(span_file) if s["trace_id"] == spans_of(span_file, job.id)]
    names = {s["name"] for s in found}
    assert {"POST /v1/chat/completions", f"chat {MODEL}", "switchboard.admission"} <= names, names
    assert all(s["attributes"].get(tracing.REQUEST_ID) == job.id for s in found), [
        (s["name"], s["attributes"]) for s in found
    ]
    assert all(s["attributes"][tracing.CLIENT_REQUEST_ID] == "client-42" for s in found)
    assert odd.headers["x-request-id"] == odd_job.id
    ignored = [s for s in read_spans(span_file) if s["trace_id"] == spans_of(span_file, odd_job.id)]
    assert ignored and not any(tracing.CLIENT_REQUEST_ID in s["attributes"] for s in ignored)


def spans_of(path: Path, job_id: str) -> str:
    """The trace id of the HTTP span whose request had job `job_id`."""
    (trace_id,) = {
        s["trace_id"]
        for s in read_spans(path)
        if s["kind"] == "SERVER" and s["attributes"].get(tracing.REQUEST_ID) == job_id
    }
    return str(trace_id)


async def test_log_lines_of_a_request_carry_its_ids(
    redis_server: PrivateRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # The handlers `switchboard.logs` installs carry this filter; pytest's own gets it here.
    caplog.handler.addFilter(tracing.request_ids)
    caplog.set_level(logging.INFO, logger="router")
    try:
        async with serving(settings_for(redis_server.url, timeout_s=0.3)) as client:
            # No worker is alive: the request is dropped at its deadline, and that is logged.
            response = await client.post(CHAT, json=BODY, headers={"x-request-id": "mine"})
    finally:
        caplog.handler.removeFilter(tracing.request_ids)
    assert response.status_code == 503
    (record,) = [r for r in caplog.records if r.getMessage() == "request dropped: no live worker"]
    assert record.request_id == response.headers["x-request-id"] == record.job_id
    assert record.client_request_id == "mine"


def test_a_connection_refused_before_its_request_reached_the_app_gets_an_id_too() -> None:
    response = error_response(RequestTimeoutError("The request's headers did not arrive in time."))
    head = response.split(b"\r\n\r\n", 1)[0].decode()
    (line,) = [line for line in head.split("\r\n") if line.startswith("x-request-id: ")]
    assert AN_ID.fullmatch(line.removeprefix("x-request-id: "))
