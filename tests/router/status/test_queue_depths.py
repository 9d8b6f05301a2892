"""The queues' read: the models with work are read, every other model waits for nothing; scrapes share it."""

from __future__ import annotations

import redis.asyncio as aioredis

from router.status.model_status import ModelStatusReader, queue_depths
from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.demand import note_demand
from switchboard.wire import TIERS


async def test_only_the_models_with_work_are_read(redis: aioredis.Redis) -> None:
    pipe = redis.pipeline(transaction=False)
    for _ in range(2):
        pipe.xadd(keys.job_stream("busy"), {keys.JOB_FIELD: b"x"})
    note_demand(pipe, "busy", "job-2")
    await pipe.execute()
    before = (await redis.info("commandstats")).get("cmdstat_xlen", {}).get("calls", 0)
    depths = await queue_depths(redis, [f"m{n}" for n in range(500)] + ["busy"])
    after = (await redis.info("commandstats"))["cmdstat_xlen"]["calls"]
    assert after - before == len(TIERS), "one model with work: its tiers' streams read, no other"
    waiting, oldest_s = depths["busy"]
    assert waiting == 2 and oldest_s >= 0
    assert depths["m7"] == (0, 0.0) and len(depths) == 501


async def test_scrapes_within_the_max_age_share_one_read(redis: aioredis.Redis) -> None:
    reader = ModelStatusReader(redis, [ModelConfig(name="busy", path="unused")])
    pipe = redis.pipeline(transaction=False)
    pipe.xadd(keys.job_stream("busy"), {keys.JOB_FIELD: b"x"})
    note_demand(pipe, "busy", "job-1")
    await pipe.execute()
    first = await reader.queue_depths(max_age_s=60)
    await redis.xadd(keys.job_stream("busy"), {keys.JOB_FIELD: b"x"})
    assert await reader.queue_depths(max_age_s=60) == first, "the same read, not a new one"
    assert (await reader.queue_depths(max_age_s=0))["busy"][0] == 2
