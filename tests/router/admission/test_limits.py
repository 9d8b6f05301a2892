"""Admission against a real Redis: per-key rpm, tpm and parallel limits, in-flight and queue bounds."""

from __future__ import annotations

import asyncio
import time
import uuid

import pytest
import redis.asyncio as aioredis

from router.admission.auth import Caller
from router.admission.limits import Admission, Ticket, estimate_tokens
from router.openai.errors import TooManyRequestsError
from switchboard import keys
from switchboard.config import LimitsConfig
from switchboard.wire import ChatMessage, Job, SamplingParams
from tests.support.callers import key_caller, key_owner

MODEL = "tiny"


def job(
    *, prompt: str = "Hi", max_tokens: int | None = 10, deadline_s: float = 60.0, model: str = MODEL
) -> Job:
    now = time.time()
    return Job(
        id=uuid.uuid4().hex,
        model=model,
        prompts=(prompt,),
        sampling=SamplingParams(max_tokens=max_tokens),
        created=now,
        deadline=now + deadline_s,
    )


async def refused(admission: Admission, one: Job, caller: Caller) -> TooManyRequestsError:
    with pytest.raises(TooManyRequestsError) as caught:
        await admission.admit(one, caller)
    return caught.value


def test_estimate_counts_prompt_characters_and_max_tokens() -> None:
    assert estimate_tokens(job(prompt="x" * 40, max_tokens=10), 256) == 20
    assert estimate_tokens(job(prompt="x" * 41, max_tokens=None), 256) == 11 + 256
    messages = (ChatMessage(role="system", content="a" * 8), ChatMessage(role="user", content="b" * 8))
    chat = Job(id="c", model=MODEL, messages=messages, sampling=SamplingParams(), created=0, deadline=1)
    assert estimate_tokens(chat, 100) == 4 + 100
    # Every choice of every prompt may use max_tokens; token-id prompts count their ids.
    several = Job(
        id="s",
        model=MODEL,
        prompts=("x" * 8, (1, 2, 3)),
        sampling=SamplingParams(max_tokens=10, n=3),
        created=0,
        deadline=1,
    )
    assert estimate_tokens(several, 256) == 2 + 3 + 2 * 3 * 10


