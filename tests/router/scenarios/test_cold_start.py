"""Requests for a model that is loading, failed to load, or nobody holds: real Redis, real HTTP.

The test plays the worker: it advertises slots in a heartbeat record, leaves failure marks and
measured costs, and writes result chunks, exactly where a worker would.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable

import msgspec
import pytest
import redis.asyncio as aioredis
from openai import AsyncOpenAI, InternalServerError

from router.admission.model_table import WORKERS_MAX_AGE_S
from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, JobError, LoadFailure, SlotStatus, Usage, encode, job_decoder
from tests.support.front_door_harness import (
    BODY,
    MODEL,
    advertise,
    answer_ok,
    next_job,
    record_load_times,
    serving,
    settings_for,
    worker_record,
    write_chunks,
)


def loading_slot(elapsed_s: float, expected_s: float | None) -> SlotStatus:
    return SlotStatus(
        model=MODEL,
        state="loading",
        replica=0,
        load_started=time.time() - elapsed_s,
        expected_load_s=expected_s,
    )


async def mark_failed(redis: aioredis.Redis, reason: str, retry_in_s: float) -> None:
    now = time.time()
    failure = LoadFailure(
        model=MODEL, worker_id="w1", reason=reason, failed_at=now, retry_at=now + retry_in_s
    )
    await redis.set(keys.load_failure(MODEL), encode(failure), px=int(retry_in_s * 1000))


# Progress comments go to clients that ask for a resumable stream (by default a keep-alive is a
# blank line: tests/router/relay/test_sse_framing.py).
RESUMABLE = {"X-Switchboard-Resumable": "1"}


def sse_blocks(text: str) -> list[str]:
    """The events and comments of a stream, without the events' `id:` lines."""
    blocks = [block for block in text.split("\n\n") if block]
    return ["\n".join(line for line in b.split("\n") if not line.startswith("id: ")) for b in blocks]


# --- enqueue ------------------------------------------------------------------------------------


async def test_an_enqueue_notes_its_model_and_pokes_the_controllers_in_the_same_round_trip(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url, timeout_s=0.3)) as client:
        await client.post("/v1/chat/completions", json=BODY)
    assert await redis.xlen(keys.job_stream(MODEL)) == 1
    assert 0 < await redis.ttl(keys.job_stream(MODEL)) <= keys.JOB_STREAM_TTL_S
    ((_, fields),) = await redis.xrange(keys.demand_stream())
    assert fields == {b"m": MODEL.encode()}
    assert 0 < await redis.ttl(keys.demand_stream()) <= keys.DEMAND_TTL_S
    ((_, entry),) = await redis.xrange(keys.job_stream(MODEL))
    queued = job_decoder.decode(entry[keys.JOB_FIELD.encode()])
    noted = await redis.hgetall(keys.demand_index())  # type: ignore[misc]
    assert noted == {MODEL.encode(): queued.id.encode()}, "the model is noted under its job's id"
    assert 0 < await redis.ttl(keys.demand_index()) <= keys.DEMAND_INDEX_TTL_S


