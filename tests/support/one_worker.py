"""One worker's pieces (real Redis, real PyTriton, the consumer, the writer) around a scripted engine.

Shared by the tests of the worker's path and of takeovers; the fixture `worker` (tests/workers/conftest.py)
starts them once per test module.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import redis.asyncio as aioredis

from switchboard.config import ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Job
from tests.support.jobs import make_job
from tests.support.scripted_engine import ScriptedEngine
from workers.jobs.consume import JobConsumer
from workers.jobs.writer import ResultWriter
from workers.models.slot import ModelSlot
from workers.triton.host import TritonHost
from workers.triton.model import CoalescingPolicy

MODEL = "scripted/model:v1"  # characters Triton refuses, on purpose
WINDOW_S = 0.05


class Worker:
    """The pieces of a worker process, wired as workers.main does."""

    def __init__(
        self,
        redis: aioredis.Redis,
        engine: ScriptedEngine,
        consumer: JobConsumer,
        writer: ResultWriter,
        *,
        host: TritonHost,
        slot: ModelSlot,
    ) -> None:
        self.redis = redis
        self.engine = engine
        self.consumer = consumer
        self.writer = writer
        self.host = host
        self.slot = slot


@asynccontextmanager
async def running_worker(
    *,
    model: str = MODEL,
    window_s: float = WINDOW_S,
    engine: ScriptedEngine | None = None,
    warm: bool = True,
    worker_id: str = "w1",
    redis_url: str | None = None,
) -> AsyncIterator[Worker]:
    """Start the pieces of one worker with a scripted model (warm unless `warm` is False; on a
    private Redis unless `redis_url` is given); stop them all afterwards."""
    with contextlib.ExitStack() as stack:
        if redis_url is None:
            redis_url = stack.enter_context(PrivateRedis()).url
        redis = aioredis.Redis.from_url(redis_url)
        host = TritonHost(
            coalescing=CoalescingPolicy(min_window_s=window_s, max_window_s=window_s, max_chunks_per_s=1000)
        )
        host_started = asyncio.Event()
        await asyncio.to_thread(host.start)
        host_started.set()
        engine = engine if engine is not None else ScriptedEngine()
        writer = ResultWriter(redis, worker_id)
        writer.start()
        consumers: list[JobConsumer] = []
        slot = ModelSlot(
            ModelConfig(name=model, path="unused"),
            host=host,
            host_started=host_started,
            create_engine=lambda _: engine,
            read_barrier=lambda: consumers[0].read_barrier(),
            on_change=lambda: consumers[0].models_changed() if consumers else None,
        )
        consumer = JobConsumer(
            redis,
            writer,
            worker_id=worker_id,
            slots={model: slot},
            max_concurrent_jobs=4,
            takeover_check_s=0.2,
        )
        consumers.append(consumer)
        await consumer.start()
        if warm:
            await slot.ensure_warm()
        try:
            yield Worker(redis, engine, consumer, writer, host=host, slot=slot)
        finally:
            await consumer.stop(drain_timeout_s=5)
            await writer.stop()
            await slot.unload()
            await asyncio.to_thread(host.stop)
            await redis.aclose()


def job(prompt: str, deadline_s: float = 60.0) -> Job:
    """A job for the worker's model; the scripted engine reads its script from the prompt."""
    return make_job(MODEL, prompt, deadline_s)
