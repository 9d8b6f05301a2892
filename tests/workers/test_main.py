"""The worker process (`workers.main`): its lifecycle, and its probes on its metrics port."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
import redis.asyncio as aioredis

from switchboard import gc_heap, keys
from switchboard.config import ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import WorkerRecord, worker_decoder
from tests.support.jobs import make_job, result, submit
from tests.support.one_worker import running, settings, until
from tests.support.scripted_engine import Engines
from workers.engines.base import Engine
from workers.engines.registry import EngineOptions
from workers.main import CannotStart, Worker
from workers.runtime.metrics_server import MetricsServer


async def test_healthz_answers_and_readyz_follows_whether_the_worker_takes_jobs() -> None:
    taking_jobs = True
    server = MetricsServer("127.0.0.1", 0, lambda: None, ready=lambda: taking_jobs)
    port = await server.start()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/readyz")).status_code == 200
            taking_jobs = False  # draining, or its consumer stopped
            assert (await client.get("/readyz")).status_code == 503
            assert (await client.get("/healthz")).status_code == 200
            assert (await client.get("/nothing")).status_code == 404
    finally:
        await server.stop()


async def test_a_started_worker_advertises_and_a_stopped_one_withdraws_and_ends_every_task(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    config = settings(redis_server.url, [ModelConfig(name="tiny", path="unused")])
    worker = Worker(config, Engines())
    before = set(asyncio.all_tasks())
    await worker.start()
    try:
        assert await redis.exists(keys.worker_record(worker.id))
        assert await redis.zscore(keys.workers_index(), worker.id) is not None
        assert worker._consumer.reading
    finally:
        await worker.stop()
    assert not await redis.exists(keys.worker_record(worker.id))
    assert await redis.zscore(keys.workers_index(), worker.id) is None
    assert not worker._consumer.reading
    for tasks in (
        worker._tasks,
        worker._heartbeat._tasks,
        worker._controller._tasks,
        worker._consumer._taking,
    ):
        assert len(tasks) == 0
    left = [task for task in set(asyncio.all_tasks()) - before if task is not asyncio.current_task()]
    assert not [task for task in left if not task.done()], left
    await worker.stop()  # idempotent


async def test_a_model_is_frozen_out_of_full_collections_while_warm_and_collected_once_cold(
    redis: aioredis.Redis, redis_server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker hands both to gc_heap, which freezes only in a process that froze its heap at
    # start (never this test's): what is checked here is when the worker asks for them.
    asked: list[tuple[str, list[str]]] = []
    config = settings(redis_server.url, [ModelConfig(name="tiny", path="unused")])
    worker = Worker(config, Engines())

    def ask(what: str) -> None:
        asked.append((what, sorted(worker._slots.held_names())))

    monkeypatch.setattr(gc_heap, "freeze_new", lambda: ask("freeze"))
    monkeypatch.setattr(gc_heap, "collect_all", lambda: ask("collect"))
    async with running(worker):
        assert asked == []
        job = make_job("tiny", "fast 2")
        await submit(redis, job)
        await result(redis, job.id)
        await until(lambda: bool(asked), 10, "the freeze")
        assert asked == [("freeze", ["tiny"])], "once, as the model became warm"
        await worker._slots["tiny"].unload()
        await until(lambda: len(asked) == 2, 10, "the collection")
        assert asked[1:] == [("collect", [])], "once, as the model became cold"


async def test_a_collection_waits_for_the_other_models_job_to_end(
    redis: aioredis.Redis, redis_server: PrivateRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A collection stops the whole process (340 ms once a vLLM model was loaded): one due while
    another model's job runs waits for that job to end rather than stall its stream."""
    asked: list[str] = []
    models = [ModelConfig(name="leaving", path="unused"), ModelConfig(name="busy", path="unused")]
    worker = Worker(settings(redis_server.url, models), Engines())
    monkeypatch.setattr(gc_heap, "freeze_new", lambda: asked.append("freeze"))
    monkeypatch.setattr(gc_heap, "collect_all", lambda: asked.append("collect"))
    async with running(worker):
        warming = [make_job("leaving", "fast 1"), make_job("busy", "fast 1")]
        await submit(redis, *warming)
        for job in warming:
            await result(redis, job.id)
        await until(lambda: "freeze" in asked, 10, "the freeze of both models")
        long = make_job("busy", "slow 30 0.05")  # 1.5 s of tokens
        await submit(redis, long)
        await until(lambda: worker._slots["busy"].in_flight == 1, 10, "the long job's start")
        asked.clear()
        await worker._slots["leaving"].unload()
        await asyncio.sleep(0.5)
        assert worker._slots["busy"].in_flight == 1, "the long job still runs"
        assert asked == [], "no collection while it runs"
        chunks = await result(redis, long.id)
        assert chunks[-1].finish_reason == "length"
        await until(lambda: asked == ["collect"], 10, "the collection once the job ended")


