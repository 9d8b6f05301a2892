"""Nothing lost, nothing hangs: jobs of dead workers, jobs nobody wants, entries that are not jobs.

The same real pieces as test_worker_path (Redis, PyTriton, the consumer, the writer) with the
scripted engine. A dead worker is a consumer of the group that took a job (its entry is pending
on it) and has no worker record; what it sent before dying is on the job's result stream.
"""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.demand import note_demand
from switchboard.wire import Chunk, Job, SamplingParams, Usage, encode
from tests.support.jobs import result, submit, write_record
from tests.support.one_worker import MODEL, Worker, job
from tests.support.waits import eventually
from workers.jobs.takeover import Takeover

pytestmark = pytest.mark.asyncio(loop_scope="module")

DEAD = "dead-worker"
STREAM = keys.job_stream(MODEL)
TAKEN_FIELD = keys.TAKEN_FIELD.encode()


def tokens(first: int, last: int) -> str:
    """The scripted engine's text for tokens first..last-1."""
    return "".join(f"t{i}\x00 " for i in range(first, last))


@pytest.fixture(autouse=True)
def short_heartbeat_ttl(monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead worker's jobs are taken once idle for the heartbeat TTL: short here."""
    monkeypatch.setattr(keys, "WORKER_TTL_S", 0.3)


async def taken_by_dead_worker(redis: aioredis.Redis, one: Job, *sent: Chunk, taken: int = 0) -> None:
    """Enqueue `one` and have a worker that then died take it, after sending `sent` to its client."""
    fields: dict[bytes, bytes] = {b"job": encode(one)}
    if taken:
        fields[TAKEN_FIELD] = str(taken).encode()
    pipe = redis.pipeline(transaction=True)  # so that the live worker cannot read it first
    write_record(pipe, one)
    pipe.xadd(STREAM, fields)  # type: ignore[arg-type]
    note_demand(pipe, MODEL, one.id)  # as its enqueue did
    pipe.xreadgroup(keys.JOB_GROUP, DEAD, {STREAM: ">"}, count=1)
    await pipe.execute()
    for position, chunk in enumerate(sent, start=1):
        # As the dead worker's result writer left them: entry 0-n for the n-th chunk, with its id.
        await redis.xadd(keys.result_stream(one.id), {"c": encode(chunk), "w": DEAD}, id=f"0-{position}")


async def nothing_pending(redis: aioredis.Redis) -> bool:
    info = await redis.xpending(STREAM, keys.JOB_GROUP)
    return info["pending"] == 0 and await redis.xlen(STREAM) == 0


async def test_a_dead_workers_job_is_continued_where_its_clients_stream_stopped(worker: Worker) -> None:
    one = job("slow 6 0.05")
    await taken_by_dead_worker(worker.redis, one, Chunk(text=tokens(0, 1)), Chunk(text=tokens(1, 2)))
    chunks = await result(worker.redis, one.id)
    assert "".join(c.text for c in chunks) == tokens(0, 6), "one seamless answer"
    assert worker.engine.continuations[one.id] == tokens(0, 2)
    assert chunks[-1].usage == Usage(prompt_tokens=3, completion_tokens=6), "every token counted"
    await eventually(lambda: nothing_pending(worker.redis), what="nothing pending")


async def test_a_finished_job_delivered_again_is_not_answered_twice(worker: Worker) -> None:
    one = job("fast 2")
    last = Chunk(text=tokens(0, 2), finish_reason="length", usage=Usage(prompt_tokens=3, completion_tokens=2))
    await taken_by_dead_worker(worker.redis, one, last)
    await eventually(lambda: nothing_pending(worker.redis), what="nothing pending")
    assert await worker.redis.xlen(keys.result_stream(one.id)) == 1
    assert one.id not in worker.engine.requests


async def test_a_job_taken_max_deliveries_times_goes_to_the_dead_letters_with_an_error(
    worker: Worker,
) -> None:
    one = job("fast 2")
    await taken_by_dead_worker(worker.redis, one, taken=2)  # this death is its third
    (chunk,) = await result(worker.redis, one.id)
    assert chunk.error is not None and chunk.error.code == "engine_error"
    assert "failed on 3 workers" in chunk.error.message
    ((_, letter),) = await worker.redis.xrange(keys.dead_letter_stream())
    assert letter[b"job"] == encode(one) and b"3 workers" in letter[b"reason"]
    assert one.id not in worker.engine.requests
    await eventually(lambda: nothing_pending(worker.redis), what="nothing pending")
    await worker.redis.delete(keys.dead_letter_stream())


async def test_a_half_answered_job_that_cannot_be_continued_ends_with_an_error(worker: Worker) -> None:
    one = msgspec.structs.replace(job("fast 4"), sampling=SamplingParams(n=2))
    await taken_by_dead_worker(worker.redis, one, Chunk(text=tokens(0, 1)))
    chunks = await result(worker.redis, one.id)
    assert [c.text for c in chunks] == [tokens(0, 1), ""]
    error = chunks[-1].error
    assert error is not None and error.code == "engine_error" and "several choices" in error.message
    assert one.id not in worker.engine.requests
    await eventually(lambda: nothing_pending(worker.redis), what="nothing pending")


async def test_a_live_workers_running_job_is_never_taken(worker: Worker) -> None:
    one = job("slow 12 0.1")  # runs well past the heartbeat TTL (0.3 s) on the live worker "w1"
    await submit(worker.redis, one)
    chunks = await result(worker.redis, one.id)
    assert "".join(c.text for c in chunks) == tokens(0, 12)
    assert worker.engine.requests.count(one.id) == 1
    assert one.id not in worker.engine.continuations


async def test_entries_that_are_not_jobs_go_to_the_dead_letters_and_the_next_job_runs(worker: Worker) -> None:
    await worker.redis.xadd(STREAM, {"job": b"\xc1 not msgpack"})
    await worker.redis.xadd(STREAM, {"something": b"else"})
    one = job("fast 2")
    await submit(worker.redis, one)
    assert (await result(worker.redis, one.id))[-1].finish_reason == "length"
    await eventually(lambda: nothing_pending(worker.redis), what="nothing pending")
    letters = await worker.redis.xrange(keys.dead_letter_stream())
    assert [fields[b"job"] for _, fields in letters] == [b"\xc1 not msgpack", b""]
    assert all(b"cannot be decoded" in fields[b"reason"] for _, fields in letters)
    await worker.redis.delete(keys.dead_letter_stream())


async def test_a_job_cancelled_before_a_worker_took_it_is_ended_without_output(worker: Worker) -> None:
    one = job("slow 1000 0.01")
    await worker.redis.set(keys.cancel_mark(one.id), b"1", ex=60)
    await submit(worker.redis, one)
    await eventually(lambda: nothing_pending(worker.redis), what="nothing pending")
    # The worker sends a fresh job on while it asks whether its client left: the abort meets the
    # job on its way (it never reaches the engine) or, rarely, just after it started there.
    assert one.id not in worker.engine.requests or one.id in worker.engine.aborted
    assert not await worker.redis.exists(keys.result_stream(one.id))
    assert not await worker.redis.exists(keys.cancel_mark(one.id)), "its mark ends with it"


async def test_a_result_stream_deleted_by_the_front_door_stops_the_engine(worker: Worker) -> None:
    one = job("hang")
    await submit(worker.redis, one)
    await eventually(lambda: worker.redis.exists(keys.result_stream(one.id)), what="the result stream")
    await worker.redis.delete(keys.result_stream(one.id))  # its client left; no cancel mark came
    await eventually(lambda: nothing_pending(worker.redis), what="nothing pending")
    assert one.id in worker.engine.aborted
    assert not await worker.redis.exists(keys.result_stream(one.id)), "never created again"


async def test_a_chunk_redis_refuses_aborts_the_engine_and_the_job_is_taken_over(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Long enough that its engine still runs when the writes have failed (three tries over about
    # 0.3 s): an abort after the engine's end would have nothing to stop.
    one = job("slow 24 0.05")
    flush = worker.writer._flush
    refused = 0

    async def refusing(batch: list) -> list[bool]:  # type: ignore[type-arg]
        nonlocal refused
        if refused < 3 and any(write.job_id == one.id for write in batch):  # more than the retries
            refused += 1
            raise ConnectionError("connection reset")
        return await flush(batch)

    monkeypatch.setattr(worker.writer, "_flush", refusing)
    await submit(worker.redis, one)
    chunks = await result(worker.redis, one.id)
    assert one.id in worker.engine.aborted, "the engine stopped at once"
    assert worker.engine.requests.count(one.id) == 2, "then the job ran again"
    assert "".join(c.text for c in chunks) == tokens(0, 24)
    await eventually(lambda: nothing_pending(worker.redis), what="nothing pending")


async def test_the_read_loop_goes_on_after_an_unexpected_error(
    worker: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    read_allotted = worker.consumer._read_allotted
    failed = False

    async def failing_once(counts: dict[str, int], *, held_back: bool, at_batch: bool) -> None:
        nonlocal failed
        if not failed:
            failed = True
            raise RuntimeError("a bug")
        await read_allotted(counts, held_back=held_back, at_batch=at_batch)

    monkeypatch.setattr(worker.consumer, "_read_allotted", failing_once)
    await asyncio.sleep(0.6)
    assert failed and worker.consumer.reading
    one = job("fast 2")
    await submit(worker.redis, one)
    assert (await result(worker.redis, one.id))[-1].finish_reason == "length"


async def test_only_a_job_still_in_its_stream_is_put_back_in_line(worker: Worker) -> None:
    stream = keys.job_stream("elsewhere")
    await worker.redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
    finished = await worker.redis.xadd(stream, {"job": b"finished"})
    unfinished = await worker.redis.xadd(stream, {"job": b"unfinished"})
    await worker.redis.xreadgroup(keys.JOB_GROUP, DEAD, {stream: ">"})
    await worker.redis.xdel(stream, finished)  # its last chunk acknowledged and deleted it
    takeover = Takeover(worker.redis, worker.writer, worker_id="w1", max_deliveries=3)
    assert await takeover.requeue(stream, finished, b"finished", 1) is False
    assert await takeover.requeue(stream, unfinished, b"unfinished", 1) is True
    ((_, fields),) = await worker.redis.xrange(stream)
    assert fields == {b"job": b"unfinished", TAKEN_FIELD: b"1"}
    assert (await worker.redis.xpending(stream, keys.JOB_GROUP))["pending"] == 0
    await worker.redis.delete(stream)
