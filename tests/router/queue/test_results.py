"""The result reader leaves nothing behind: no subscription polled forever, no result stream kept
past its expiry; and it judges a job being enqueued across a Redis restart only once it is queued."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis

from router.admission.auth import ANONYMOUS
from router.front_door import FrontDoor
from router.intake.job import chat_job
from router.openai.chat import ChatCompletionRequest
from router.queue.results import BLOCK_MS, QUIET_S, ResultReader
from router.queue.subscription import ResultsLost, Subscription
from router.status.redis_health import RedisHealth
from router.telemetry.job_observer import FrontDoorJobObserver
from switchboard import keys
from switchboard.local.redis_server import PrivateRedis
from switchboard.lua.batched import ScriptBatch
from switchboard.redis_conn import blocking_client, pooled_client
from switchboard.tasks import TaskSet
from switchboard.wire import Chunk, Usage, encode
from tests.support.counted_redis import CountedRoundTrips
from tests.support.front_door_harness import BODY, MODEL, next_job, serving, settings_for
from tests.support.redis_nodes import RedisNode
from tests.support.waits import eventually
from workers.jobs.writer import ResultWriter


async def test_a_request_cancelled_during_its_enqueue_leaves_no_subscription(
    redis: aioredis.Redis, redis_server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    enqueuing = asyncio.Event()
    send = ScriptBatch._send

    async def slow_send(self: ScriptBatch, batch: list[Any]) -> None:
        enqueuing.set()
        await asyncio.sleep(0.2)
        await send(self, batch)

    # The admission's script (and the release that undoes it) reaches Redis 0.2 s late.
    monkeypatch.setattr(ScriptBatch, "_send", slow_send)
    front_door = await FrontDoor.open(settings_for(redis_server.url))
    try:
        request = msgspec.convert({**BODY, "stream": True}, ChatCompletionRequest)
        job = chat_job(request, timeout_s=30)
        admitting = front_door.admission.admitting(job, ANONYMOUS)
        starting = asyncio.create_task(
            front_door.runs.start(job, admitting, FrontDoorJobObserver(job, front_door.runs.observations))
        )
        async with asyncio.timeout(10):
            while not enqueuing.is_set():
                if starting.done():
                    starting.result()  # it failed before queueing: show why
                await asyncio.sleep(0.01)
        starting.cancel()  # the client went away while its job was being queued
        with pytest.raises(asyncio.CancelledError):
            await starting
        assert front_door.reader.in_flight == 0
        assert not await redis.zcard(keys.in_flight())  # its admission slot is back
        assert await redis.exists(keys.cancel_mark(job.id))  # a job queued for nobody is cancelled
    finally:
        await front_door.close()


async def test_a_stream_kept_for_resumption_expires_even_if_its_writer_set_no_expiry(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    # A grace longer than the test: past it, a stream nobody resumed is deleted at once.
    settings = settings_for(redis_server.url, first_byte_budget_s=0.1, resume_grace_s=30)
    async with serving(settings) as client, asyncio.timeout(30):
        async with client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as response:
            job = await next_job(redis)
            await redis.xadd(keys.result_stream(job.id), {"c": encode(Chunk(text="Hel"))})  # no EXPIRE
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break
        # The client left mid-stream: the stream stays for a resumption, but not for ever.
        for _ in range(100):
            if await redis.ttl(keys.result_stream(job.id)) > 0:
                break
            await asyncio.sleep(0.02)
        assert 0 < await redis.ttl(keys.result_stream(job.id)) <= keys.RESULT_TTL_S
        assert await redis.xlen(keys.job_stream(MODEL)) == 1


async def test_readers_of_one_job_each_get_the_chunks_past_their_own_point(redis: aioredis.Redis) -> None:
    reader = ResultReader(redis, "door", RedisHealth(redis))
    tasks = TaskSet("test")
    reader.start(tasks)
    job_id = "f" * 32
    first = await redis.xadd(keys.result_stream(job_id), {"c": encode(Chunk(text="a"))})
    try:
        # Three readers: one from the start, two resumed after the first chunk (say, two tabs).
        subscriptions = [
            reader.subscribe(job_id, MODEL),
            reader.subscribe(job_id, MODEL, first.decode(), streamed=True),
            reader.subscribe(job_id, MODEL, first.decode(), streamed=True),
        ]
        assert reader.in_flight == 3
        await reader.wake()
        for text in ("b", "c"):
            await redis.xadd(keys.result_stream(job_id), {"c": encode(Chunk(text=text))})
        await redis.xadd(
            keys.result_stream(job_id),
            {"c": encode(Chunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=3)))},
        )
        got = [await texts_until_last(subscription) for subscription in subscriptions]
        assert got == [["a", "b", "c", ""], ["b", "c", ""], ["b", "c", ""]]
        assert reader.in_flight == 0
    finally:
        await tasks.stop()


async def test_an_ended_jobs_results_are_deleted_in_the_next_reads_round_trip(redis: aioredis.Redis) -> None:
    counted = CountedRoundTrips(redis)
    reader = ResultReader(counted, "door", RedisHealth(redis))  # type: ignore[arg-type]
    tasks = TaskSet("test")
    reader.start(tasks)
    ending, going_on = "e" * 32, "g" * 32
    last = encode(Chunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1)))
    await redis.xadd(keys.result_stream(going_on), {"c": encode(Chunk(text="a"))})
    try:
        ends, goes_on = reader.subscribe(ending, MODEL), reader.subscribe(going_on, MODEL)

        async def reading_both() -> bool:
            return reader.blocked and goes_on.has_chunk

        await eventually(reading_both)
        before = counted.round_trips
        await redis.xadd(keys.result_stream(ending), {"c": last})
        assert await texts_until_last(ends) == [""]

        async def deleted_and_reading() -> bool:
            return reader.blocked and not await redis.exists(keys.result_stream(ending))

        await eventually(deleted_and_reading)
        # The read that brought the end, then one round trip: the deletion and the next read together.
        assert counted.round_trips - before == 1
        await redis.xadd(keys.result_stream(going_on), {"c": last})
        assert await texts_until_last(goes_on) == ["a", ""]
    finally:
        await tasks.stop()


async def test_a_stopping_front_door_deletes_the_results_its_reader_had_not_yet(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """A job's results are deleted on the reader's next pass, which a blocked read holds back for up
    to BLOCK_MS: a front door that stops meanwhile deletes them itself, or they would stay until
    their writer's expiry (`keys.RESULT_TTL_S`, ten minutes)."""
    front_door = await FrontDoor.open(settings_for(redis_server.url))
    reader = front_door.reader
    left = "l" * 32
    await redis.xadd(keys.result_stream(left), {"c": encode(Chunk(text="a"))})
    try:
        reader.subscribe("w" * 32, MODEL)  # a job still waiting for its first chunk
        leaving = reader.subscribe(left, MODEL)

        async def blocked_after_the_first_chunk() -> bool:
            return reader.blocked and leaving.has_chunk

        await eventually(blocked_after_the_first_chunk)
        reader.unsubscribe(leaving)  # its client left: nothing is kept for it
        assert await redis.exists(keys.result_stream(left)), "not deleted before the reader's next pass"
    finally:
        await front_door.close()
    assert not await redis.exists(keys.result_stream(left))


