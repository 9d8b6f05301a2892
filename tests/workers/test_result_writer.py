"""The result writer against a real Redis: batching, expiry, acknowledgement, cancel marks, stop."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.wire import Chunk, chunk_decoder, encode
from workers.result_writer import ResultWriter


async def test_chunks_of_many_jobs_land_in_order_with_expiry_and_cancel_marks(redis: aioredis.Redis) -> None:
    writer = ResultWriter(redis)
    writer.start()
    await redis.set(keys.cancel_mark("b"), b"1")
    results = await asyncio.gather(
        *(
            writer.append(job, encode(Chunk(text=f"{job}{i}")), create=True)
            for i in range(20)
            for job in ("a", "b")
        )
    )
    await writer.stop()
    assert results == [False, True] * 20  # "b" has a cancel mark, "a" has none
    for job in ("a", "b"):
        entries = await redis.xrange(keys.result_stream(job))
        assert [chunk_decoder.decode(fields[b"c"]).text for _, fields in entries] == [
            f"{job}{i}" for i in range(20)
        ]
        assert 0 < await redis.ttl(keys.result_stream(job)) <= keys.RESULT_TTL_S


async def test_the_last_chunk_acknowledges_and_deletes_the_job(redis: aioredis.Redis) -> None:
    stream = keys.job_stream("m")
    await redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
    entry_id = await redis.xadd(stream, {"job": b"x"})
    await redis.xreadgroup(keys.JOB_GROUP, "w", {stream: ">"})
    writer = ResultWriter(redis)
    writer.start()
    await redis.set(keys.cancel_mark("j"), b"1")
    await writer.append("j", encode(Chunk(finish_reason="stop")), ack=(stream, entry_id), create=True)
    await writer.stop()
    assert await redis.xlen(stream) == 0
    assert (await redis.xpending(stream, keys.JOB_GROUP))["pending"] == 0
    assert not await redis.exists(keys.cancel_mark("j")), "a job's cancel mark ends with it"


async def test_a_result_stream_the_front_door_deleted_is_never_created_again(redis: aioredis.Redis) -> None:
    writer = ResultWriter(redis)
    writer.start()
    assert await writer.append("j", encode(Chunk(text="first")), create=True) is False
    await redis.delete(keys.result_stream("j"))  # its reader has gone
    late = await writer.append("j", encode(Chunk(text="late")), create=False)
    assert late is True, "nobody reads it: the job stops"
    await writer.stop()
    assert not await redis.exists(keys.result_stream("j"))


async def test_a_failed_flush_is_retried_before_its_writers_hear_of_it(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ResultWriter(redis)
    flush = writer._flush
    failures = 0

    async def flaky(batch: list) -> list[bool]:  # type: ignore[type-arg]
        nonlocal failures
        if failures < 1:
            failures += 1
            raise ConnectionError("connection reset")
        return await flush(batch)

    monkeypatch.setattr(writer, "_flush", flaky)
    writer.start()
    assert await writer.append("j", encode(Chunk(text="x")), create=True) is False
    assert await redis.xlen(keys.result_stream("j")) == 1
    failures = -10  # ten failures in a row: more than the retries
    with pytest.raises(ConnectionError):
        await writer.append("j", encode(Chunk(text="y")))
    await writer.stop()


async def test_stop_flushes_every_write_handed_over_and_refuses_later_ones(redis: aioredis.Redis) -> None:
    writer = ResultWriter(redis)
    writer.start()
    writes = [
        asyncio.create_task(writer.append("j", encode(Chunk(text=str(i))), create=True)) for i in range(50)
    ]
    await asyncio.sleep(0)  # the writes are handed over, none flushed yet
    await writer.stop()
    assert all(w.done() and w.result() is False for w in writes)
    assert await redis.xlen(keys.result_stream("j")) == 50
    with pytest.raises(RuntimeError):
        await writer.append("j", encode(Chunk(text="late")))
