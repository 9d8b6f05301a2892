"""Moving the jobs no worker has taken from one model's stream to another's, against a real Redis."""

from __future__ import annotations

import time

import redis.asyncio as aioredis

from router.queue.enqueue import JobQueue
from router.queue.move_waiting import move_waiting_jobs
from switchboard import keys
from switchboard.tasks import TaskSet
from switchboard.wire import Job, LoadFailure, SamplingParams, encode, job_decoder

CANARY, STABLE = "chat-v2", "chat-v1"
OWNER = "ab" * 32


def job(number: int) -> Job:
    now = time.time()
    return Job(
        id=f"{number:032x}",
        model=CANARY,
        prompts=("Hi",),
        sampling=SamplingParams(max_tokens=3),
        created=now,
        deadline=now + 60,
        route="chat",
    )


async def jobs_on(redis: aioredis.Redis, model: str) -> list[Job]:
    entries = await redis.xrange(keys.job_stream(model))
    return [job_decoder.decode(fields[keys.JOB_FIELD.encode()]) for _, fields in entries]


async def test_only_the_jobs_no_worker_took_move_keeping_their_id_record_and_order(
    redis: aioredis.Redis,
) -> None:
    queue = JobQueue(redis, TaskSet("test"))
    for number in range(5):
        await queue.submit(job(number), owner=OWNER)
    await redis.xgroup_create(keys.job_stream(CANARY), keys.JOB_GROUP, id="0")
    # A worker took the first two: they run on the canary, and stay its.
    taken = await redis.xreadgroup(keys.JOB_GROUP, "w1", {keys.job_stream(CANARY): ">"}, count=2)
    assert len(taken[0][1]) == 2

    assert await move_waiting_jobs(redis, CANARY, STABLE) == 3

    moved = await jobs_on(redis, STABLE)
    assert [j.id for j in moved] == [job(n).id for n in (2, 3, 4)], "in the order they came"
    assert {j.model for j in moved} == {STABLE} and {j.route for j in moved} == {"chat"}
    assert [j.id for j in await jobs_on(redis, CANARY)] == [job(n).id for n in (0, 1)]
    record = await redis.hgetall(keys.job_record(job(3).id))  # type: ignore[misc]
    assert record[b"model"] == STABLE.encode() and record[b"tenant"] == OWNER.encode()
    assert await redis.hget(keys.demand_index(), STABLE), "the stable version is noted as wanted"  # type: ignore[misc]

    # A move sent again (a retried command after a lost reply) queues nothing twice.
    assert await queue.submit(moved[0], owner="", moved=True) is None
    assert len(await jobs_on(redis, STABLE)) == 3
    assert await move_waiting_jobs(redis, CANARY, STABLE) == 0


async def test_a_stream_without_workers_moves_whole_and_a_failed_stable_load_does_not_lose_them(
    redis: aioredis.Redis,
) -> None:
    queue = JobQueue(redis, TaskSet("test"))
    for number in range(3):
        await queue.submit(job(number), owner=OWNER)
    failure = LoadFailure(
        model=STABLE, worker_id="w1", reason="out of memory", failed_at=time.time(), retry_at=time.time() + 30
    )
    await redis.set(keys.load_failure(STABLE), encode(failure))
    assert await move_waiting_jobs(redis, CANARY, STABLE) == 3
    # Queued all the same: their clients wait for the stable version's next load, not lose the job.
    assert len(await jobs_on(redis, STABLE)) == 3
    assert not await redis.exists(keys.job_stream(CANARY)) or not await jobs_on(redis, CANARY)
    assert await move_waiting_jobs(redis, "nothing-queued", STABLE) == 0