@pytest.mark.parametrize("stream", [False, True])
async def test_a_failure_mark_is_a_503_at_once_and_nothing_is_enqueued(
    redis: aioredis.Redis, redis_server: PrivateRedis, stream: bool
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        # Marked once the front door serves, so that a slow start does not count.
        marked = time.monotonic()
        await mark_failed(redis, "CUDA out of memory.", retry_in_s=11.9)
        started = time.monotonic()
        response = await client.post("/v1/chat/completions", json={**BODY, "stream": stream})
        answered_s = time.monotonic() - started
        since_mark_s = time.monotonic() - marked
    # At once: not after the request's 30 s timeout (measured to the answer, not to the front
    # door's stop, which took the total past a second on a loaded machine).
    assert answered_s < 5.0
    assert response.status_code == 503
    # What was left of the 11.9 s when the front door answered, rounded up (a loaded machine has
    # taken more than 0.9 s to answer).
    retry_after = int(response.headers["retry-after"])
    assert math.ceil(11.9 - since_mark_s) <= retry_after <= 12
    assert response.json() == {
        "error": {
            "message": f"Model `tiny` failed to load: CUDA out of memory. Retrying in {retry_after} s.",
            "type": "service_unavailable",
            "param": None,
            "code": "model_load_failed",
        }
    }
    assert not await redis.exists(keys.job_stream(MODEL))
    assert not await redis.exists(keys.demand_stream(), keys.demand_index())


async def test_the_openai_client_sees_the_failed_load(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    await mark_failed(redis, "no room", retry_in_s=5.0)
    async with serving(settings_for(redis_server.url)) as client:
        sdk = AsyncOpenAI(base_url=f"{client.base_url}/v1", api_key="unused", max_retries=0)
        with pytest.raises(InternalServerError) as info:
            await sdk.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Hi"}])
    assert info.value.status_code == 503
    assert info.value.code == "model_load_failed"
    assert info.value.response.headers["retry-after"] in {"4", "5"}


# --- a load that fails while the job waits ---------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_a_load_failed_chunk_is_a_503_with_its_retry_after(
    redis: aioredis.Redis, redis_server: PrivateRedis, stream: bool
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        request = asyncio.create_task(client.post("/v1/chat/completions", json={**BODY, "stream": stream}))
        job = await next_job(redis)
        error = JobError(code="load_failed", message="weights not found", retry_after_s=29.5)
        await write_chunks(redis, job.id, Chunk(error=error))
        response = await request
    assert response.status_code == 503
    assert response.headers["retry-after"] == "30"
    assert response.json()["error"]["code"] == "model_load_failed"
    assert (
        response.json()["error"]["message"]
        == "Model `tiny` failed to load: weights not found. Retrying in 30 s."
    )


# --- the first byte --------------------------------------------------------------------------------


async def test_a_streamed_error_within_the_budget_is_a_real_status(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        request = asyncio.create_task(client.post("/v1/chat/completions", json={**BODY, "stream": True}))
        job = await next_job(redis)
        await asyncio.sleep(0.3)  # the budget (2 s) is not spent: headers are still held
        error = JobError(code="invalid_request", message="The prompt is too long.")
        await write_chunks(redis, job.id, Chunk(error=error))
        response = await request
    assert response.status_code == 400
    assert response.json()["error"] == {
        "message": "The prompt is too long.",
        "type": "invalid_request_error",
        "param": None,
        "code": None,
    }
    # The job ended with its error: nothing to cancel.
    assert not await redis.exists(keys.cancel_mark(job.id))


async def test_past_the_budget_progress_comments_flow_until_the_first_token(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    advertised_at = time.monotonic()
    await advertise(redis, worker_record("w1", loading_slot(elapsed_s=12.0, expected_s=50.0)))
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, load_progress_every_s=0.2)
    async with serving(settings) as client:
        request = asyncio.create_task(
            client.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=RESUMABLE)
        )
        job = await next_job(redis)
        await asyncio.sleep(0.7)
        await write_chunks(
            redis,
            job.id,
            Chunk(text="Hello"),
            Chunk(text="!", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=2)),
        )
        response = await request
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    blocks = sse_blocks(response.text)
    comments = [b for b in blocks if b.startswith(":")]
    assert len(comments) >= 3
    assert comments[0] in with_load_time_passed(
        ": loading tiny, 12 s of about 50 s", time.monotonic() - advertised_at
    )
    # Comments come first, each a block of its own; the events follow as usual.
    assert blocks[: len(comments)] == comments
    assert all("\n" not in c for c in comments)
    events = blocks[len(comments) :]
    assert events[-1] == "data: [DONE]"
    texts = [json.loads(e[len("data: ") :])["choices"][0]["delta"].get("content") for e in events[:-1]]
    assert "".join(t or "" for t in texts) == "Hello!"


PROGRESS_CASES = {
    "nobody holds it": ((), ": waiting for a worker to load tiny (1 job queued)"),
    "loading, length unknown": (
        (lambda: loading_slot(elapsed_s=3.0, expected_s=None),),
        ": loading tiny, 3 s of about ?",
    ),
    "warm and busy": (
        (lambda: SlotStatus(model=MODEL, state="warm", replica=0, in_flight=2),),
        ": waiting for tiny (1 job queued, 2 running)",
    ),
}


@pytest.mark.parametrize("case", list(PROGRESS_CASES))
async def test_progress_comments_say_what_the_request_waits_for(
    redis: aioredis.Redis, redis_server: PrivateRedis, case: str
) -> None:
    slot_factories, comment = PROGRESS_CASES[case]
    advertised_at = time.monotonic()
    if slot_factories:
        await advertise(redis, worker_record("w1", *(make() for make in slot_factories)))
    settings = settings_for(redis_server.url, first_byte_budget_s=0.05, load_progress_every_s=5)
    body = {**BODY, "stream": True}
    async with (
        serving(settings) as client,
        client.stream("POST", "/v1/chat/completions", json=body, headers=RESUMABLE) as response,
    ):
        assert response.status_code == 200
        first_line = await anext(response.aiter_lines())
    assert first_line in with_load_time_passed(comment, time.monotonic() - advertised_at)


def with_load_time_passed(comment: str, waited_s: float) -> set[str]:
    """`comment` as it reads after a load it reports on ran `waited_s` longer (a slow machine
    takes more than a second to start the front door)."""
    match = re.search(r"(\d+) s of about", comment)
    if match is None:
        return {comment}
    elapsed = int(match.group(1))
    return {
        comment[: match.start(1)] + str(seconds) + comment[match.end(1) :]
        for seconds in range(elapsed, round(elapsed + waited_s) + 1)
    }


async def test_the_openai_client_ignores_progress_comments(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    await advertise(redis, worker_record("w1", loading_slot(elapsed_s=1.0, expected_s=5.0)))
    settings = settings_for(redis_server.url, first_byte_budget_s=0.05, load_progress_every_s=0.1)

    async def worker_after_a_load() -> None:
        job = await next_job(redis)
        await asyncio.sleep(0.5)
        await write_chunks(
            redis,
            job.id,
            Chunk(text="Hi"),
            Chunk(text=" there", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=2)),
        )

    async with serving(settings) as client:
        worker = asyncio.create_task(worker_after_a_load())
        sdk = AsyncOpenAI(base_url=f"{client.base_url}/v1", api_key="unused", max_retries=0)
        stream = await sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], stream=True
        )
        texts = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
        await worker
    assert "".join(t or "" for t in texts) == "Hi there"


