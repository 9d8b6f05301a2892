"""The scripted worker: every job of the named models is answered by a script (a function of the model
and the job giving the chunks, and how long to wait before them), with no engine.

It takes jobs as a worker's consumer does (XREADGROUP in the workers' group) and writes their chunks
through the worker's own result writer, which writes only for a job whose record exists and
acknowledges the job with its last chunk. Chunks with no pause between them are handed over
together, so that they share one write, as an engine's burst does. Front-door scenarios run it in
their own loop; the front door's benchmark (bench/front_door_path.py) runs it in a process of its
own, advertised as a live worker holding its models warm (`holder`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import keys
from switchboard.redis_conn import stream_entries
from switchboard.tasks import TaskSet, cancel_and_wait, poll
from switchboard.wire import TIERS, Chunk, Job, JobError, SlotStatus, Usage, encode, job_decoder
from tests.support.front_door_harness import advertise, worker_record
from workers.jobs.writer import ResultWriter, inbox_of


@dataclass
class Scripted:
    """An answer: its chunks, after `delay_s`."""

    chunks: Sequence[Chunk]
    delay_s: float = 0.0
    # A pause before the last chunk (a job still generating after its first chunks).
    pause_before_last_s: float = 0.0


Script = Callable[[str, Job], Scripted]


@dataclass
class Served:
    """The jobs the scripted models took, in order."""

    jobs: list[tuple[str, Job]] = field(default_factory=list)
    # When each job was taken (time.monotonic()), in the same order.
    taken_at: list[float] = field(default_factory=list)
    # The jobs told that nobody reads them any more (their cancel mark), while they ran.
    told_to_stop: set[str] = field(default_factory=set)

    @property
    def models(self) -> list[str]:
        return [model for model, _ in self.jobs]

    def of(self, model: str) -> list[Job]:
        return [job for served, job in self.jobs if served == model]


CONSUMER = "w1"
# How often the holder's record is written again (its lifetime is keys.WORKER_TTL_S).
HEARTBEAT_EVERY_S = 2.0


@contextlib.asynccontextmanager
async def scripted_models(
    redis: aioredis.Redis, models: Sequence[str], script: Script, *, holder: str | None = None
) -> AsyncIterator[Served]:
    """Answer the jobs queued for `models` by `script` while the block runs; each answer in a task of
    its own, so a slow one holds up no other. `holder`: a worker id to advertise while it runs, as a
    live worker holding `models` warm."""
    served = Served()
    writer = ResultWriter(redis, CONSUMER)
    writer.start()
    for model in models:
        for stream in keys.job_streams(model, TIERS):
            with contextlib.suppress(ResponseError):  # BUSYGROUP: the group exists
                await redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
    # Every tier's stream, each read as it comes (a stand-in has no slots to share).
    by_stream = {stream: model for model in models for stream in keys.job_streams(model, TIERS)}
    streams: dict[Any, Any] = dict.fromkeys(by_stream, ">")
    tasks = TaskSet("scripted models")

    async def answer(model: str, job: Job, ack: tuple[str, bytes]) -> None:
        scripted = script(model, job)
        await asyncio.sleep(scripted.delay_s)
        chunks = list(scripted.chunks)
        last = [chunks.pop()] if len(chunks) > 1 and scripted.pause_before_last_s > 0 else []
        gone = await _hand_over(writer, job, chunks, 0, ack if not last else None)
        if last:
            await asyncio.sleep(scripted.pause_before_last_s)
            # As an engine's loop looks for its job's cancel mark between tokens; the job goes on to
            # its end all the same, whose chunk takes the mark away.
            gone |= bool(await redis.exists(keys.cancel_mark(job.id)))
            gone |= await _hand_over(writer, job, last, len(chunks), ack)
        if gone:
            served.told_to_stop.add(job.id)

    async def take() -> None:
        while True:
            response: Any = await redis.xreadgroup(keys.JOB_GROUP, CONSUMER, streams, block=50)
            for stream_key, entries in stream_entries(response):
                stream = stream_key.decode()
                model = by_stream[stream]
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                    served.jobs.append((model, job))
                    served.taken_at.append(time.monotonic())
                    tasks.start(answer(model, job, (stream, entry_id)), f"answer {job.id}")

    async def beat() -> None:
        await advertise(
            redis, worker_record(holder or "", *(SlotStatus(model=m, state="warm") for m in models))
        )

    taking = asyncio.create_task(take())
    if holder is not None:
        await beat()
        tasks.start(poll(beat, HEARTBEAT_EVERY_S, "advertise the scripted worker"), "heartbeat")
    try:
        yield served
    finally:
        await cancel_and_wait(taking)  # a blocked read can lose one cancellation (redis-py on 3.11)
        await tasks.stop()
        await writer.stop()


async def _hand_over(
    writer: ResultWriter, job: Job, chunks: Sequence[Chunk], first_seq: int, ack: tuple[str, bytes] | None
) -> bool:
    """`chunks` (positions `first_seq`...) handed to the writer together, so that they share a flush;
    `ack` goes with the last of them. Returns whether the writer answered that nobody reads them."""
    appends = [
        writer.append(
            job.id,
            encode(chunk),
            seq=seq,
            first=seq == 0,
            inbox=inbox_of(job),
            ack=ack if seq == first_seq + len(chunks) - 1 else None,
        )
        for seq, chunk in enumerate(chunks, start=first_seq)
    ]
    return any(await asyncio.gather(*appends))


ENGINE_DIED = Chunk(error=JobError(code="engine_error", message="the engine died"))


def named_answers(failing: frozenset[str] = frozenset()) -> Script:
    """Each model answers with its own name; the engines of those in `failing` fail the job."""

    def script(model: str, job: Job) -> Scripted:
        if model in failing:
            return Scripted([ENGINE_DIED])
        return Scripted(
            [Chunk(text=model, finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1))]
        )

    return script


def models_answering(
    redis: aioredis.Redis, models: Sequence[str], failing: frozenset[str] = frozenset()
) -> contextlib.AbstractAsyncContextManager[Served]:
    """`scripted_models` answering with the models' names (`named_answers`)."""
    return scripted_models(redis, models, named_answers(failing))
