"""Queueing a job against a real Redis: one entry and one record per job, however often it is sent."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from router.queue.enqueue import JobQueue
from switchboard import keys
from switchboard.tasks import TaskSet
from switchboard.wire import Chunk, Job, SamplingParams, encode

MODEL = "tiny"


def job(tenant: str | None = "alice") -> Job:
    now = time.time()
    return Job(
        id="0" * 32,
        model=MODEL,
        prompts=("Hi",),
        sampling=SamplingParams(max_tokens=3),
        created=now,
        deadline=now + 60,
        tenant=tenant,
    )


async def test_a_job_submitted_again_after_a_lost_reply_is_queued_once(redis: aioredis.Redis) -> None:
    queue = JobQueue(redis, TaskSet("test"))
    one = job()
    assert await queue.submit(one) is None
    assert await queue.submit(one) is None  # redis-py ran the script again on a fresh connection
    assert await redis.xlen(keys.job_stream(MODEL)) == 1
    record = await redis.hgetall(keys.job_record(one.id))  # type: ignore[misc]
    assert record == {b"tenant": b"alice", b"readers": b"1"}
    # It lives until the job's results would have expired after its deadline, not forever.
    assert 60 < await redis.ttl(keys.job_record(one.id)) <= 60 + keys.RESULT_TTL_S


async def test_resuming_counts_a_reader_and_names_the_tenant_only_while_results_exist(
    redis: aioredis.Redis,
) -> None:
    tasks = TaskSet("test")
    queue = JobQueue(redis, tasks)
    one = job(tenant=None)
    await queue.submit(one)
    assert await queue.resume(one.id, "0-1") is None, "no result stream yet: nothing to resume"
    for position, word in enumerate(["a", "b", "c"], start=1):
        await redis.xadd(
            keys.result_stream(one.id), {"c": encode(Chunk(text=word)), "w": "w1"}, id=f"0-{position}"
        )
    found = await queue.resume(one.id, "0-2")
    assert found is not None
    assert found.tenant == ""
    assert [chunk.text for chunk in found.earlier] == ["a", "b"], "the chunks the client had"
    assert await redis.hget(keys.job_record(one.id), "readers") == b"2"  # type: ignore[misc]
    await queue.leave(one.id, cancel=False, keep_results=True)
    assert await redis.hget(keys.job_record(one.id), "readers") == b"1"  # type: ignore[misc]
    await queue.leave(one.id, cancel=True, keep_results=False)
    assert not await redis.exists(keys.job_record(one.id), keys.result_stream(one.id))
    assert await redis.exists(keys.cancel_mark(one.id))
    await tasks.stop()
