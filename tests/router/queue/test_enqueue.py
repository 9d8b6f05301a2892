"""Queueing a job against a real Redis: one entry and one record per job, however often it is sent."""

from __future__ import annotations

import time

import pytest
import redis.asyncio as aioredis

from router.queue.enqueue import JobQueue, UnknownEntry
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


OWNER = "ab" * 32  # a key's identity: the SHA-256 of its secret


async def test_a_job_submitted_again_after_a_lost_reply_is_queued_once(redis: aioredis.Redis) -> None:
    queue = JobQueue(redis, TaskSet("test"))
    one = job()
    assert await queue.submit(one, owner=OWNER) is None
    assert await queue.submit(one, owner=OWNER) is None  # redis-py ran the script again on a fresh connection
    assert await redis.xlen(keys.job_stream(MODEL)) == 1
    record = await redis.hgetall(keys.job_record(one.id))  # type: ignore[misc]
    # The job is its key's by the key's identity, not by its name ("alice").
    assert record == {b"tenant": OWNER.encode(), b"readers": b"1", b"model": MODEL.encode()}
    # It lives until the job's results would have expired after its deadline, not forever.
    assert 60 < await redis.ttl(keys.job_record(one.id)) <= 60 + keys.RESULT_TTL_S


async def results_of(redis: aioredis.Redis, job_id: str, *words: str) -> None:
    for position, word in enumerate(words, start=1):
        await redis.xadd(
            keys.result_stream(job_id), {"c": encode(Chunk(text=word)), "w": "w1"}, id=f"0-{position}"
        )


async def test_resuming_counts_a_reader_only_of_the_owners_kept_results_at_a_known_entry(
    redis: aioredis.Redis,
) -> None:
    queue = JobQueue(redis, TaskSet("test"))
    one = job(tenant=None)
    await queue.submit(one, owner="")
    assert await queue.resume(one.id, "0-1", owner="") is None, "no result stream yet: nothing to resume"
    await results_of(redis, one.id, "a", "b", "c")
    assert await queue.resume(one.id, "0-2", owner=OWNER) is None, "another key's job reads as unknown"
    with pytest.raises(UnknownEntry):
        await queue.resume(one.id, "0-9", owner="")
    assert await redis.hget(keys.job_record(one.id), "readers") == b"1", "refusals count nobody"  # type: ignore[misc]
    found = await queue.resume(one.id, "0-2", owner="")
    assert found is not None
    assert [chunk.text for chunk in found.earlier] == ["a", "b"], "the chunks the client had"
    assert found.model == MODEL, "the model it was queued for (a route's caller keeps its version)"
    record = await redis.hgetall(keys.job_record(one.id))  # type: ignore[misc]
    assert (record[b"readers"], record[b"resumes"]) == (b"2", b"1")
    await queue.leave(one.id)
    assert not await redis.exists(keys.job_record(one.id), keys.result_stream(one.id))
    assert await redis.exists(keys.cancel_mark(one.id))


async def test_a_job_is_given_up_only_once_the_last_reader_to_leave_waited_its_grace(
    redis: aioredis.Redis,
) -> None:
    queue = JobQueue(redis, TaskSet("test"))
    one = job()
    await queue.submit(one, owner=OWNER)
    await results_of(redis, one.id, "a", "b")
    first = await queue.step_away(one.id)  # the client that sent it left mid-stream
    assert 0 < await redis.ttl(keys.result_stream(one.id)) <= keys.RESULT_TTL_S
    await queue.resume(one.id, "0-1", owner=OWNER)
    assert not await queue.give_up(one.id, leaves=first), "a client came back and reads"
    second = await queue.step_away(one.id)  # and left too: its own grace runs now
    assert not await queue.give_up(one.id, leaves=first), "the first grace is not the last one's"
    assert await queue.give_up(one.id, leaves=second)
    assert not await redis.exists(keys.job_record(one.id), keys.result_stream(one.id))
    assert await redis.exists(keys.cancel_mark(one.id))


async def test_a_job_that_ended_unread_is_given_up_without_a_cancel_mark(redis: aioredis.Redis) -> None:
    queue = JobQueue(redis, TaskSet("test"))
    one = job()
    await queue.submit(one, owner=OWNER)
    await results_of(redis, one.id, "a")
    leaves = await queue.step_away(one.id)
    await redis.hset(keys.job_record(one.id), keys.DONE_FIELD, 1)  # type: ignore[misc]
    assert await queue.give_up(one.id, leaves=leaves)
    assert not await redis.exists(
        keys.job_record(one.id), keys.result_stream(one.id), keys.cancel_mark(one.id)
    )
