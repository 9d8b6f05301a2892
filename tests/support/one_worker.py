"""One worker's pieces (real Redis, real PyTriton, the consumer, the writer) around a scripted engine.

Shared by the tests of the worker's path and of takeovers; the fixture `worker` (tests/workers/conftest.py)
starts them once per test module.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import redis.asyncio as aioredis

from switchboard.config import LoraConfig, ModelConfig, RedisConfig, Settings, WorkerConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import Job
from tests.support.jobs import make_job
from tests.support.scripted_engine import ScriptedEngine
from workers.jobs.consume import JobConsumer
from workers.jobs.writer import ResultWriter
from workers.main import Worker as WorkerProcess
from workers.models.slot import ModelSlot
from workers.models.slots import Slots
from workers.triton.generator.model import CoalescingPolicy
from workers.triton.host import TritonHost

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
    lora: LoraConfig | None = None,
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
        slots = Slots(
            [ModelConfig(name=model, path="unused", lora=lora)],
            host=host,
            host_started=host_started,
            create_engine=lambda _: engine,
        )
        slot = slots[model]
        consumer = JobConsumer(
            redis,
            writer,
            worker_id=worker_id,
            slots=slots,
            max_concurrent_jobs=4,
            takeover_check_s=0.2,
        )
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


# --- whole workers (workers.main.Worker) ---------------------------------------------------

KIND = "scripted"


def settings(redis_url: str, models: list[ModelConfig], **worker: object) -> Settings:
    defaults: dict[str, object] = {
        "heartbeat_s": 0.5,
        "controller_tick_s": 0.2,
        "memory_budget_gib": 8.0,
        "kind": KIND,
        "drain_timeout_s": 2.0,
    }
    return Settings(
        redis=RedisConfig(url=redis_url),
        worker=WorkerConfig(**{**defaults, **worker}),  # type: ignore[arg-type]
        models=models,
    )


@asynccontextmanager
async def running(*workers: WorkerProcess) -> AsyncIterator[None]:
    await asyncio.gather(*(w.start() for w in workers))
    try:
        yield
    finally:
        await asyncio.gather(*(w.stop() for w in workers))


async def until(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:g} s: {what}")
        await asyncio.sleep(0.05)