# --- deadlines during a load -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("slots", "costs", "retry_after"),
    [
        ((lambda: loading_slot(elapsed_s=10.0, expected_s=50.0),), (), {"40", "39"}),
        ((lambda: loading_slot(elapsed_s=10.0, expected_s=None),), (20.0, 60.0, 40.0), {"30", "29"}),
    ],
)
async def test_a_deadline_during_a_load_is_a_503_with_the_time_left(
    redis: aioredis.Redis,
    redis_server: PrivateRedis,
    slots: tuple[Callable[[], SlotStatus], ...],
    costs: tuple[float, ...],
    retry_after: set[str],
) -> None:
    # An idle worker of the same kind: its measured load times count.
    await advertise(redis, worker_record("w1", *(make() for make in slots)), worker_record("w2"))
    await record_load_times(redis, MODEL, "cpu", *costs)
    async with serving(settings_for(redis_server.url, timeout_s=0.3)) as client:
        response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 503
    assert response.headers["retry-after"] in retry_after
    error = response.json()["error"]
    assert error["code"] == "model_loading"
    assert error["type"] == "service_unavailable"
    assert error["message"].startswith("Model `tiny` is still loading")
    assert "the request was dropped" in error["message"]
    (job_id,) = [k async for k in redis.scan_iter(match=keys.cancel_mark("*"))]
    assert job_id


