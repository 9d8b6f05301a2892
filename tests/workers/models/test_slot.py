"""ModelSlot against a real Triton (PyTriton) and a real Redis, with a scripted engine.

The slot is the one owner of a model's residency: these tests check that its transitions bind
and unbind the model in Triton for real, that concurrent callers share one load (and its failure),
that an unload waits for the jobs holding leases, and that the consumer reads only warm models.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
import redis.asyncio as aioredis
import tritonclient.grpc

from switchboard import keys
from switchboard.config import ModelConfig, triton_model_name
from switchboard.local.redis_server import PrivateRedis
from switchboard.wire import chunk_decoder, encode
from tests.support.jobs import make_job, result, submit
from tests.support.scripted_engine import ScriptedEngine, SleepyEngine
from workers.jobs.consume import JobConsumer
from workers.jobs.writer import ResultWriter
from workers.models.slot import LoadFailed, ModelSlot, SlotNotServing
from workers.models.slots import Slots
from workers.triton.generator.model import CoalescingPolicy
from workers.triton.host import TritonHost

pytestmark = pytest.mark.asyncio(loop_scope="module")


class Host:
    """A running Triton host, the session's Redis and a result writer, shared by the module."""

    def __init__(self, host: TritonHost, redis: aioredis.Redis, writer: ResultWriter) -> None:
        self.triton = host
        self.started = asyncio.Event()
        self.started.set()
        self.redis = redis
        self.writer = writer

    def slot(self, engine: ScriptedEngine, name: str | None = None, **model: Any) -> ModelSlot:
        """A fresh slot for a model of its own (with `model`'s settings), whose loads create `engine`."""

        async def no_read_in_progress() -> None:
            return None

        return ModelSlot(
            ModelConfig(name=name or f"m-{uuid.uuid4().hex[:8]}", path="unused", **model),
            host=self.triton,
            host_started=self.started,
            create_engine=lambda _: engine,
            read_barrier=no_read_in_progress,
            on_change=lambda: None,
        )

    def ready_in_triton(self, model: str) -> bool:
        with contextlib.closing(tritonclient.grpc.InferenceServerClient(self.triton.grpc_address)) as client:
            return bool(client.is_model_ready(triton_model_name(model)))


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def host() -> AsyncIterator[Host]:
    with PrivateRedis() as server:
        redis = aioredis.Redis.from_url(server.url)
        triton = TritonHost(
            coalescing=CoalescingPolicy(min_window_s=0.01, max_window_s=0.01, max_chunks_per_s=1000)
        )
        await asyncio.to_thread(triton.start)
        writer = ResultWriter(redis)
        writer.start()
        try:
            yield Host(triton, redis, writer)
        finally:
            await writer.stop()
            await asyncio.to_thread(triton.stop)
            await redis.aclose()


async def test_concurrent_callers_share_one_load_and_the_model_is_bound(host: Host) -> None:
    engine = ScriptedEngine(start_s=0.3)
    slot = host.slot(engine)
    served = await asyncio.gather(*(slot.ensure_warm() for _ in range(8)))
    assert engine.starts == 1
    assert all(s is served[0] for s in served)
    assert slot.state == "warm" and slot.wants_jobs
    assert host.ready_in_triton(slot.name)
    await slot.unload()


async def test_a_router_model_makes_its_first_constrained_answer_while_it_loads(host: Host) -> None:
    plain, router = ScriptedEngine(), ScriptedEngine()
    await host.slot(plain).ensure_warm()
    await host.slot(router, warm_structured_output=True).ensure_warm()
    assert plain.requests == []
    assert [request.startswith("warm-up-") for request in router.requests] == [True]


async def test_an_unload_waits_for_leased_jobs_then_unbinds_and_stops_the_engine(host: Host) -> None:
    engine = ScriptedEngine()
    slot = host.slot(engine)
    await slot.ensure_warm()
    lease = slot.lease()
    unloading = asyncio.create_task(slot.unload())
    await asyncio.sleep(0.3)
    assert not unloading.done(), "the unload must wait for the job holding a lease"
    assert slot.state == "unloading" and not slot.wants_jobs
    with pytest.raises(SlotNotServing):
        slot.lease()
    lease.release()
    await asyncio.wait_for(unloading, 30)
    assert slot.state == "cold"
    assert engine.stops == 1
    # Triton finishes unloading in the background.
    await _until(lambda: not host.ready_in_triton(slot.name), timeout_s=15)


