"""Closing a run whose answer was read whole takes no turn of the event loop unless its key's
parallel limit needs the release first; either way its admission slot is given back."""

from __future__ import annotations

from collections.abc import AsyncIterator

import msgspec
import pytest
import redis.asyncio as aioredis

from router.admission.auth import ANONYMOUS, Caller
from router.front_door import FrontDoor
from router.intake.job import chat_job
from router.openai.chat import ChatCompletionRequest
from router.queue.held_answer import collect
from router.queue.run import JobRun
from router.telemetry.job_observer import FrontDoorJobObserver
from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Chunk, Usage
from tests.support.callers import key_caller, key_owner
from tests.support.front_door_harness import BODY, front_door_of, settings_for, write_chunks
from tests.support.waits import eventually

ANSWER = Chunk(text="Hello", finish_reason="stop", usage=Usage(prompt_tokens=3, completion_tokens=1))
REQUEST = msgspec.convert(BODY, ChatCompletionRequest)


@pytest.fixture
async def front_door(redis: aioredis.Redis, redis_server: PrivateRedis) -> AsyncIterator[FrontDoor]:
    async with front_door_of(settings_for(redis_server.url)) as door:
        yield door


async def answered_run(front_door: FrontDoor, caller: Caller) -> JobRun:
    """A run of `caller`'s whose one chunk was written and read."""
    job = chat_job(REQUEST, timeout_s=30)
    run = await front_door.runs.start(
        job,
        front_door.admission.admitting(job, caller),
        FrontDoorJobObserver(job, front_door.runs.observations),
    )
    await write_chunks(front_door.redis, job.id, ANSWER)
    assert await collect(run, within_s=10) == [ANSWER]
    return run


def completes_without_waiting(closing: object) -> bool:
    """Whether the coroutine `closing` ran to its end on its first step, never suspending."""
    try:
        closing.send(None)  # type: ignore[attr-defined]
    except StopIteration:
        return True
    closing.close()  # type: ignore[attr-defined]
    return False


async def test_a_run_read_whole_closes_at_once_and_its_slot_is_released_soon(
    front_door: FrontDoor, redis: aioredis.Redis
) -> None:
    run = await answered_run(front_door, ANONYMOUS)
    assert await redis.zcard(keys.in_flight()) == 1
    assert completes_without_waiting(run.close())
    await front_door.admission.drain(timeout_s=5)
    assert await redis.zcard(keys.in_flight()) == 0


async def test_a_run_of_a_key_with_a_parallel_limit_waits_for_its_release(
    front_door: FrontDoor, redis: aioredis.Redis
) -> None:
    caller = key_caller("alice", max_parallel=1)
    run = await answered_run(front_door, caller)
    assert await redis.zcard(keys.key_in_flight(key_owner("alice"))) == 1
    # Its next request may come the moment it has this answer: the close waits for Redis.
    assert not completes_without_waiting(run.close())

    async def released() -> bool:
        return await redis.zcard(keys.key_in_flight(key_owner("alice"))) == 0

    await eventually(released, what="the slot of alice's request given back")
