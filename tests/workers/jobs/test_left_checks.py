"""Whether the clients of jobs just sent to the engine have left, the checks of a burst in one round
trip (`workers.jobs.continuation.LeftChecks`), against a real Redis."""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from switchboard import keys
from workers.jobs.continuation import LeftChecks


async def transactions(redis: aioredis.Redis) -> int:
    stats = await redis.info("commandstats")
    return int(stats.get("cmdstat_multi", {}).get("calls", 0))


async def test_the_checks_of_jobs_started_together_share_one_round_trip(redis: aioredis.Redis) -> None:
    checks = LeftChecks(redis)
    assert not await checks.client_left("warm-up")  # loads the script
    await redis.set(keys.cancel_mark("gone-3"), b"1", ex=60)
    await redis.set(keys.cancel_mark("gone-7"), b"1", ex=60)
    before = await transactions(redis)
    answers = await asyncio.gather(*(checks.client_left(f"gone-{n}") for n in range(10)))
    assert [n for n, left in enumerate(answers) if left] == [3, 7]
    assert await transactions(redis) - before == 1