async def test_a_model_loads_again_after_an_unload_and_serves(host: Host) -> None:
    engine = ScriptedEngine()
    slot = host.slot(engine)
    await slot.ensure_warm()
    await slot.unload()
    served = await slot.ensure_warm()
    assert engine.starts == 2
    job = make_job(slot.name, "fast 3")
    chunks = [chunk_decoder.decode(raw) async for raw in served.client.stream(encode(job))]
    assert "".join(c.text for c in chunks) == "t0\x00 t1\x00 t2\x00 "
    await slot.unload()


async def test_a_model_sleeps_under_no_job_and_wakes_without_a_new_load(host: Host) -> None:
    engine = SleepyEngine()
    slot = host.slot(engine)
    await slot.ensure_warm()
    lease = slot.lease()
    sleeping = asyncio.create_task(slot.sleep())
    await asyncio.sleep(0.2)
    assert not sleeping.done() and slot.state == "sleeping" and not slot.wants_jobs
    lease.release()
    await asyncio.wait_for(sleeping, 10)
    assert engine.asleep and engine.sleeps == 1
    with pytest.raises(SlotNotServing):
        slot.lease()
    await slot.ensure_warm()
    assert not engine.asleep and engine.wakes == 1 and engine.starts == 1
    assert slot.state == "warm" and host.ready_in_triton(slot.name)
    slot.lease().release()
    await slot.unload()


async def test_listeners_see_each_state_a_slot_goes_through(host: Host) -> None:
    slots = Slots(
        [ModelConfig(name=f"m-{uuid.uuid4().hex[:8]}", path="unused")],
        host=host.triton,
        host_started=host.started,
        create_engine=lambda _: ScriptedEngine(),
    )
    (slot,) = slots.values()
    seen: list[str] = []
    stop_listening = slots.on_state_changed(lambda changed: seen.append(f"{changed.name}:{changed.state}"))
    await slot.ensure_warm()
    await slot.unload()
    stop_listening()
    await slot.ensure_warm()
    await slot.unload()
    assert seen == [f"{slot.name}:{state}" for state in ("loading", "warm", "unloading", "cold")]


async def test_a_failed_load_reaches_every_caller_that_joined_it_and_leaves_nothing_bound(host: Host) -> None:
    engine = ScriptedEngine(start_s=0.3, fail_start="CUDA out of memory")
    slot = host.slot(engine)
    results = await asyncio.gather(*(slot.ensure_warm() for _ in range(4)), return_exceptions=True)
    assert all(isinstance(r, LoadFailed) and "CUDA out of memory" in str(r) for r in results)
    assert engine.starts == 1, "callers that joined a failed load must not start loads of their own"
    assert engine.stops == 1
    assert slot.state == "cold"
    await _until(lambda: not host.ready_in_triton(slot.name), timeout_s=15)


async def test_the_consumer_reads_only_warm_models_and_a_waiting_job_runs_once_its_model_is_warm(
    host: Host,
) -> None:
    engine = ScriptedEngine()
    slots = Slots(
        [ModelConfig(name=f"m-{uuid.uuid4().hex[:8]}", path="unused")],
        host=host.triton,
        host_started=host.started,
        create_engine=lambda _: engine,
    )
    (slot,) = slots.values()
    consumer = JobConsumer(host.redis, host.writer, worker_id="w1", slots=slots, max_concurrent_jobs=4)
    await consumer.start()
    job = make_job(slot.name, "fast 2")
    await submit(host.redis, job)
    await asyncio.sleep(0.6)
    assert await host.redis.xlen(keys.job_stream(slot.name)) == 1, "the job waits in its stream"
    assert await host.redis.exists(keys.result_stream(job.id)) == 0
    await slot.ensure_warm()
    assert (await result(host.redis, job.id, timeout_s=10))[-1].finish_reason == "length"
    await _until(lambda: _is_zero(host.redis.xlen(keys.job_stream(slot.name))), timeout_s=10)
    await consumer.stop(drain_timeout_s=5)
    await slot.unload()


async def _is_zero(value: asyncio.Future[int] | object) -> bool:
    return await value == 0  # type: ignore[misc]


async def _until(check: Callable[[], object], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = check()
        if asyncio.iscoroutine(result) or isinstance(result, asyncio.Future):
            result = await result
        if result:
            return
        await asyncio.sleep(0.05)
    raise AssertionError("the condition did not hold in time")