class _RecordingEngines(Engines):
    """Scripted engines that remember the worker-level options each was made with."""

    def __init__(self) -> None:
        super().__init__()
        self.options: list[EngineOptions] = []

    def __call__(self, model: ModelConfig, options: EngineOptions) -> Engine:
        self.options.append(options)
        return super().__call__(model, options)


async def test_engines_are_made_with_the_workers_configured_memory_budget(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    # TensorRT-LLM sizes its default KV cache as a share of this budget.
    engines = _RecordingEngines()
    config = settings(redis_server.url, [ModelConfig(name="tiny", path="unused")], memory_budget_gib=3.0)
    async with running(Worker(config, engines)):
        job = make_job("tiny", "fast 2")
        await submit(redis, job)
        await result(redis, job.id)
    assert engines.options
    assert {options.memory_budget_bytes for options in engines.options} == {3 * 1024**3}


def test_models_of_an_engine_not_installed_are_left_to_other_workers(redis_server: PrivateRedis) -> None:
    # This environment has vLLM and not TensorRT-LLM (the TensorRT-LLM image is the other way round).
    models = [
        ModelConfig(name="on-vllm", path="unused"),
        ModelConfig(name="on-trt", path="unused", engine="trtllm"),
    ]
    worker = Worker(settings(redis_server.url, models))
    assert [model.name for model in worker._models] == ["on-vllm"]
    assert worker.record().allowed == ("on-vllm",)


def test_a_worker_that_can_run_none_of_its_models_refuses_to_start(redis_server: PrivateRedis) -> None:
    models = [ModelConfig(name="on-trt", path="unused", engine="trtllm")]
    with pytest.raises(CannotStart, match=r"trtllm.*not installed here"):
        Worker(settings(redis_server.url, models))


async def test_the_record_says_the_engines_are_ready_once_triton_runs_and_the_runtime_is_imported(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """Until then a first request would wait for both; `switchboard up` and `/readyz` wait instead."""
    triton_started, runtime_imported = threading.Event(), threading.Event()
    engines = Engines()

    def engine_after_the_import(model: ModelConfig, options: EngineOptions) -> Engine:
        runtime_imported.wait(30)  # the worker's footprint estimates come last in the preparation
        return engines(model, options)

    # Beats far apart: the record must say it at once, not at the next beat.
    config = settings(redis_server.url, [ModelConfig(name="tiny", path="unused")], heartbeat_s=30.0)
    worker = Worker(config, engine_after_the_import)

    def triton_starts() -> None:  # no Triton: what counts here is when the worker says it runs
        triton_started.wait(30)

    worker._host.start = triton_starts  # type: ignore[method-assign]
    try:
        await worker.start()
        assert not (await _advertised(redis, worker.id)).engines_ready
        triton_started.set()
        await asyncio.sleep(0.3)
        assert not (await _advertised(redis, worker.id)).engines_ready
        runtime_imported.set()
        deadline = time.monotonic() + 5
        while not (await _advertised(redis, worker.id)).engines_ready:
            assert time.monotonic() < deadline, "the record never said the engines are ready"
            await asyncio.sleep(0.05)
    finally:
        triton_started.set()
        runtime_imported.set()
        await worker.stop()


async def _advertised(redis: aioredis.Redis, worker_id: str) -> WorkerRecord:
    record = await redis.get(keys.worker_record(worker_id))
    assert isinstance(record, bytes)
    return worker_decoder.decode(record)
