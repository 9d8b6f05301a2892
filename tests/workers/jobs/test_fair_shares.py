"""Fair shares of one worker's job slots between its warm models (`workers.jobs.consume`, `.shares`).

One worker's real pieces (Redis, PyTriton, the consumer, the writer) holding two scripted models on
8 slots: "flood" (weight 3) and "quiet" (weight 1, whose engine batches 3 at most). A flood of one
model must not hold back the other's jobs, slots scarce go by weight, a model takes no more than
its engine batches, and no job is lost or run twice on the way.
"""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.metrics import REGISTRY
from switchboard.wire import Job
from tests.support.jobs import make_job, result, submit
from tests.support.nice_values import process_nice
from tests.support.one_worker import until
from tests.support.scripted_engine import ScriptedEngine
from workers.jobs import consume
from workers.jobs.consume import JobConsumer
from workers.jobs.writer import ResultWriter
from workers.models.slots import Slots
from workers.runtime.cpu_priority import EnginePriorities, may_restore_priority
from workers.runtime.worker_metrics import SLOTS as SLOT_METRICS
from workers.triton.generator.model import CoalescingPolicy
from workers.triton.host import TritonHost

pytestmark = pytest.mark.asyncio(loop_scope="module")

SLOTS = 8
FLOOD, QUIET = "flood", "quiet"
QUIET_BATCH = 3
# A flood job holds its slot this long (30 tokens, 50 ms apart): far longer than a quiet job's start.
LONG = "slow 30 0.05"


@dataclass
class TwoModels:
    redis: aioredis.Redis
    consumer: JobConsumer
    engines: dict[str, ScriptedEngine]
    slots: Slots


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def worker() -> AsyncIterator[TwoModels]:
    with PrivateRedis() as server:
        redis = aioredis.Redis.from_url(server.url)
        host = TritonHost(
            coalescing=CoalescingPolicy(min_window_s=0.005, max_window_s=0.005, max_chunks_per_s=1000)
        )
        host_started = asyncio.Event()
        await asyncio.to_thread(host.start)
        host_started.set()
        engines = {FLOOD: ScriptedEngine(), QUIET: ScriptedEngine(max_sequences=QUIET_BATCH)}
        writer = ResultWriter(redis, "w1")
        writer.start()
        models = [ModelConfig(name=FLOOD, path="unused", weight=3.0), ModelConfig(name=QUIET, path="unused")]
        slots = Slots(models, host=host, host_started=host_started, create_engine=lambda m: engines[m.name])
        consumer = JobConsumer(redis, writer, worker_id="w1", slots=slots, max_concurrent_jobs=SLOTS)
        await consumer.start()
        await asyncio.gather(*(slot.ensure_warm() for slot in slots.values()))
        try:
            yield TwoModels(redis, consumer, engines, slots)
        finally:
            await consumer.stop(drain_timeout_s=5)
            await writer.stop()
            for slot in slots.values():
                await slot.unload()
            await asyncio.to_thread(host.stop)
            await redis.aclose()


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def idle(worker: TwoModels) -> None:
    """Each test starts on an idle worker."""
    await until(lambda: worker.consumer.running == 0, 20, "the previous test's jobs have ended")


async def first_chunk_s(redis: aioredis.Redis, one: Job) -> float:
    """Seconds from the job's enqueue to its first result chunk."""
    started = time.monotonic()
    await submit(redis, one)
    while not await redis.xread({keys.result_stream(one.id): b"0-0"}, count=1, block=20):
        pass
    return time.monotonic() - started


async def quiet_start_s(worker: TwoModels) -> float:
    """One quiet job's time to its first chunk (it is then let finish)."""
    one = make_job(QUIET, "fast 3")
    seconds = await first_chunk_s(worker.redis, one)
    assert (await result(worker.redis, one.id))[-1].finish_reason == "length"
    return seconds


def running(worker: TwoModels, model: str) -> int:
    return worker.slots[model].in_flight