async def texts_until_last(subscription: Subscription) -> list[str]:
    texts = []
    deadline = asyncio.get_running_loop().time() + 10
    while True:
        _, chunk = await subscription.get(deadline)
        texts.append(chunk.text)
        if chunk.is_last:
            return texts


async def test_a_job_being_enqueued_when_a_restart_is_noticed_is_judged_once_it_is_queued(
    tmp_path: Path,
) -> None:
    node = RedisNode(tmp_path).start()
    blocking = blocking_client(node.url, BLOCK_MS)
    reader = ResultReader(blocking, "door", RedisHealth(blocking))
    tasks = TaskSet("test")
    reader.start(tasks)
    redis = pooled_client(node.url)  # the front door's, which its enqueue writes through
    try:
        await redis.hset(keys.job_record("lost"), keys.READERS_FIELD, 1)
        lost = reader.subscribe("lost", MODEL, queued=True)
        # Two more whose enqueue has not returned yet: their records may not be written.
        arriving = reader.subscribe("arriving", MODEL)
        vanished = reader.subscribe("vanished", MODEL)
        await asyncio.sleep(0.3)  # the reader has seen the first server
        node.kill()
        node.start()  # empty; on this thread, since the server ends with the thread that started it
        loop = asyncio.get_running_loop()
        with pytest.raises(ResultsLost):
            await lost.get(loop.time() + 5)
        # Enqueued on the new server, after the restart was noticed: alive.
        await redis.hset(keys.job_record("arriving"), keys.READERS_FIELD, 1)
        arriving.queued = True
        # Enqueued on the old one just before it died: lost, and told once the enqueue returned.
        vanished.queued = True
        await reader.wake()
        with pytest.raises(ResultsLost):
            await vanished.get(loop.time() + 5)
        with pytest.raises(TimeoutError):
            await arriving.get(loop.time() + 0.5)
        assert reader.in_flight == 1
    finally:
        await tasks.stop()
        await blocking.aclose()
        await redis.aclose()
        node.kill()


