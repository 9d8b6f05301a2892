"""Scripted workers for front-door scenarios: every job of the named models is answered by a script
(a function of the model and the job giving the chunks, and how long to wait before them), through
the workers' own append script, which writes only for a job whose record exists, as a worker's do."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, Job, JobError, Usage, encode, job_decoder
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

    @property
    def models(self) -> list[str]:
        return [model for model, _ in self.jobs]

    def of(self, model: str) -> list[Job]:
        return [job for served, job in self.jobs if served == model]


@contextlib.asynccontextmanager
async def scripted_models(
    redis: aioredis.Redis, models: Sequence[str], script: Script
) -> AsyncIterator[Served]:
    """Answer the jobs queued for `models` by `script` while the block runs; each answer in a task of
    its own, so a slow one holds up no other."""
    served = Served()
    writer = ResultWriter(redis, "w1")
    writer.start()
    streams: dict[Any, Any] = {keys.job_stream(model): "0" for model in models}
    by_stream = {keys.job_stream(model): model for model in models}
    answering: set[asyncio.Task[None]] = set()

    async def answer(model: str, job: Job) -> None:
        scripted = script(model, job)
        await asyncio.sleep(scripted.delay_s)
        for seq, chunk in enumerate(scripted.chunks):
            if seq == len(scripted.chunks) - 1 and seq > 0:
                await asyncio.sleep(scripted.pause_before_last_s)
            await writer.append(job.id, encode(chunk), seq=seq, first=seq == 0, inbox=inbox_of(job))

    async def read() -> None:
        while True:
            response: Any = await redis.xread(streams, block=50)
            for stream, entries in response or ():
                model = by_stream[stream.decode()]
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                    served.jobs.append((model, job))
                    served.taken_at.append(time.monotonic())
                    task = asyncio.create_task(answer(model, job))
                    answering.add(task)
                    task.add_done_callback(answering.discard)
                    await redis.xdel(stream, entry_id)

    reader = asyncio.create_task(read())
    try:
        yield served
    finally:
        await cancel_and_wait(reader)  # a blocked XREAD can lose one cancellation (redis-py on 3.11)
        for task in list(answering):
            await cancel_and_wait(task)
        await writer.stop()


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
