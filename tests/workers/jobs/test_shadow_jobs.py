"""Shadow copies at the worker (`workers.jobs.consume`): they run only with slots to spare — under the
worker's shadow cap, and with no real job waiting — and are otherwise acknowledged at once with a
"shadow_dropped" error, against a real Redis and a real PyTriton around a scripted engine (4 slots,
so a cap of 1 shadow job by default)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import pytest_asyncio

from switchboard import keys
from switchboard.demand import note_demand
from switchboard.wire import Job, encode
from tests.support.jobs import result, submit, write_record
from tests.support.one_worker import MODEL, Worker, job, until

pytestmark = pytest.mark.asyncio(loop_scope="module")


def shadow(prompt: str) -> Job:
    return msgspec.structs.replace(job(prompt), shadow=True)


async def submit_at_once(worker: Worker, *jobs: Job) -> None:
    """Queue `jobs` in one transaction, so that the consumer's next read finds them all."""
    pipe = worker.redis.pipeline(transaction=True)
    for one in jobs:
        write_record(pipe, one)
        pipe.xadd(keys.job_stream(one.model), {keys.JOB_FIELD: encode(one)})
        note_demand(pipe, one.model, one.id)
    await pipe.execute()


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def idle_worker(worker: Worker) -> None:
    """Each test starts on an idle worker: a job's last chunk reaches its reader before the job's task
    has ended, and the previous test's shadow copy would still count against the cap."""
    await until(lambda: worker.consumer.running == 0, 10, "the previous test's jobs have ended")


async def pending(worker: Worker) -> int:
    return int((await worker.redis.xpending(keys.job_stream(MODEL), keys.JOB_GROUP))["pending"])


async def test_a_shadow_job_with_a_slot_to_spare_runs(worker: Worker) -> None:
    copy = shadow("fast 3")
    await submit(worker.redis, copy)
    chunks = await result(worker.redis, copy.id)
    assert chunks[-1].finish_reason == "length" and chunks[-1].error is None


async def test_a_worker_at_its_shadow_cap_drops_the_next_shadow_job_and_still_runs_real_ones(
    worker: Worker,
) -> None:
    running = shadow("hang")
    await submit(worker.redis, running)
    await until(lambda: running.id in worker.engine.requests, 5, "the first shadow job runs")
    second, real = shadow("fast 3"), job("fast 3")
    await submit(worker.redis, second, real)
    (dropped,) = await result(worker.redis, second.id)
    assert dropped.error is not None and dropped.error.code == "shadow_dropped"
    assert second.id not in worker.engine.requests  # never reached the engine
    assert (await result(worker.redis, real.id))[-1].finish_reason == "length"
    await worker.redis.set(keys.cancel_mark(running.id), b"1", ex=60)
    assert (await result(worker.redis, running.id))[-1].finish_reason == "abort"
    assert await pending(worker) == 0  # the dropped job was acknowledged


async def test_a_shadow_job_read_while_real_jobs_wait_is_dropped(worker: Worker) -> None:
    # The worker asks for 4 jobs: the copy and three real ones; a fourth real one still waits.
    copy = shadow("fast 3")
    real = [job("slow 2 0.1") for _ in range(4)]
    await submit_at_once(worker, copy, *real)
    (dropped,) = await result(worker.redis, copy.id)
    assert dropped.error is not None and dropped.error.code == "shadow_dropped"
    answers = await asyncio.gather(*(result(worker.redis, one.id) for one in real))
    assert all(chunks[-1].finish_reason == "length" for chunks in answers)
    assert copy.id not in worker.engine.requests
