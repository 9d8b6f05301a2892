"""Jobs as the front door writes them, and their results as it reads them, for worker tests."""

from __future__ import annotations

import time
import uuid

import redis.asyncio as aioredis
from redis.asyncio.client import Pipeline

from router.admission.limits import Admitting
from router.queue.enqueue import JobQueue, admitted, record_ttl_s
from switchboard import keys
from switchboard.demand import note_demand
from switchboard.lua.batched import answer
from switchboard.wire import Chunk, Job, LoadFailure, SamplingParams, chunk_decoder, encode


def make_job(model: str, prompt: str, deadline_s: float = 60.0) -> Job:
    """A plain-prompt job for `model`; the scripted engine reads its script from the prompt."""
    now = time.time()
    return Job(
        id=uuid.uuid4().hex,
        model=model,
        prompts=(prompt,),
        sampling=SamplingParams(),
        created=now,
        deadline=now + deadline_s,
    )


async def submit(redis: aioredis.Redis, *jobs: Job) -> None:
    """Write each job's record, append it to its model's stream, note the model in the demand index
    and poke the controllers, as an enqueue does (a job without a record gets no results: it was
    lost, as far as a worker can tell)."""
    for one in jobs:
        pipe = redis.pipeline(transaction=False)
        write_record(pipe, one)
        pipe.xadd(keys.job_stream(one.model, one.tier), {keys.JOB_FIELD: encode(one)})
        note_demand(pipe, one.model, one.id)
        await pipe.execute()


def write_record(pipe: Pipeline, job: Job) -> None:
    """Queue on `pipe` the job's record as `enqueue.lua` writes it (sent without an API key)."""
    record = keys.job_record(job.id)
    pipe.hset(record, mapping={keys.TENANT_FIELD: "", keys.READERS_FIELD: 1})
    pipe.expire(record, record_ttl_s(job))


async def result(redis: aioredis.Redis, job_id: str, timeout_s: float = 30.0) -> list[Chunk]:
    """Every chunk of the job, read from the start of its stream as the front door does."""
    chunks: list[Chunk] = []
    last_id = b"0-0"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        response = await redis.xread({keys.result_stream(job_id): last_id}, block=500)
        for _, entries in response or ():
            for entry_id, fields in entries:
                last_id = entry_id
                chunks.append(chunk_decoder.decode(fields[keys.CHUNK_FIELD.encode()]))
        if chunks and chunks[-1].is_last:
            return chunks
    raise AssertionError(f"job {job_id} did not finish; got {chunks}")


async def admit_and_submit(
    queue: JobQueue, job: Job, admitting: Admitting, *, owner: str
) -> LoadFailure | None:
    """Admit and queue `job` in one round trip, as the front door's request starts do: a 429 raised
    when admission refuses it; the model's failure, its slots given back, when its last load failed."""
    return admitted(await answer(queue.send_admitted(job, admitting, owner=owner)), admitting)
