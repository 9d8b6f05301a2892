"""The front door against a real Redis, with a scripted worker that speaks the wire protocol.

The scripted worker takes jobs from the model's stream with the real consumer group and answers
through the real ResultWriter, so everything the front door does on Redis is exercised for real.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable

import httpx
import msgspec
import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from switchboard.readiness import NO_LIVE_WORKER
from switchboard.wire import Chunk, Job, JobError, Usage, WorkerRecord, encode, job_decoder
from tests.support.front_door_harness import BODY, MODEL, serving, settings_for
from workers.jobs.writer import ResultWriter, inbox_of
from workers.runtime.heartbeat import Heartbeat

Answer = Callable[[Job, ResultWriter, tuple[str, bytes]], Awaitable[None]]


async def answer_words(job: Job, writer: ResultWriter, ack: tuple[str, bytes]) -> None:
    """Three text chunks, then a finish with usage."""
    for word in ["Hello", ", ", "world"]:
        await writer.append(job.id, encode(Chunk(text=word)), inbox=inbox_of(job))
    last = Chunk(finish_reason="length", usage=Usage(prompt_tokens=4, completion_tokens=3))
    await writer.append(job.id, encode(last), ack=ack, inbox=inbox_of(job))


@contextlib.asynccontextmanager
async def scripted_worker(redis: aioredis.Redis, answer: Answer) -> AsyncIterator[list[Job]]:
    """Take jobs for MODEL like a worker would and answer each with `answer`; yields the jobs seen."""
    stream = keys.job_stream(MODEL)
    with contextlib.suppress(ResponseError):
        await redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
    writer = ResultWriter(redis)
    writer.start()
    seen: list[Job] = []
    answers: set[asyncio.Task[None]] = set()

    async def loop() -> None:
        while True:
            response = await redis.xreadgroup(keys.JOB_GROUP, "scripted", {stream: ">"}, block=100)
            for _, entries in response or ():
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[b"job"])
                    seen.append(job)
                    task = asyncio.create_task(answer(job, writer, (stream, entry_id)))
                    answers.add(task)
                    task.add_done_callback(answers.discard)

    task = asyncio.create_task(loop())
    try:
        yield seen
    finally:
        for running in [task, *answers]:
            running.cancel()
        # Bounded: a cancelled XREADGROUP BLOCK of this test's own client has been seen to go on
        # waiting (redis-py 8.1, Redis 7.0) after every assertion had passed; that must not hang
        # the suite.
        await asyncio.wait([task, *answers], timeout=5)
        await writer.stop()


@pytest.fixture
async def front_door(redis: aioredis.Redis, redis_server: PrivateRedis) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(settings_for(redis_server.url)) as client:
        yield client


async def test_non_streamed_request_becomes_a_job_and_an_assembled_completion(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    async with scripted_worker(redis, answer_words) as jobs:
        response = await front_door.post("/v1/chat/completions", json={**BODY, "seed": 5, "stop": "x"})
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["choices"][0]["message"] == {"role": "assistant", "content": "Hello, world", "refusal": None}
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"] == {"prompt_tokens": 4, "completion_tokens": 3, "total_tokens": 7}
    (job,) = jobs
    assert body["id"] == f"chatcmpl-{job.id}"
    assert job.model == MODEL
    assert job.messages is not None and job.messages[0].content == "Hi"
    assert (job.sampling.max_tokens, job.sampling.seed, job.sampling.stop) == (3, 5, ("x",))
    assert job.deadline > time.time()


async def test_streamed_request_relays_every_chunk_as_sse(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    async with scripted_worker(redis, answer_words):
        response = await front_door.post(
            "/v1/chat/completions", json={**BODY, "stream": True, "stream_options": {"include_usage": True}}
        )
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    # OpenAI's shape: `data:` events only, no `id:` lines; the job's id is in `x-request-id`.
    events = [e.strip("\n") for e in response.text.split("\n\n") if e.strip()]  # keep-alives: blank lines
    assert all(e.startswith("data: ") and "\n" not in e for e in events), events
    assert re.fullmatch(r"[0-9a-f]{32}", response.headers["x-request-id"])
    assert events[-1] == "data: [DONE]"
    payloads = [json.loads(e[len("data: ") :]) for e in events[:-1]]
    texts = [p["choices"][0]["delta"].get("content") for p in payloads if p["choices"]]
    assert "".join(t for t in texts if t) == "Hello, world"
    assert payloads[0]["choices"][0]["delta"]["role"] == "assistant"
    assert payloads[-1]["choices"] == []
    assert payloads[-1]["usage"]["total_tokens"] == 7


async def test_a_chunk_written_before_the_reader_looks_is_not_lost(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    async def answer_all_at_once(job: Job, writer: ResultWriter, ack: tuple[str, bytes]) -> None:
        pipe = redis.pipeline()
        pipe.xadd(keys.result_stream(job.id), {"c": encode(Chunk(text="early"))})
        pipe.xadd(
            keys.result_stream(job.id),
            {
                "c": encode(
                    Chunk(text="!", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1))
                )
            },
        )
        await pipe.execute()
        await redis.xack(*ack[:1], keys.JOB_GROUP, ack[1])

    async with scripted_worker(redis, answer_all_at_once):
        response = await front_door.post("/v1/chat/completions", json=BODY)
    assert response.json()["choices"][0]["message"]["content"] == "early!"


async def test_worker_errors_map_to_openai_errors(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    async def refuse(job: Job, writer: ResultWriter, ack: tuple[str, bytes]) -> None:
        error = JobError(code="invalid_request", message="The prompt is too long.")
        await writer.append(job.id, encode(Chunk(error=error)), ack=ack, inbox=inbox_of(job))

    async with scripted_worker(redis, refuse):
        response = await front_door.post("/v1/chat/completions", json=BODY)
        streamed = await front_door.post("/v1/chat/completions", json={**BODY, "stream": True})
    assert response.status_code == 400
    assert response.json()["error"]["message"] == "The prompt is too long."
    # Known before the first token: a streamed request gets the same real status, not an event.
    assert streamed.status_code == 400
    assert streamed.headers["content-type"].startswith("application/json")
    assert streamed.json()["error"]["type"] == "invalid_request_error"
    # The job ended; nobody left early, so no cancel mark was written.
    assert not [k async for k in redis.scan_iter(match=keys.cancel_mark("*"))]


async def test_a_job_that_misses_its_deadline_is_a_504_and_is_cancelled(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async def never(job: Job, writer: ResultWriter, ack: tuple[str, bytes]) -> None:
        await writer.append(job.id, encode(Chunk(text="thinking")), inbox=inbox_of(job))

    settings = settings_for(redis_server.url, timeout_s=0.5)
    async with serving(settings) as client, scripted_worker(redis, never) as jobs:
        response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "timeout"
    assert await redis.exists(keys.cancel_mark(jobs[0].id))
    assert 0 < await redis.ttl(keys.cancel_mark(jobs[0].id)) <= keys.CANCEL_TTL_S


async def test_bad_requests_never_reach_the_queue(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    unknown = await front_door.post("/v1/chat/completions", json={**BODY, "model": "other"})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    invalid = await front_door.post("/v1/chat/completions", json={**BODY, "n": 300})
    assert invalid.status_code == 400
    assert invalid.json()["error"]["param"] == "n"
    assert not await redis.exists(keys.job_stream(MODEL))


async def test_unknown_routes_and_methods_answer_in_openai_shape(front_door: httpx.AsyncClient) -> None:
    missing = await front_door.get("/v1/nothing-here")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "not_found"
    wrong_method = await front_door.get("/v1/chat/completions")
    assert wrong_method.status_code == 405
    assert wrong_method.json()["error"]["code"] == "method_not_allowed"


async def test_readyz_needs_a_live_worker(front_door: httpx.AsyncClient, redis: aioredis.Redis) -> None:
    assert (await front_door.get("/healthz")).status_code == 200
    not_ready = await front_door.get("/readyz")
    assert not_ready.status_code == 503
    assert "worker" in not_ready.json()["error"]["message"]
    assert not_ready.json()["error"]["code"] == NO_LIVE_WORKER
    record = WorkerRecord(
        id="w1",
        host="h",
        pid=1,
        started=time.time(),
        heartbeat=time.time(),
        models=(MODEL,),
        triton_http_port=1,
        triton_grpc_port=2,
        triton_metrics_port=3,
    )
    heartbeat = Heartbeat(redis, lambda: record, interval_s=60)
    await heartbeat.start()
    # Probes share one read of the worker records a second: the worker is seen within that.
    ready = await readyz_until(front_door, 200)
    assert ready.status_code == 200
    assert ready.json()["workers"] == 1
    stored = msgspec.msgpack.decode(await redis.get(keys.worker_record("w1")), type=WorkerRecord)
    assert stored.models == (MODEL,)
    await heartbeat.stop()
    assert (await readyz_until(front_door, 503)).status_code == 503
    assert not await redis.exists(keys.worker_record("w1"))


async def readyz_until(front_door: httpx.AsyncClient, status: int) -> httpx.Response:
    """`/readyz` asked until it answers `status` (its copy of the worker records is at most 1 s old)."""
    for _ in range(50):
        response = await front_door.get("/readyz")
        if response.status_code == status:
            break
        await asyncio.sleep(0.1)
    return response


async def test_readyz_without_workers_is_ready_once_redis_answers(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """Workers scaled to zero: the front door must stay in its Service to take the request that wakes one."""
    settings = settings_for(redis_server.url)
    settings.router.ready_without_workers = True
    async with serving(settings) as front_door:
        ready = await front_door.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["workers"] == 0
        # A model asked for by name still needs a worker that may hold it.
        assert (await front_door.get(f"/readyz?model={MODEL}")).status_code == 503


async def test_many_concurrent_requests_share_a_few_redis_connections(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    async def slow_words(job: Job, writer: ResultWriter, ack: tuple[str, bytes]) -> None:
        await asyncio.sleep(0.3)
        await answer_words(job, writer, ack)

    async with asyncio.timeout(120), scripted_worker(redis, slow_words):
        before = (await redis.info("clients"))["connected_clients"]
        requests = [front_door.post("/v1/chat/completions", json=BODY) for _ in range(100)]
        gathered = asyncio.gather(*requests)
        await asyncio.sleep(0.2)
        clients = (await redis.info("clients"))["connected_clients"]
        responses = await gathered
    assert all(r.status_code == 200 for r in responses)
    # 100 requests in flight: at most the front door's pool and its reader are added (the count
    # before includes the test's own clients and whatever else this session's Redis serves).
    assert clients - before < 20
    assert not [k async for k in redis.scan_iter(match=keys.result_stream("*"))]


async def test_a_client_that_leaves_mid_stream_leaves_a_cancel_mark(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    # No grace for a client to resume the stream (test_resume.py covers the grace).
    settings = settings_for(redis_server.url, resume_grace_s=0)
    cancelled: list[str] = []

    async def endless(job: Job, writer: ResultWriter, ack: tuple[str, bytes]) -> None:
        while not await redis.exists(keys.cancel_mark(job.id)):
            await writer.append(job.id, encode(Chunk(text="more ")), inbox=inbox_of(job))
            await asyncio.sleep(0.05)
        cancelled.append(job.id)  # the job's last chunk deletes its cancel mark
        await writer.append(
            job.id,
            encode(Chunk(finish_reason="abort", usage=Usage(prompt_tokens=1, completion_tokens=0))),
            ack=ack,
            inbox=inbox_of(job),
        )

    async with asyncio.timeout(60), serving(settings) as front_door, scripted_worker(redis, endless) as jobs:
        async with front_door.stream(
            "POST", "/v1/chat/completions", json={**BODY, "stream": True}
        ) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break  # the client goes away after its first event
        for _ in range(100):
            if cancelled:
                break
            await asyncio.sleep(0.05)
        assert jobs and cancelled == [jobs[0].id]


async def test_auto_tool_choice_needs_the_models_tool_call_parser(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    tool = {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object"}}}
    for extra in ({}, {"tool_choice": "auto"}):
        response = await front_door.post("/v1/chat/completions", json={**BODY, "tools": [tool], **extra})
        assert response.status_code == 400
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("tool_choice", "unsupported_parameter")
        assert "tool_call_parser" in error["message"]
    assert not await redis.exists(keys.job_stream(MODEL))