async def test_a_deadline_with_workers_alive_but_no_load_started_is_a_504_naming_the_queue(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    # Idle workers that may hold the model, and measured loads: none is loading it now.
    await advertise(redis, worker_record("w1"), worker_record("w2"))
    await record_load_times(redis, MODEL, "cpu", 20.0, 60.0)
    async with serving(settings_for(redis_server.url, timeout_s=0.3)) as client:
        response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 504
    error = response.json()["error"]
    assert error["code"] == "timeout"
    assert "in the queue of model `tiny`" in error["message"]
    assert "load" not in error["message"]
    assert "retry-after" not in response.headers


async def test_a_deadline_after_a_worker_claimed_the_load_is_a_503_though_its_heartbeat_lags(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    # The worker took the model's first replica lease and is starting the load; a busy worker's
    # heartbeat has not said "loading" yet.
    await advertise(redis, worker_record("w1"))
    await redis.set(keys.replica_lease(MODEL, 0), "w1", px=10_000)
    async with serving(settings_for(redis_server.url, timeout_s=0.3)) as client:
        response = await client.post("/v1/chat/completions", json=BODY)
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "model_loading"


async def test_a_deadline_after_the_only_worker_died_says_no_worker_was_alive(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    await advertise(redis, worker_record("w1"))
    async with serving(settings_for(redis_server.url, timeout_s=1.5)) as client:
        waiting = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
        await next_job(redis)  # admitted while the worker was alive
        await redis.delete(keys.worker_record("w1"))  # it died: its record expired
        response = await waiting
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["code"] == "no_worker_alive"
    assert error["message"].startswith("No worker that may hold the model `tiny` was alive")
    assert "load" not in error["message"]
    assert int(response.headers["retry-after"]) >= 1


async def test_a_deadline_while_the_model_is_warm_stays_a_504(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    await advertise(redis, worker_record("w1", SlotStatus(model=MODEL, state="warm", replica=0, in_flight=9)))
    async with serving(settings_for(redis_server.url, timeout_s=0.3)) as client:
        response = await client.post("/v1/chat/completions", json={**BODY, "stream": True})
    assert response.status_code == 504
    assert response.json()["error"]["code"] == "timeout"
    assert "retry-after" not in response.headers


async def test_a_deadline_after_the_headers_is_an_error_event(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    await advertise(redis, worker_record("w1", loading_slot(elapsed_s=5.0, expected_s=65.0)))
    settings = settings_for(
        redis_server.url, timeout_s=0.5, first_byte_budget_s=0.1, load_progress_every_s=0.2
    )
    async with serving(settings) as client:
        response = await client.post("/v1/chat/completions", json={**BODY, "stream": True}, headers=RESUMABLE)
    assert response.status_code == 200
    blocks = sse_blocks(response.text)
    assert blocks[0].startswith(": loading tiny")
    assert blocks[-1] == "data: [DONE]"
    error = msgspec.json.decode(blocks[-2][len("data: ") :])["error"]
    assert error["code"] == "model_loading"
    # The suggested retry counts down from the load's expected end: a second may pass meanwhile.
    assert re.search(r"Retry in (59|60) s\.", error["message"]), error["message"]
    assert len([k async for k in redis.scan_iter(match=keys.cancel_mark("*"))]) == 1


async def test_a_client_that_leaves_during_the_wait_leaves_a_cancel_mark(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    await advertise(redis, worker_record("w1", loading_slot(elapsed_s=1.0, expected_s=60.0)))
    settings = settings_for(redis_server.url, first_byte_budget_s=0.05, load_progress_every_s=0.1)
    body = {**BODY, "stream": True}
    async with serving(settings) as client:
        async with client.stream("POST", "/v1/chat/completions", json=body, headers=RESUMABLE) as response:
            assert (await anext(response.aiter_lines())).startswith(": loading tiny")
        job = await next_job(redis)
        for _ in range(250):
            if await redis.exists(keys.cancel_mark(job.id)):
                break
            await asyncio.sleep(0.02)
        assert await redis.exists(keys.cancel_mark(job.id))


async def test_a_warm_model_reads_no_status_on_the_hot_path(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        await redis.config_resetstat()
        started = time.monotonic()
        for _ in range(3):
            request = asyncio.create_task(client.post("/v1/chat/completions", json={**BODY, "stream": True}))
            job = await next_job(redis)
            await redis.delete(keys.job_stream(MODEL))
            await answer_ok(redis, job.id)
            response = await request
            assert response.status_code == 200
            assert not any(line.startswith(":") for line in response.text.splitlines())
        took_s = time.monotonic() - started
    # Admission and the enqueue are one script each (the queue depth admission reads with XLEN and
    # XPENDING, and the enqueue's GET of the failure mark, count inside them); no status is read.
    # The live workers (may one hold the model?) are read once a second for every request together.
    stats = await redis.info("commandstats")
    commands = {name.removeprefix("cmdstat_"): stat["calls"] for name, stat in stats.items()}
    assert "evalsha" in commands
    assert not commands.keys() & {"mget", "lrange"}
    # Once, and once more for every second the requests took (a loaded machine can stretch them).
    assert commands.get("zrangebyscore", 0) <= 1 + int(took_s / WORKERS_MAX_AGE_S), took_s
