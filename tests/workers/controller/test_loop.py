"""Whole workers (real Redis, real Triton, the real controller) deciding with scripted engines.

The engines are the only stand-ins, so loads take the time the test says and can fail on cue:
these tests check the coordination between workers (one load per burst, scale-out from measured
costs, failures, keep-alive), which the end-to-end tests then confirm with real vLLM engines.
"""

from __future__ import annotations

import asyncio
import time

import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import load_failure_decoder
from tests.support.jobs import make_job, result, submit
from tests.support.one_worker import KIND, running, settings, until
from tests.support.scripted_engine import Engines
from workers.main import Worker


@pytest.fixture
async def redis_url(redis: aioredis.Redis, redis_server: PrivateRedis) -> str:
    return redis_server.url


async def test_a_burst_for_a_cold_model_starts_exactly_one_load_across_two_workers(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines(start_s=0.5)
    config = settings(redis_url, [ModelConfig(name="tiny", path="unused")])
    async with running(Worker(config, engines), Worker(config, engines)):
        jobs = [make_job("tiny", "fast 3") for _ in range(16)]
        await submit(redis, *jobs)
        results = await asyncio.gather(*(result(redis, j.id) for j in jobs))
        assert all(chunks[-1].finish_reason == "length" for chunks in results)
        assert engines.starts("tiny") == 1
        assert await redis.get(keys.replica_lease("tiny", 0)) is not None
        assert await redis.get(keys.replica_lease("tiny", 1)) is None


async def test_an_idle_model_leaves_after_its_keep_alive_and_loads_again_on_demand(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines()
    config = settings(redis_url, [ModelConfig(name="tiny", path="unused", keep_alive_s=1.0)])
    worker = Worker(config, engines)
    async with running(worker):
        first = make_job("tiny", "fast 2")
        await submit(redis, first)
        await result(redis, first.id)
        await until(lambda: engines.stops("tiny") == 1, 10, "the idle model unloads")
        # The engine stops first; Triton unbinds the model after it (in a thread).
        await until(lambda: worker.record().slots == (), 10, "the slot is cold")
        # The replica's lease goes once the unload has finished, just after the slot turned cold.
        deadline = time.monotonic() + 10
        while await redis.get(keys.replica_lease("tiny", 0)) is not None:
            assert time.monotonic() < deadline, "the replica lease was never released"
            await asyncio.sleep(0.05)
        again = make_job("tiny", "fast 2")
        await submit(redis, again)
        assert (await result(redis, again.id))[-1].finish_reason == "length"
        assert engines.starts("tiny") == 2
        assert await redis.llen(keys.measured_costs("tiny", KIND, "load")) == 2


async def test_a_one_model_worker_swaps_between_two_models_and_answers_every_request(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines()
    models = [ModelConfig(name=name, path="unused") for name in ("tiny-a", "tiny-b")]
    async with running(Worker(settings(redis_url, models, max_loaded_models=1), engines)):
        for model in ["tiny-a", "tiny-b", "tiny-a", "tiny-b"]:
            one = make_job(model, "fast 2")
            await submit(redis, one)
            assert (await result(redis, one.id))[-1].finish_reason == "length", model
        assert engines.starts("tiny-a") == 2 and engines.starts("tiny-b") == 2
        assert engines.stops("tiny-a") == 2 and engines.stops("tiny-b") == 1


@pytest.mark.parametrize(("measured_load_s", "second_replica"), [(0.2, True), (1000.0, False)])
async def test_a_backlog_adds_a_replica_only_when_waiting_would_cost_more_than_loading(
    redis: aioredis.Redis, redis_url: str, measured_load_s: float, second_replica: bool
) -> None:
    # Timings under the test's control: the load time this kind of worker "measured" before.
    for _ in range(3):
        await redis.lpush(keys.measured_costs("tiny", KIND, "load"), measured_load_s)
    engines = Engines()
    config = settings(
        redis_url, [ModelConfig(name="tiny", path="unused", preload=True)], max_concurrent_jobs=2
    )
    async with running(Worker(config, engines), Worker(config, engines)):
        await until(lambda: engines.starts("tiny") == 1, 15, "one worker preloads the model")
        await asyncio.sleep(1.0)  # both controllers have seen the replica
        # 24 jobs of about half a second, two at a time: about 6 s of queue for one replica.
        jobs = [make_job("tiny", "slow 10 0.05") for _ in range(24)]
        await submit(redis, *jobs)
        results = await asyncio.gather(*(result(redis, j.id, timeout_s=60) for j in jobs))
        assert all(chunks[-1].finish_reason == "length" for chunks in results)
        assert engines.starts("tiny") == (2 if second_replica else 1)


async def test_a_failed_load_answers_the_waiting_requests_and_backs_off(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines(fail={"broken": "no model files in /models/broken"})
    config = settings(redis_url, [ModelConfig(name="broken", path="unused")], load_backoff_s=2.0)
    async with running(Worker(config, engines)):
        jobs = [make_job("broken", "fast 1") for _ in range(3)]
        await submit(redis, *jobs)
        for one in jobs:
            (chunk,) = await result(redis, one.id)
            assert chunk.error is not None and chunk.error.code == "load_failed"
            assert chunk.error.message.endswith("no model files in /models/broken")
            assert chunk.error.retry_after_s == 2.0
        failure = load_failure_decoder.decode(await redis.get(keys.load_failure("broken")))
        assert failure.reason.endswith("no model files in /models/broken")
        assert 0 < await redis.pttl(keys.load_failure("broken")) <= 2000
        late = make_job("broken", "fast 1")
        await submit(redis, late)
        await asyncio.sleep(1.0)
        assert engines.starts("broken") == 1, "no new attempt during the backoff"
        (chunk,) = await result(redis, late.id)  # the retry after the backoff fails again
        assert chunk.error is not None and chunk.error.code == "load_failed"
        assert chunk.error.retry_after_s == 4.0, "the backoff doubles"
        assert engines.starts("broken") == 2


async def test_a_job_whose_deadline_passes_during_the_load_never_runs(
    redis: aioredis.Redis, redis_url: str
) -> None:
    engines = Engines(start_s=2.0)
    config = settings(redis_url, [ModelConfig(name="slow-load", path="unused")])
    async with running(Worker(config, engines)):
        hurried = make_job("slow-load", "fast 2", deadline_s=0.5)
        patient = make_job("slow-load", "fast 2")
        await submit(redis, hurried, patient)
        (expired,) = await result(redis, hurried.id)
        assert expired.error is not None and expired.error.code == "timeout"
        assert (await result(redis, patient.id))[-1].finish_reason == "length"
        (engine,) = [e for e in engines.made["slow-load"] if e.starts]  # others only estimated memory
        assert engine.requests == [patient.id]
