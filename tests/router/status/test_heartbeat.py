"""The front door's heartbeat key lives while it runs, and every job names the front door waiting."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import BODY, answer_ok, next_job, serving, settings_for


async def test_a_front_door_beats_while_it_runs_and_its_jobs_name_it(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url)) as client:
        request = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
        job = await next_job(redis)
        assert job.router_id is not None
        alive = keys.router_alive(job.router_id)
        assert 0 < await redis.ttl(alive) <= keys.ROUTER_TTL_S
        await answer_ok(redis, job.id)
        assert (await request).status_code == 200
        await asyncio.sleep(keys.ROUTER_TTL_S + 0.5)  # refreshed, not merely set once
        assert await redis.exists(alive)
    assert not await redis.exists(alive)  # gone with its front door, not a TTL later
