"""Script calls of concurrent callers go to a real Redis as one pipeline, each caller with its own reply
or error, each call run exactly once, even after Redis lost its scripts."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard.lua.batched import ScriptBatch, answer
from tests.support.blocked_reader import blocked_on, entries_woken_with
from tests.support.counted_redis import CountedRoundTrips

# Counts its runs per key, and fails when asked to (ARGV[1] = "fail").
COUNTING = """
if ARGV[1] == 'fail' then return redis.error_reply('asked to fail') end
return redis.call('INCR', KEYS[1])
"""


async def test_concurrent_calls_share_one_round_trip_and_get_their_own_replies(redis: aioredis.Redis) -> None:
    counted = CountedRoundTrips(redis)
    batch = ScriptBatch(counted)  # type: ignore[arg-type]
    script = redis.register_script(COUNTING)
    first = await batch.run(script, ["alone"], ["ok"])
    assert (first, counted.round_trips) == (1, 1), "a lone call leaves at once"
    replies = await asyncio.gather(*(batch.run(script, [f"key-{i % 4}"], ["ok"]) for i in range(40)))
    # Made in one turn of the loop, the 40 calls went together.
    assert counted.round_trips == 2
    assert sorted(replies) == sorted(n for _ in range(4) for n in range(1, 11))
    assert [int(await redis.get(f"key-{i}")) for i in range(4)] == [10, 10, 10, 10]


# Adds one entry to the stream KEYS[1], as the admission's script queues a job.
QUEUEING = "return redis.call('XADD', KEYS[1], '*', 'job', ARGV[1])"


async def test_a_reader_blocked_on_a_stream_wakes_with_every_entry_the_batch_added(
    redis: aioredis.Redis,
) -> None:
    batch = ScriptBatch(redis)
    script = redis.register_script(QUEUEING)
    await batch.run(script, ["warm"], ["x"])  # the next calls share one batch
    reader = await blocked_on(redis, ["jobs"])  # as a worker waits for a model's jobs
    await asyncio.gather(*(batch.run(script, ["jobs"], [str(i)]) for i in range(5)))
    # Woken after the batch's first call, it would hold one job, and take the rest on its next read.
    assert entries_woken_with(await reader) == 5


async def test_a_failing_call_fails_its_caller_only(redis: aioredis.Redis) -> None:
    batch = ScriptBatch(redis)
    script = redis.register_script(COUNTING)
    results = await asyncio.gather(
        batch.run(script, ["a"], ["ok"]),
        batch.run(script, ["b"], ["fail"]),
        batch.run(script, ["c"], ["ok"]),
        return_exceptions=True,
    )
    assert results[0] == 1 and results[2] == 1
    assert isinstance(results[1], ResponseError) and "asked to fail" in str(results[1])


async def test_after_redis_lost_its_scripts_each_call_still_runs_once(redis: aioredis.Redis) -> None:
    batch = ScriptBatch(redis)
    script = redis.register_script(COUNTING)
    assert await batch.run(script, ["runs"], ["ok"]) == 1
    await redis.script_flush()  # as after a restart without persistence
    replies = await asyncio.gather(*(batch.run(script, ["runs"], ["ok"]) for _ in range(5)))
    assert sorted(replies) == [2, 3, 4, 5, 6]
    assert int(await redis.get("runs")) == 6


async def test_a_cancelled_caller_leaves_its_call_to_run(redis: aioredis.Redis) -> None:
    batch = ScriptBatch(redis)
    script = redis.register_script(COUNTING)
    blocker = asyncio.ensure_future(batch.run(script, ["first"], ["ok"]))
    cancelled = asyncio.ensure_future(batch.run(script, ["second"], ["ok"]))
    await asyncio.sleep(0)
    cancelled.cancel()
    assert await blocker == 1
    with pytest.raises(asyncio.CancelledError):
        await cancelled
    for _ in range(100):
        if await redis.get("second"):
            break
        await asyncio.sleep(0.01)
    assert int(await redis.get("second")) == 1


async def test_a_submitted_call_runs_without_its_caller_waiting_and_drain_waits_for_it(
    redis: aioredis.Redis,
) -> None:
    batch = ScriptBatch(redis)
    script = redis.register_script(COUNTING)
    replies = [batch.submit(script, ["submitted"], ["ok"]) for _ in range(3)]
    assert not any(reply.done() for reply in replies), "nothing was awaited: nothing has run yet"
    await batch.drain(timeout_s=5)
    assert sorted(reply.result() for reply in replies) == [1, 2, 3]
    assert int(await redis.get("submitted")) == 3


async def test_a_caller_cancelled_while_awaiting_its_answer_goes_on_only_once_the_call_has_run(
    redis: aioredis.Redis,
) -> None:
    batch = ScriptBatch(redis)
    script = redis.register_script(COUNTING)
    seen_after_cancel: list[bytes | None] = []

    async def caller() -> None:
        try:
            await answer(batch.submit(script, ["taken"], ["ok"]))
        except asyncio.CancelledError:
            # What a caller undoes after its cancellation must already be there to undo.
            seen_after_cancel.append(await redis.get("taken"))
            raise

    task = asyncio.ensure_future(caller())
    await asyncio.sleep(0)  # the call is in the batch, its reply not back
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert seen_after_cancel == [b"1"]


async def test_a_reply_nobody_waits_for_leaves_the_other_calls_of_its_batch_answered(
    redis: aioredis.Redis,
) -> None:
    batch = ScriptBatch(redis)
    script = redis.register_script(COUNTING)
    abandoned = batch.submit(script, ["abandoned"], ["ok"])
    kept = [batch.submit(script, [f"kept-{i}"], ["ok"]) for i in range(3)]
    abandoned.cancel()  # a caller cancelled twice stops waiting for its reply altogether
    assert await asyncio.gather(*kept) == [1, 1, 1]
    assert int(await redis.get("abandoned")) == 1, "its call still ran, once"