LAST = Chunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=2))


async def test_the_jobs_a_front_door_queued_are_read_from_its_inbox_alone(redis: aioredis.Redis) -> None:
    counted = CountedRoundTrips(redis)
    reader = ResultReader(counted, "door", RedisHealth(redis))  # type: ignore[arg-type]
    writer = ResultWriter(redis, "w1")
    tasks = TaskSet("test")
    reader.start(tasks)
    writer.start()
    jobs = [f"{n}" * 32 for n in range(5)]
    try:
        for job_id in jobs:
            await redis.hset(keys.job_record(job_id), keys.READERS_FIELD, 1)  # queued
        subscriptions = [reader.subscribe(job_id, MODEL, from_inbox=True) for job_id in jobs]
        started = asyncio.get_running_loop().time()
        for seq, chunk in enumerate((Chunk(text="a"), Chunk(text="b"), LAST)):
            await asyncio.gather(
                *(
                    writer.append(job_id, encode(chunk), seq=seq, first=seq == 0, inbox=keys.inbox("door"))
                    for job_id in jobs
                )
            )
        assert [await texts_until_last(subscription) for subscription in subscriptions] == [
            ["a", "b", ""]
        ] * 5
        # Every chunk came before any subscription could have been read directly.
        assert asyncio.get_running_loop().time() - started < QUIET_S
        assert counted.xread_keys, "the reader read alone at least once"
        assert all(read == [keys.inbox("door")] for read in counted.xread_keys), counted.xread_keys
    finally:
        await writer.stop()
        await tasks.stop()


async def test_a_job_whose_writer_copies_nothing_is_read_from_its_stream_once_quiet(
    redis: aioredis.Redis,
) -> None:
    """A worker from before the inbox (during an upgrade, say) writes the result stream alone."""
    reader = ResultReader(redis, "door", RedisHealth(redis))
    tasks = TaskSet("test")
    reader.start(tasks)
    loop = asyncio.get_running_loop()
    try:
        subscription = reader.subscribe("q" * 32, MODEL, from_inbox=True)
        started = loop.time()
        await redis.xadd(keys.result_stream("q" * 32), {"c": encode(Chunk(text="a"))})
        _, chunk = await subscription.get(loop.time() + 10 * QUIET_S)
        assert chunk.text == "a"
        assert loop.time() - started >= QUIET_S * 0.9  # not read directly before it went quiet
        # Read directly now, and the chunks after it too.
        await redis.xadd(keys.result_stream("q" * 32), {"c": encode(LAST)})
        _, chunk = await subscription.get(loop.time() + QUIET_S / 2)
        assert chunk.is_last
    finally:
        await tasks.stop()


