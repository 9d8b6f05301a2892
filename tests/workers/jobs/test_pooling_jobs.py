"""Pooling jobs through one worker's real pieces: Redis, PyTriton, the consumer and the writer.

An embedder and a classifier (the PyTorch runner on the demo pooling models) are warm beside a
generator (a scripted engine) on one worker. A pooling job on its model's stream is answered with
one last chunk (a row per input, the classifier's labels, the usage) and acknowledged; the
generator's jobs run beside them; a pooling job that expired before it was taken fails as any job;
its span names its GenAI operation ("embeddings", "classify").
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.local.demo_pooling_models import (
    CLASSIFIER_LABELS,
    build_demo_classifier,
    build_demo_embedder,
)
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import PoolingTask
from tests.support.jobs import make_job, result, submit
from tests.support.one_worker import until
from tests.support.pooling_jobs import embed_job, pooling_job, rows
from tests.support.scripted_engine import ScriptedEngine
from tests.support.span_file import read_spans
from workers.engines.base import Engine, PooledRow, PoolingRow
from workers.engines.torch_pooling import TorchPoolingEngine
from workers.jobs.consume import JobConsumer
from workers.jobs.writer import ResultWriter
from workers.models.slots import Slots
from workers.triton.generator.model import CoalescingPolicy
from workers.triton.host import TritonHost

pytestmark = pytest.mark.asyncio(loop_scope="module")

EMBEDDER, CLASSIFIER, GENERATOR = "embedder", "classifier", "generator"


@dataclass
class PoolingWorker:
    redis: aioredis.Redis
    slots: Slots


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def worker(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[PoolingWorker]:
    root = tmp_path_factory.mktemp("pooling")
    models = [
        ModelConfig(name=EMBEDDER, path=str(build_demo_embedder(root / "embed")), kind="embed"),
        ModelConfig(name=CLASSIFIER, path=str(build_demo_classifier(root / "classify")), kind="classify"),
        ModelConfig(name=GENERATOR, path="unused"),
    ]

    def create_engine(model: ModelConfig) -> Engine:
        return TorchPoolingEngine(model) if model.pooling else ScriptedEngine()

    with PrivateRedis() as server:
        redis = aioredis.Redis.from_url(server.url)
        host = TritonHost(
            coalescing=CoalescingPolicy(min_window_s=0.005, max_window_s=0.005, max_chunks_per_s=1000)
        )
        host_started = asyncio.Event()
        await asyncio.to_thread(host.start)
        host_started.set()
        writer = ResultWriter(redis, "w1")
        writer.start()
        slots = Slots(models, host=host, host_started=host_started, create_engine=create_engine)
        consumer = JobConsumer(redis, writer, worker_id="w1", slots=slots, max_concurrent_jobs=8)
        await consumer.start()
        await asyncio.gather(*(slot.ensure_warm() for slot in slots.values()))
        try:
            yield PoolingWorker(redis, slots)
        finally:
            await consumer.stop(drain_timeout_s=5)
            await writer.stop()
            await asyncio.gather(*(slot.unload() for slot in slots.values()))
            await asyncio.to_thread(host.stop)
            await redis.aclose()


async def pending(redis: aioredis.Redis, model: str) -> int:
    return int((await redis.xpending(keys.job_stream(model), keys.JOB_GROUP))["pending"])


async def test_a_pooling_job_is_answered_with_one_chunk_and_acknowledged(worker: PoolingWorker) -> None:
    inputs = ("Hello there!", "The quick brown fox.", "Routers send requests to workers.")
    job = embed_job(EMBEDDER, *inputs)
    await submit(worker.redis, job)
    (chunk,) = await result(worker.redis, job.id)
    assert chunk.is_last and chunk.error is None and chunk.labels == ()
    engine = worker.slots[EMBEDDER].engine
    assert isinstance(engine, TorchPoolingEngine)
    alone = await engine.pool([PoolingRow(task="embed", input=text) for text in inputs])
    for row, expected in zip(rows(chunk), alone, strict=True):
        assert isinstance(expected, PooledRow)
        np.testing.assert_allclose(row, np.frombuffer(expected.values, dtype="<f4"), atol=1e-5)
    assert chunk.usage is not None and chunk.usage.completion_tokens == 0
    assert chunk.usage.prompt_tokens == sum(a.prompt_tokens for a in alone if isinstance(a, PooledRow))
    assert await pending(worker.redis, EMBEDDER) == 0


async def test_a_pooling_model_and_a_generator_are_warm_and_serve_together(worker: PoolingWorker) -> None:
    assert {name: slot.state for name, slot in worker.slots.items()} == dict.fromkeys(worker.slots, "warm")
    generated = [make_job(GENERATOR, "fast 5") for _ in range(3)]
    classified = pooling_job(CLASSIFIER, PoolingTask(task="classify", inputs=("I love it", "I hate it")))
    embedded = [embed_job(EMBEDDER, f"text number {n}") for n in range(6)]
    await submit(worker.redis, *generated, classified, *embedded)
    for job in generated:
        assert (await result(worker.redis, job.id))[-1].finish_reason == "length"
    (answer,) = await result(worker.redis, classified.id)
    assert answer.labels == CLASSIFIER_LABELS
    for probabilities in rows(answer):
        assert probabilities.shape == (3,) and abs(float(probabilities.sum()) - 1.0) < 1e-5
    for job in embedded:
        (chunk,) = await result(worker.redis, job.id)
        assert len(chunk.pooled) == 1
    for model in (GENERATOR, CLASSIFIER, EMBEDDER):
        assert await pending(worker.redis, model) == 0


async def test_a_refused_input_is_the_clients_error(worker: PoolingWorker) -> None:
    job = embed_job(EMBEDDER, (3, 99999))
    await submit(worker.redis, job)
    (chunk,) = await result(worker.redis, job.id)
    assert chunk.error is not None and chunk.error.code == "invalid_request" and chunk.error.param == "input"
    assert "99999" in chunk.error.message
    assert await pending(worker.redis, EMBEDDER) == 0


async def test_a_pooling_job_that_expired_before_it_was_taken_fails(worker: PoolingWorker) -> None:
    job = embed_job(EMBEDDER, "too late", deadline_s=-1)
    await submit(worker.redis, job)
    (chunk,) = await result(worker.redis, job.id)
    assert chunk.error is not None and chunk.error.code == "timeout"


async def test_a_pooling_jobs_span_names_its_operation(worker: PoolingWorker, span_file: Path) -> None:
    embedded = embed_job(EMBEDDER, "traced")
    classified = pooling_job(CLASSIFIER, PoolingTask(task="classify", inputs=("traced",)))
    await submit(worker.redis, embedded, classified)
    for job in (embedded, classified):
        await result(worker.redis, job.id)
    await until(lambda: len(job_spans(span_file)) == 2, 5, "both jobs' spans have ended")
    operations = {
        span["attributes"]["switchboard.job.id"]: span["attributes"]["gen_ai.operation.name"]
        for span in job_spans(span_file)
    }
    assert operations == {embedded.id: "embeddings", classified.id: "classify"}


def job_spans(path: Path) -> list[dict[str, Any]]:
    return [span for span in read_spans(path) if span["name"] == "switchboard.job"] if path.exists() else []


async def test_pooling_jobs_run_while_the_generators_jobs_hold_every_slot(worker: PoolingWorker) -> None:
    generations = [make_job(GENERATOR, "slow 40 0.05") for _ in range(8)]  # the 8 slots, for 2 s
    await submit(worker.redis, *generations)
    await until(lambda: worker.slots[GENERATOR].in_flight == 8, 5, "the generator holds every slot")
    # Many more pooling jobs than slots, all taken at once: a pooling job holds no job slot.
    embeddings = [embed_job(EMBEDDER, f"text number {n}") for n in range(24)]
    await submit(worker.redis, *embeddings)
    answers = await asyncio.wait_for(
        asyncio.gather(*(result(worker.redis, job.id) for job in embeddings)), 1.5
    )
    assert all(len(chunks) == 1 and chunks[0].error is None for chunks in answers)
    assert worker.slots[GENERATOR].in_flight == 8  # the generations were still running throughout
    for job in generations:
        assert (await result(worker.redis, job.id))[-1].finish_reason == "length"
