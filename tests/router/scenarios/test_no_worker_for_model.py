"""A model that no live worker may hold is answered at once, and `/readyz` tells, per model."""

from __future__ import annotations

import asyncio

import msgspec
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.readiness import NO_WORKER_FOR_MODEL
from tests.support.front_door_harness import (
    BODY,
    MODEL,
    advertise,
    answer_ok,
    next_job,
    serving,
    settings_for,
    worker_record,
)

OTHER = "other"
MODELS = [ModelConfig(name=MODEL, path="/nonexistent"), ModelConfig(name=OTHER, path="/nonexistent")]


async def test_a_model_no_live_worker_may_hold_is_a_503_at_once(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    only_other = msgspec.structs.replace(worker_record("w1"), allowed=(OTHER,))
    await advertise(redis, only_other)
    async with serving(settings_for(redis_server.url, timeout_s=120, models=MODELS)) as client:
        async with asyncio.timeout(5):  # not the request's deadline
            response = await client.post("/v1/chat/completions", json={**BODY, "stream": True})
        assert response.status_code == 503
        error = response.json()["error"]
        assert error["code"] == "no_worker_for_model"
        assert MODEL in error["message"]
        assert int(response.headers["Retry-After"]) >= 1
        assert not await redis.exists(keys.job_stream(MODEL))  # nothing queued for nobody

        ready = await client.get("/readyz")
        assert ready.status_code == 200
        assert ready.json()["models"] == {MODEL: False, OTHER: True}
        not_ready = await client.get("/readyz", params={"model": MODEL})
        assert not_ready.status_code == 503
        assert not_ready.json()["error"]["code"] == NO_WORKER_FOR_MODEL
        assert (await client.get("/readyz", params={"model": OTHER})).status_code == 200
        assert (await client.get("/readyz", params={"model": "unknown"})).status_code == 404

        # A worker that may hold any model comes up (and beats, as a live worker does): once the
        # front door's copy of the worker records is renewed (it is at most a second old), the
        # model is served.
        loop = asyncio.get_running_loop()
        came_up = loop.time()
        while True:
            await advertise(redis, only_other, worker_record("w2"))
            if (last := await client.get("/readyz", params={"model": MODEL})).status_code == 200:
                break
            if loop.time() - came_up > 5:
                raise AssertionError(
                    f"the model is still not served 5 s after a worker that may hold it came up: {last.text}"
                )
            await asyncio.sleep(0.1)
        request = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
        job = await next_job(redis)
        await answer_ok(redis, job.id)
        assert (await request).status_code == 200


async def test_with_no_live_worker_at_all_a_job_waits_for_the_first_one(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    # Scale from zero: a worker that is starting takes the job when it comes up.
    async with serving(settings_for(redis_server.url, models=MODELS)) as client:
        request = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
        job = await next_job(redis)
        await answer_ok(redis, job.id)
        assert (await request).status_code == 200