async def test_requests_per_minute_refuse_with_retry_after_from_the_bucket(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", rpm=2)
    for _ in range(2):
        await (await admission.admit(job(), caller)).release(None)
    error = await refused(admission, job(), caller)
    assert error.status_code == 429
    assert error.code == "rate_limit_exceeded"
    assert error.error_type == "requests"
    # One request comes back every 30 s at 2 per minute.
    assert 28 <= int(error.headers["Retry-After"]) <= 30
    assert "requests per minute" in error.message
    # Another key's bucket is its own.
    await admission.admit(job(), key_caller("bob", rpm=2))


async def test_tokens_are_reserved_from_an_estimate_and_settled_with_real_usage(
    redis: aioredis.Redis,
) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", tpm=100)
    first = await admission.admit(job(max_tokens=60), caller)  # about 61 tokens reserved
    error = await refused(admission, job(max_tokens=60), caller)
    assert error.error_type == "tokens"
    assert 10 <= int(error.headers["Retry-After"]) <= 15  # 22 tokens short at 100 per minute
    # The job used 11 tokens: 50 come back, and the same request now fits.
    await first.release(11)
    await admission.admit(job(max_tokens=60), caller)


async def test_a_request_larger_than_a_minute_of_tokens_waits_for_a_full_bucket(
    redis: aioredis.Redis,
) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", tpm=50)
    ticket = await admission.admit(job(max_tokens=500), caller)
    await ticket.release(None)  # the estimate stands: 501 tokens, ten minutes of them
    error = await refused(admission, job(max_tokens=1), caller)
    assert int(error.headers["Retry-After"]) > 60 * 9


async def test_parallel_requests_are_limited_per_key_until_released(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", max_parallel=2)
    held = [await admission.admit(job(), caller) for _ in range(2)]
    error = await refused(admission, job(), caller)
    assert error.code == "rate_limit_exceeded"
    assert "2 requests in flight" in error.message
    assert error.headers["Retry-After"] == "1"
    await admission.admit(job(), key_caller("bob", max_parallel=2))  # bob is not held up by alice
    await held[0].release(None)
    await held[0].release(None)  # idempotent: frees one slot, not two
    await admission.admit(job(), caller)
    await refused(admission, job(), caller)


async def test_a_slot_released_soon_is_free_once_the_releases_are_drained(
    redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", max_parallel=1, tpm=1000)
    ticket = await admission.admit(job(max_tokens=100), caller)
    assert ticket.answer_waits_for_release, "a key with a parallel limit waits for its release"
    assert not (await admission.admit(job(), key_caller("bob"))).answer_waits_for_release
    ticket.release_soon(10)
    ticket.release_soon(10)  # idempotent: one release
    await admission.drain(timeout_s=5)
    assert await redis.zcard(keys.key_in_flight(key_owner("alice"))) == 0
    assert await admission.admit(job(), caller)
    # A release that fails is logged, not raised: the slot expires past the job's deadline.
    failing = Ticket(admission, "slot-x", key_caller("carol", tpm=1000), reserved_tokens=5)
    await redis.set(keys.key_rate(key_owner("carol")), "not a hash")
    with caplog.at_level("WARNING"):
        failing.release_soon(1)
        await admission.drain(timeout_s=5)
    assert "could not release" in caplog.text


async def test_a_slot_never_released_expires_past_the_jobs_deadline(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", max_parallel=1)
    # A deadline long gone: the slot lives its minimum (1 s), as if its front door had died.
    await admission.admit(job(deadline_s=-keys.SLOT_GRACE_S), caller)
    await refused(admission, job(), caller)
    await asyncio.sleep(1.2)
    await admission.admit(job(), caller)
    assert 0 < await redis.pttl(keys.key_in_flight(key_owner("alice"))) <= (60 + keys.SLOT_GRACE_S) * 1000


async def test_in_flight_requests_are_bounded_across_callers(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig(max_in_flight=2))
    first = await admission.admit(job(), Caller(name=None))
    await admission.admit(job(), key_caller("alice"))
    error = await refused(admission, job(), key_caller("bob"))
    assert error.code == "server_busy"
    await first.release(None)
    await admission.admit(job(), key_caller("bob"))
    assert await redis.zcard(keys.in_flight()) == 2


async def test_queue_depth_counts_jobs_no_worker_has_taken(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig(max_queue_depth=2))
    stream = keys.job_stream(MODEL)
    for _ in range(2):
        await redis.xadd(stream, {"job": b"x"})
    error = await refused(admission, job(), Caller(name=None))
    assert error.code == "queue_full"
    assert "`tiny`" in error.message
    await admission.admit(job(model="other"), Caller(name=None))  # another model's queue is its own
    # A worker takes one: it is running, not waiting.
    await redis.xgroup_create(stream, keys.JOB_GROUP, id="0")
    await redis.xreadgroup(keys.JOB_GROUP, "w1", {stream: ">"}, count=1)
    await admission.admit(job(), Caller(name=None))


async def test_a_refusal_commits_nothing(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig(max_in_flight=1))
    held = await admission.admit(job(), Caller(name=None))
    caller = key_caller("alice", rpm=1, tpm=1000, max_parallel=1)
    await refused(admission, job(), caller)  # server busy: alice's buckets and slots are untouched
    assert not await redis.exists(keys.key_rate(key_owner("alice")), keys.key_in_flight(key_owner("alice")))
    await held.release(None)
    ticket: Ticket = await admission.admit(job(), caller)
    assert await redis.exists(keys.key_rate(key_owner("alice")), keys.key_in_flight(key_owner("alice"))) == 2
    await ticket.release(5)
    assert not await redis.zcard(keys.key_in_flight(key_owner("alice")))
    assert not await redis.zcard(keys.in_flight())


async def test_every_admission_key_has_an_expiry_and_the_prefix(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    await admission.admit(job(), key_caller("alice", rpm=5, tpm=500, max_parallel=3))
    written = [k.decode() async for k in redis.scan_iter(match="*")]
    assert sorted(written) == sorted(
        [keys.key_rate(key_owner("alice")), keys.key_in_flight(key_owner("alice")), keys.in_flight()]
    )
    for key in written:
        assert key.startswith(f"{keys.PREFIX}:")
        assert await redis.pttl(key) > 0


async def test_an_admission_retried_after_a_lost_reply_takes_nothing_twice(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", rpm=2, max_parallel=1)
    one = job()
    await admission.admit(one, caller)
    await admission.admit(one, caller)  # redis-py ran the script again on a fresh connection
    assert await redis.zcard(keys.in_flight()) == 1
    await admission.admit(job(), key_caller("alice", rpm=2))  # the bucket still has the second request


async def test_each_resumed_reader_of_a_job_holds_a_slot_of_its_own(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig(max_queue_depth=1))
    caller = key_caller("alice", max_parallel=2)
    one = job()
    await redis.xadd(keys.job_stream(MODEL), {"job": b"x"})  # the queue is full: a resume queues nothing
    readers = [await admission.admit_resume(one, caller) for _ in range(2)]
    assert len({ticket.slot for ticket in readers}) == 2
    assert await redis.zcard(keys.key_in_flight(key_owner("alice"))) == 2
    error = await refused_resume(admission, one, caller)
    assert "2 requests in flight" in error.message
    await readers[0].release(None)
    await admission.admit_resume(one, caller)


async def test_a_resume_takes_a_request_and_reserves_only_its_answers_tokens(redis: aioredis.Redis) -> None:
    admission = Admission(redis, LimitsConfig())
    caller = key_caller("alice", rpm=2, tpm=100)
    one = job(prompt="x" * 400, max_tokens=60)  # 100 prompt tokens: a queued job would take them all
    ticket = await admission.admit_resume(one, caller)
    assert ticket.reserved_tokens == 60
    await ticket.release(0)  # refused afterwards (another key's job): its tokens all come back
    await admission.admit_resume(one, caller)
    error = await refused_resume(admission, one, caller)
    assert error.error_type == "requests"


async def refused_resume(admission: Admission, one: Job, caller: Caller) -> TooManyRequestsError:
    with pytest.raises(TooManyRequestsError) as caught:
        await admission.admit_resume(one, caller)
    return caught.value
