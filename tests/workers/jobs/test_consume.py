"""The consumer (`workers.jobs.consume`) and the run of each job it takes (`workers.jobs.run`).

One worker's real pieces (Redis, PyTriton, the consumer, the writer) around a scripted engine: what
the consumer does with a job that is cancelled, fails, expired before it was taken, or waits for a
free place.
"""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from switchboard import keys
from switchboard.config import LoraConfig
from tests.support.jobs import result, submit
from tests.support.one_worker import MODEL, Worker, job, running_worker
from workers.jobs import consume
from workers.jobs.orphans import CHECK_S

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_a_cancel_mark_aborts_the_engine_request(worker: Worker) -> None:
    one = job("hang")
    await submit(worker.redis, one)
    await asyncio.sleep(0.5)
    await worker.redis.set(keys.cancel_mark(one.id), b"1", ex=60)
    chunks = await result(worker.redis, one.id)
    assert chunks[-1].finish_reason == "abort"
    assert one.id in worker.engine.aborted
    assert (await worker.redis.xpending(keys.job_stream(MODEL), keys.JOB_GROUP))["pending"] == 0


async def test_a_cancel_mark_aborts_a_request_still_waiting_in_the_engine(worker: Worker) -> None:
    one = job("queued")  # it writes no chunk that would see its mark
    await submit(worker.redis, one)
    await asyncio.sleep(0.3)
    await worker.redis.set(keys.cancel_mark(one.id), b"1", ex=60)
    marked = time.monotonic()
    chunks = await result(worker.redis, one.id)
    assert chunks[-1].finish_reason == "abort"
    assert one.id in worker.engine.aborted
    assert time.monotonic() - marked < CHECK_S + 1.0


async def test_engine_errors_become_error_chunks(worker: Worker) -> None:
    invalid, crash = job("invalid"), job("crash")
    await submit(worker.redis, invalid, crash)
    (refused,) = await result(worker.redis, invalid.id)
    assert refused.error is not None and refused.error.code == "invalid_request"
    assert refused.error.message == "The prompt is too long."
    (failed,) = await result(worker.redis, crash.id)
    assert failed.error is not None and failed.error.code == "engine_error"
    # The reason stays in the worker's log; the client gets the job's id to quote.
    assert "out of memory" not in failed.error.message
    assert crash.id in failed.error.message


async def test_an_expired_job_is_answered_with_a_timeout_without_running(worker: Worker) -> None:
    stale = job("fast 3", deadline_s=-1)
    await submit(worker.redis, stale)
    (chunk,) = await result(worker.redis, stale.id)
    assert chunk.error is not None and chunk.error.code == "timeout"


async def test_no_more_jobs_run_at_once_than_the_worker_allows(worker: Worker) -> None:
    jobs = [job("slow 3 0.2") for _ in range(8)]
    await submit(worker.redis, *jobs)
    await asyncio.sleep(0.3)
    assert worker.consumer.running <= 4
    results = await asyncio.gather(*(result(worker.redis, j.id) for j in jobs))
    assert all(chunks[-1].finish_reason == "length" for chunks in results)


async def test_the_first_chunk_of_a_job_made_before_its_model_was_warm_says_cold_start(
    worker: Worker,
) -> None:
    """A job that waited for its model's load says so on its first chunk (a rollout leaves its time to
    first token out); one made after the model was warm does not."""
    waited = msgspec.structs.replace(job("fast 3"), created=time.time() - 3600)
    fresh = job("fast 3")
    await submit(worker.redis, waited, fresh)
    first_waited, *rest_waited = await result(worker.redis, waited.id)
    first_fresh, *_ = await result(worker.redis, fresh.id)
    assert first_waited.cold_start and not any(chunk.cold_start for chunk in rest_waited)
    assert not first_fresh.cold_start


async def test_a_model_that_stops_taking_jobs_ends_the_read_under_way_while_adapters_may_arrive(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A base of adapters warm: reads are wakeable. An adapter evicted to make room for another waits
    # for the read under way (its read barrier); the read ends at once instead of at its timeout.
    monkeypatch.setattr(consume, "BLOCK_MS", 3000)
    async with running_worker(lora=LoraConfig()) as base:
        await asyncio.sleep(0.3)  # the consumer is blocked in its read by now
        await asyncio.wait_for(base.slot.unload(), timeout=1.5)
