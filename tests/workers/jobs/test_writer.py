"""The result writer against a real Redis: batching, expiry, acknowledgement, cancel marks, stop."""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.wire import Chunk, chunk_decoder, encode
from tests.support.blocked_reader import blocked_on, entries_woken_with
from workers.jobs.writer import ResultWriter, Superseded


@pytest.fixture(autouse=True)
async def job_records(redis: aioredis.Redis) -> None:
    """The jobs written here were enqueued: each has its record (results are created only for one)."""
    for job_id in ("a", "b", "j"):
        await redis.hset(keys.job_record(job_id), keys.READERS_FIELD, 1)


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


async def test_a_front_door_blocked_on_a_result_stream_reads_the_whole_flush_in_one_reply(
    redis: aioredis.Redis,
) -> None:
    writer = ResultWriter(redis)
    writer.start()
    await writer.append("a", encode(Chunk(text="a0")), create=True)  # the next appends share a flush
    reader = await blocked_on(redis, [keys.result_stream("a")])
    await asyncio.gather(*(writer.append("a", encode(Chunk(text=f"a{i}"))) for i in range(1, 5)))
    await writer.stop()
    # Woken after the flush's first append, it would hold one chunk, and read the rest next time.
    assert entries_woken_with(await reader) == 4


async def test_each_chunk_written_is_copied_once_to_the_inbox_of_its_front_door(
    redis: aioredis.Redis,
) -> None:
    writer = ResultWriter(redis, "w1")
    writer.start()
    inbox = keys.inbox("door")
    await writer.append("a", encode(Chunk(text="a0")), seq=0, first=True, inbox=inbox)
    await writer.append("a", encode(Chunk(text="a1")), seq=1, inbox=inbox)
    # A flush tried again after its reply was lost finds its chunk written: no second copy.
    await writer.append("a", encode(Chunk(text="a1")), seq=1, inbox=inbox)
    await writer.append("b", encode(Chunk(text="b0")), seq=0, first=True)  # no front door named
    await writer.stop()
    copies = [
        (fields[b"r"].decode(), fields[b"e"], chunk_decoder.decode(fields[b"c"]).text)
        for _, fields in await redis.xrange(inbox)
    ]
    assert copies == [(keys.result_stream("a"), b"0-1", "a0"), (keys.result_stream("a"), b"0-2", "a1")]
    assert 0 < await redis.ttl(inbox) <= keys.INBOX_TTL_S
    assert await redis.xlen(keys.result_stream("b")) == 1  # written, and copied nowhere


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


async def test_a_flush_retried_after_its_reply_was_lost_writes_each_chunk_once(
    redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    writer = ResultWriter(redis, "w1")
    flush = writer._flush
    lost = 0

    async def reply_lost(batch: list) -> list[int]:  # type: ignore[type-arg]
        nonlocal lost
        statuses = await flush(batch)  # Redis ran it ...
        if lost < 2:
            lost += 1
            raise ConnectionError("connection reset")  # ... and the reply never came
        return statuses

    monkeypatch.setattr(writer, "_flush", reply_lost)
    writer.start()
    for seq, word in enumerate(["a", "b", "c"]):
        assert await writer.append("j", encode(Chunk(text=word)), seq=seq, first=seq == 0) is False
    await writer.stop()
    entries = await redis.xrange(keys.result_stream("j"))
    assert [chunk_decoder.decode(fields[b"c"]).text for _, fields in entries] == ["a", "b", "c"]
    assert [entry_id for entry_id, _ in entries] == [b"0-1", b"0-2", b"0-3"]


async def test_a_worker_whose_job_was_taken_over_is_fenced_off_its_results(redis: aioredis.Redis) -> None:
    stalled, successor = ResultWriter(redis, "stalled"), ResultWriter(redis, "successor")
    stalled.start()
    successor.start()
    for seq in range(2):
        await stalled.append("j", encode(Chunk(text=f"s{seq}")), seq=seq, first=seq == 0)
    # The stalled worker's heartbeat lapsed: another took the job over and continues after 2 chunks.
    await successor.append("j", encode(Chunk(text="n2")), seq=2, first=True)
    await successor.append("j", encode(Chunk(text="n3")), seq=3)
    # The stalled worker wakes up and goes on where it was, or further: it is told to stop.
    for seq in (2, 4):
        with pytest.raises(Superseded):
            await stalled.append("j", encode(Chunk(text=f"s{seq}")), seq=seq)
    await stalled.stop()
    await successor.stop()
    entries = await redis.xrange(keys.result_stream("j"))
    assert [chunk_decoder.decode(fields[b"c"]).text for _, fields in entries] == ["s0", "s1", "n2", "n3"]


async def test_chunks_written_after_redis_lost_the_script_land_once_without_a_retry(
    redis: aioredis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    writer = ResultWriter(redis, "w1")
    writer.start()
    await writer.append("a", encode(Chunk(text="a0")), seq=0, first=True)
    await redis.script_flush()  # as after a restart without persistence
    await asyncio.gather(*(writer.append("a", encode(Chunk(text=f"a{i}")), seq=i) for i in range(1, 4)))
    await writer.stop()
    entries = await redis.xrange(keys.result_stream("a"))
    assert [chunk_decoder.decode(fields[b"c"]).text for _, fields in entries] == ["a0", "a1", "a2", "a3"]
    assert "retrying" not in caplog.text, "the lost script was loaded again, not the flush failed"