async def test_a_copy_that_leaves_out_chunks_has_them_read_from_the_stream_at_once(
    redis: aioredis.Redis,
) -> None:
    reader = ResultReader(redis, "door", RedisHealth(redis))
    writer = ResultWriter(redis, "w1")
    tasks = TaskSet("test")
    reader.start(tasks)
    writer.start()
    job_id = "g" * 32
    await redis.hset(keys.job_record(job_id), keys.READERS_FIELD, 1)
    try:
        subscription = reader.subscribe(job_id, MODEL, from_inbox=True)
        started = asyncio.get_running_loop().time()
        # The first chunk's copy is missing (trimmed before it was read, say); the next ones are there.
        await writer.append(job_id, encode(Chunk(text="a")), seq=0, first=True)
        await writer.append(job_id, encode(Chunk(text="b")), seq=1, inbox=keys.inbox("door"))
        await writer.append(job_id, encode(LAST), seq=2, inbox=keys.inbox("door"))
        assert await texts_until_last(subscription) == ["a", "b", ""]
        assert asyncio.get_running_loop().time() - started < QUIET_S
    finally:
        await writer.stop()
        await tasks.stop()


async def test_what_the_reader_took_from_its_inbox_is_trimmed(redis: aioredis.Redis) -> None:
    reader = ResultReader(redis, "door", RedisHealth(redis))
    writer = ResultWriter(redis, "w1")
    tasks = TaskSet("test")
    reader.start(tasks)
    writer.start()
    try:
        for n in range(20):
            job_id = f"t{n:031d}"
            await redis.hset(keys.job_record(job_id), keys.READERS_FIELD, 1)
            subscription = reader.subscribe(job_id, MODEL, from_inbox=True)
            await writer.append(job_id, encode(Chunk(text="a")), seq=0, first=True, inbox=keys.inbox("door"))
            await writer.append(job_id, encode(LAST), seq=1, inbox=keys.inbox("door"))
            assert await texts_until_last(subscription) == ["a", ""]
            reader.unsubscribe(subscription)

        async def trimmed() -> bool:
            return await redis.xlen(keys.inbox("door")) <= 1  # the last entry read marks the point

        await eventually(trimmed)
    finally:
        await writer.stop()
        await tasks.stop()


async def test_after_a_redis_restart_the_inbox_is_read_from_its_start(tmp_path: Path) -> None:
    """A new server's entry ids owe nothing to the old one's: the point read to is forgotten."""
    node = RedisNode(tmp_path).start()
    blocking = blocking_client(node.url, BLOCK_MS)
    reader = ResultReader(blocking, "door", RedisHealth(blocking))
    tasks = TaskSet("test")
    reader.start(tasks)
    redis = pooled_client(node.url)
    job_id = "j" * 32
    try:
        subscription = reader.subscribe(job_id, MODEL, from_inbox=True)  # its enqueue not returned yet
        # The old server's inbox had reached an id beyond anything the new one's clock will give.
        await redis.xadd(keys.inbox("door"), {keys.WAKE_FIELD: ""}, id="9999999999999-0")
        await asyncio.sleep(0.3)  # read
        node.kill()
        node.start()  # empty
        await redis.hset(keys.job_record(job_id), keys.READERS_FIELD, 1)
        subscription.queued = True
        # Only the copy is written: the job's result stream, read directly, would bring nothing.
        copy = {"r": keys.result_stream(job_id), "e": "0-1", "c": encode(Chunk(text="a"))}
        await redis.xadd(keys.inbox("door"), copy)  # type: ignore[arg-type]
        _, chunk = await subscription.get(asyncio.get_running_loop().time() + 5)
        assert chunk.text == "a"
    finally:
        await tasks.stop()
        await blocking.aclose()
        await redis.aclose()
        node.kill()