async def test_a_flood_of_one_model_does_not_hold_back_the_other(worker: TwoModels) -> None:
    alone_s = statistics.median([await quiet_start_s(worker) for _ in range(5)])
    flood = [make_job(FLOOD, LONG) for _ in range(2 * SLOTS)]
    await submit(worker.redis, *flood)
    # The flood takes every slot it may: all but the quiet model's reserve.
    await until(lambda: running(worker, FLOOD) >= SLOTS - 1, 5, "the flood holds its slots")
    # Every one of them, the first included (it arrives while the flood's first jobs hold their slots).
    beside_s = max([await quiet_start_s(worker) for _ in range(5)])
    print(
        f"quiet model's first chunk: {alone_s * 1000:.0f} ms alone, at most {beside_s * 1000:.0f} ms beside"
    )
    # Three times as long at most, and 50 ms for the noise of a shared machine (a flood job lasts 1.5 s).
    assert beside_s < 3 * alone_s + 0.05, (alone_s, beside_s)
    assert running(worker, FLOOD) == SLOTS - 1  # still flooding: the quiet jobs did not wait for its end
    answers = await asyncio.gather(*(result(worker.redis, one.id) for one in flood))
    assert all(chunks[-1].finish_reason == "length" for chunks in answers)


async def test_with_fair_shares_off_the_slots_are_one_pool_all_used_and_never_more(
    worker: TwoModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(worker.consumer, "_fair", False)  # `worker.fair_shares = false`
    flood = [make_job(FLOOD, "slow 10 0.05") for _ in range(2 * SLOTS)]
    quiet = [make_job(QUIET, "slow 10 0.05") for _ in range(SLOTS)]
    await submit(worker.redis, *flood, *quiet)
    samples: list[int] = []
    while len(samples) < 20:
        samples.append(running(worker, FLOOD) + running(worker, QUIET))
        await asyncio.sleep(0.05)
    assert max(samples) == SLOTS and all(total <= SLOTS for total in samples), samples
    for one in flood + quiet:
        assert (await result(worker.redis, one.id))[-1].finish_reason == "length"


async def test_scarce_slots_go_by_weight_and_no_job_is_lost_or_run_twice(worker: TwoModels) -> None:
    # At 6 and 2 slots, both models have jobs waiting for about 2.4 s.
    heavy = [make_job(FLOOD, "slow 6 0.05") for _ in range(48)]
    light = [make_job(QUIET, "slow 6 0.05") for _ in range(24)]
    await submit(worker.redis, *light[:12], *heavy, *light[12:])
    samples: list[tuple[int, int]] = []
    await until(lambda: running(worker, FLOOD) > 0 and running(worker, QUIET) > 0, 5, "both models run")
    for _ in range(20):  # 1.5 s, both models with jobs waiting throughout
        samples.append((running(worker, FLOOD), running(worker, QUIET)))
        await asyncio.sleep(0.075)
    assert all(h + q <= SLOTS for h, q in samples), samples  # no read took more than the free slots
    heavy_share = sum(h for h, _ in samples) / sum(h + q for h, q in samples)
    assert 0.65 <= heavy_share <= 0.85, samples  # weights 3 : 1, so 0.75 of the slots
    answers = [await result(worker.redis, one.id) for one in heavy + light]  # one connection at a time
    assert all(chunks[-1].finish_reason == "length" for chunks in answers)
    ran = worker.engines[FLOOD].requests + worker.engines[QUIET].requests
    assert all(ran.count(one.id) == 1 for one in heavy + light)
    for model in (FLOOD, QUIET):
        assert (await worker.redis.xpending(keys.job_stream(model), keys.JOB_GROUP))["pending"] == 0


async def test_a_model_takes_no_more_jobs_than_its_engine_batches(worker: TwoModels) -> None:
    jobs = [make_job(QUIET, "slow 10 0.05") for _ in range(SLOTS)]
    await submit(worker.redis, *jobs)
    await until(lambda: running(worker, QUIET) == QUIET_BATCH, 5, "the quiet model runs its batch")
    await asyncio.sleep(0.2)
    assert running(worker, QUIET) == QUIET_BATCH
    # The rest wait in the stream, for this worker later or any other worker now.
    stream = keys.job_stream(QUIET)
    pending = (await worker.redis.xpending(stream, keys.JOB_GROUP))["pending"]
    assert await worker.redis.xlen(stream) - pending == SLOTS - QUIET_BATCH
    answers = await asyncio.gather(*(result(worker.redis, one.id) for one in jobs))
    assert all(chunks[-1].finish_reason == "length" for chunks in answers)


async def test_a_slot_freed_at_a_full_engine_batch_takes_the_next_job_at_once(
    worker: TwoModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A blocking read that only its timeout could end would hold the waiting job for 3 s.
    monkeypatch.setattr(consume, "BLOCK_MS", 3000)
    batch = [make_job(QUIET, "slow 4 0.05") for _ in range(QUIET_BATCH)]  # 0.2 s each
    await submit(worker.redis, *batch)
    await until(lambda: running(worker, QUIET) == QUIET_BATCH, 5, "the quiet model runs its batch")
    # The next job waits at the full batch while the consumer blocks on the other model's stream.
    next_s = await first_chunk_s(worker.redis, make_job(QUIET, "fast 3"))
    print(f"the job after a full batch started {next_s * 1000:.0f} ms after it was queued")
    assert next_s < 1.5, next_s
    for one in batch:
        assert (await result(worker.redis, one.id))[-1].finish_reason == "length"


async def test_the_metrics_show_each_models_running_and_waiting_jobs_and_their_waits_for_a_slot(
    worker: TwoModels,
) -> None:
    def sample(name: str, **labels: str) -> float:
        return REGISTRY.get_sample_value(name, labels) or 0.0

    waits_before = sample("switchboard:worker_slot_wait_seconds_count", model=QUIET)
    waited_before = sample("switchboard:worker_slot_wait_seconds_sum", model=QUIET)
    jobs = [make_job(QUIET, "slow 10 0.05") for _ in range(QUIET_BATCH + 2)]
    await submit(worker.redis, *jobs)
    await until(lambda: running(worker, QUIET) == QUIET_BATCH, 5, "the quiet model runs its batch")
    worker.slots[QUIET].jobs_waiting = 2  # as the controller's pass leaves it (tests/workers/controller)
    SLOT_METRICS.add("fair-w1", worker.slots)
    try:
        assert sample("switchboard:num_requests_running", model=QUIET, worker="fair-w1") == QUIET_BATCH
        assert sample("switchboard:worker_jobs_waiting", model=QUIET, worker="fair-w1") == 2
    finally:
        SLOT_METRICS.remove("fair-w1")
        worker.slots[QUIET].jobs_waiting = 0
    for one in jobs:
        await result(worker.redis, one.id)
    # Each job's wait for a slot is measured; the last two waited for the first ones to end (0.5 s).
    assert sample("switchboard:worker_slot_wait_seconds_count", model=QUIET) == waits_before + len(jobs)
    assert sample("switchboard:worker_slot_wait_seconds_sum", model=QUIET) - waited_before >= 2 * 0.4


@pytest.fixture
def stand_ins() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A waiting child process per model, standing in for its engine's own (the scripted engines
    compute in this process)."""
    if not may_restore_priority():
        pytest.skip("lowering a nice value needs CAP_SYS_NICE, which this process lacks")
    children = {
        name: subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        for name in (FLOOD, QUIET)
    }
    try:
        yield children
    finally:
        for child in children.values():
            child.kill()
            child.wait()


async def test_the_floods_engine_yields_the_cores_while_the_quiet_model_runs_and_gets_them_back_after(
    worker: TwoModels, stand_ins: dict[str, subprocess.Popen[bytes]], monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, child in stand_ins.items():
        monkeypatch.setattr(worker.engines[name], "process_ids", lambda pid=child.pid: [pid])
    priorities = EnginePriorities(
        worker.slots.model_loads,
        worker.slots.engine_processes,
        background_nice=10,
        total_slots=SLOTS,  # the flood's share is 6 (weight 3 of 4); it runs 7
        restore_after_s=0.3,
    )
    stop_listening = worker.slots.on_jobs_changed(priorities.update)
    flood_pid, quiet_pid = stand_ins[FLOOD].pid, stand_ins[QUIET].pid
    try:
        flood = [make_job(FLOOD, LONG) for _ in range(2 * SLOTS)]
        await submit(worker.redis, *flood)
        await until(lambda: running(worker, FLOOD) >= SLOTS - 1, 5, "the flood holds its slots")
        assert process_nice(flood_pid) == [0]  # alone, it computes as before
        quiet = make_job(QUIET, "slow 6 0.05")
        await submit(worker.redis, quiet)
        await until(lambda: running(worker, QUIET) == 1, 5, "the quiet job runs")
        assert process_nice(flood_pid) == [10]
        assert process_nice(quiet_pid) == [0]
        assert (await result(worker.redis, quiet.id))[-1].finish_reason == "length"
        await until(lambda: process_nice(flood_pid) == [0], 5, "the flood has its priority back")
        assert running(worker, FLOOD) > 0  # given back while it still floods: the grace, not its end
        answers = await asyncio.gather(*(result(worker.redis, one.id) for one in flood))
        assert all(chunks[-1].finish_reason == "length" for chunks in answers)
    finally:
        stop_listening()
