"""Admission and enqueue in one round trip (`admit_enqueue.lua`), against a real Redis: each limit
refuses as admission alone did, and a refused job leaves nothing behind; a model whose load failed
gives the slots back; a call sent again queues the job once."""

from __future__ import annotations

import time
import uuid

import pytest
import redis.asyncio as aioredis

from router.admission.limits import Admission
from router.openai.errors import TooManyRequestsError
from router.queue.enqueue import JobQueue
from switchboard import keys
from switchboard.config import LimitsConfig
from switchboard.tasks import TaskSet
from switchboard.wire import Job, LoadFailure, SamplingParams, encode
from tests.support.callers import key_caller, key_owner
from tests.support.jobs import admit_and_submit

MODEL = "tiny"


def job() -> Job:
    """A job of about 11 tokens (a 2-character prompt and 10 to complete)."""
    now = time.time()
    return Job(
        id=uuid.uuid4().hex,
        model=MODEL,
        prompts=("Hi",),
        sampling=SamplingParams(max_tokens=10),
        created=now,
        deadline=now + 60,
    )


# One limit each, met by the second job of the same caller: (caller, bounds, the 429's code).
LIMITS = {
    "rpm": (key_caller("alice", rpm=1), LimitsConfig(), "rate_limit_exceeded"),
    "tpm": (key_caller("alice", tpm=15), LimitsConfig(), "rate_limit_exceeded"),
    "parallel": (key_caller("alice", max_parallel=1), LimitsConfig(), "rate_limit_exceeded"),
    "in_flight": (key_caller("alice"), LimitsConfig(max_in_flight=1), "server_busy"),
    "queue": (key_caller("alice"), LimitsConfig(max_queue_depth=1), "queue_full"),
}


async def queued_jobs(redis: aioredis.Redis) -> int:
    return int(await redis.xlen(keys.job_stream(MODEL)))


@pytest.mark.parametrize("limit", sorted(LIMITS))
async def test_each_limit_refuses_the_job_and_leaves_nothing_behind(
    redis: aioredis.Redis, limit: str
) -> None:
    caller, bounds, code = LIMITS[limit]
    admission, queue = Admission(redis, bounds), JobQueue(redis, TaskSet("test"))
    first = job()
    assert await admit_and_submit(queue, first, admission.admitting(first, caller), owner="") is None
    before = {key async for key in redis.scan_iter()}
    second = job()
    admitting = admission.admitting(second, caller)
    with pytest.raises(TooManyRequestsError) as refused:
        await admit_and_submit(queue, second, admitting, owner="")
    assert refused.value.code == code, refused.value.body()
    assert "Retry-After" in refused.value.headers
    assert await queued_jobs(redis) == 1
    assert not await redis.exists(keys.job_record(second.id))
    assert await redis.zscore(keys.in_flight(), second.id) is None
    assert {key async for key in redis.scan_iter()} == before
    # Nothing is held: its ticket sends nothing when released.
    await admitting.ticket.release(0)
    assert await redis.zcard(keys.in_flight()) == 1


async def test_a_model_whose_load_failed_gets_its_failure_and_its_slots_back(redis: aioredis.Redis) -> None:
    now = time.time()
    failure = LoadFailure(
        model=MODEL, worker_id="w1", reason="out of memory", failed_at=now, retry_at=now + 30
    )
    await redis.set(keys.load_failure(MODEL), encode(failure))
    admission, queue = Admission(redis, LimitsConfig()), JobQueue(redis, TaskSet("test"))
    one = job()
    caller = key_caller("alice", rpm=10, max_parallel=1)
    admitting = admission.admitting(one, caller)
    assert await admit_and_submit(queue, one, admitting, owner="") == failure
    assert await queued_jobs(redis) == 0
    assert not await redis.exists(keys.job_record(one.id))
    assert not await redis.zcard(keys.in_flight())
    assert not await redis.zcard(keys.key_in_flight(key_owner("alice")))
    # As a ticket released unused: the request counted against the key's rpm.
    assert float(await redis.hget(keys.key_rate(key_owner("alice")), "req")) == pytest.approx(9, abs=0.1)


async def test_a_call_sent_again_queues_the_job_once(redis: aioredis.Redis) -> None:
    admission, queue = Admission(redis, LimitsConfig()), JobQueue(redis, TaskSet("test"))
    one, caller = job(), key_caller("alice", max_parallel=1)
    for _ in range(2):  # redis-py retrying a call whose reply a broken connection lost
        assert await admit_and_submit(queue, one, admission.admitting(one, caller), owner="") is None
    assert await queued_jobs(redis) == 1
    assert await redis.zcard(keys.in_flight()) == 1
