"""Jobs waiting on a model's stream: length minus the jobs workers have taken, and the oldest's id."""

from __future__ import annotations

import redis.asyncio as aioredis

from switchboard import keys, lua
from switchboard.queue_depth import JobsWaiting, QueueDepth, decode_depths, decode_each


async def _enqueue(redis: aioredis.Redis, model: str, count: int) -> list[str]:
    ids = [await redis.xadd(keys.job_stream(model), {keys.JOB_FIELD: b"x"}) for _ in range(count)]
    return [entry_id.decode() for entry_id in ids]


async def test_a_stream_no_worker_joined_has_every_entry_waiting(redis: aioredis.Redis) -> None:
    ids = await _enqueue(redis, "tiny", 3)
    depths = await JobsWaiting(redis).read(["tiny", "absent"])
    assert depths == {
        "tiny": QueueDepth(waiting=3, oldest_id=ids[0], length=3),
        "absent": QueueDepth(waiting=0, oldest_id="", length=0),
    }


async def test_taken_jobs_do_not_wait_and_the_oldest_is_the_first_not_taken(redis: aioredis.Redis) -> None:
    stream = keys.job_stream("tiny")
    ids = await _enqueue(redis, "tiny", 4)
    await redis.xgroup_create(stream, keys.JOB_GROUP, id="0")
    await redis.xreadgroup(keys.JOB_GROUP, "worker", {stream: ">"}, count=2)
    depths = await JobsWaiting(redis).read(["tiny"])
    assert depths["tiny"] == QueueDepth(waiting=2, oldest_id=ids[2], length=4)
    # A job that ends is acknowledged and deleted: it neither waits nor counts as taken.
    await redis.xack(stream, keys.JOB_GROUP, ids[0])
    await redis.xdel(stream, ids[0])
    assert (await JobsWaiting(redis).read(["tiny"]))["tiny"] == QueueDepth(
        waiting=2, oldest_id=ids[2], length=3
    )


async def test_all_taken_means_none_waiting(redis: aioredis.Redis) -> None:
    stream = keys.job_stream("tiny")
    await _enqueue(redis, "tiny", 2)
    await redis.xgroup_create(stream, keys.JOB_GROUP, id="0")
    await redis.xreadgroup(keys.JOB_GROUP, "worker", {stream: ">"})
    # Taken jobs still count in the stream's length: its model has work.
    assert (await JobsWaiting(redis).read(["tiny"]))["tiny"] == QueueDepth(waiting=0, oldest_id="", length=2)


async def test_the_read_joins_a_pipeline(redis: aioredis.Redis) -> None:
    ids = await _enqueue(redis, "tiny", 1)
    pipe = redis.pipeline(transaction=False)
    pipe.ping()
    await JobsWaiting(redis).add_to(pipe, ["tiny"])
    replies = await pipe.execute()
    assert decode_depths(["tiny"], replies[1]) == {"tiny": QueueDepth(waiting=1, oldest_id=ids[0], length=1)}


async def test_one_call_per_model_runs_by_its_sha_and_is_loaded_again_when_redis_lost_it(
    redis: aioredis.Redis,
) -> None:
    ids = await _enqueue(redis, "tiny", 2)
    jobs_waiting = JobsWaiting(redis)
    scripts = lua.ScriptRunner(redis)
    models = ["tiny", "absent"]
    expected = {
        "tiny": QueueDepth(waiting=2, oldest_id=ids[0], length=2),
        "absent": QueueDepth(waiting=0, oldest_id="", length=0),
    }
    for _ in range(2):
        await redis.script_flush()  # as after a Redis restart: the next run loads the script
        replies = await scripts.run(lambda calls: jobs_waiting.add_each_to(calls, models))
        assert decode_each(models, replies) == expected


def test_the_oldest_job_waited_since_its_entry_id() -> None:
    assert QueueDepth(waiting=1, oldest_id="1000000-3").oldest_waiting_s(now=1010.5) == 10.5
    assert QueueDepth(waiting=1, oldest_id="1000000-3").oldest_waiting_s(now=900.0) == 0.0
    assert QueueDepth(waiting=0, oldest_id="").oldest_waiting_s(now=1010.5) == 0.0
