"""Cancel marks are left for jobs still running, never for a job that has ended."""

from __future__ import annotations

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.cancel_marks import CancelMarks


async def test_a_running_job_gets_its_mark_with_its_lifetime(redis: aioredis.Redis) -> None:
    await CancelMarks(redis).leave("job-1")
    assert await redis.get(keys.cancel_mark("job-1")) == b"1"
    assert 0 < await redis.ttl(keys.cancel_mark("job-1")) <= keys.CANCEL_TTL_S


async def test_an_ended_job_gets_no_mark(redis: aioredis.Redis) -> None:
    await redis.hset(keys.job_record("job-2"), keys.DONE_FIELD, "1")
    await CancelMarks(redis).leave("job-2")
    assert await redis.exists(keys.cancel_mark("job-2")) == 0


async def test_a_mark_joins_a_pipeline(redis: aioredis.Redis) -> None:
    pipe = redis.pipeline(transaction=False)
    await CancelMarks(redis).leave("job-3", client=pipe)
    assert await pipe.execute() == [1]
    assert await redis.exists(keys.cancel_mark("job-3")) == 1
