"""Tiers at the worker (`workers.jobs.consume`): inside one model's slots, jobs start priority first,
then default, then flex, whatever order they came in; the batch tier's lines take only slots no
interactive job wants (at most `max_batch_jobs`, never the last free slot, none while interactive
jobs wait). Against a real Redis and a real PyTriton around a scripted engine (4 slots: a batch
bound of 2)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
import pytest_asyncio

from switchboard import keys
from switchboard.demand import note_demand
from switchboard.wire import Job, Tier, encode
from tests.support.jobs import result, write_record
from tests.support.one_worker import Worker, job, until
from workers.jobs import shares
from workers.jobs.consume import batch_shares

pytestmark = pytest.mark.asyncio(loop_scope="module")


def tiered(prompt: str, tier: Tier) -> Job:
    return msgspec.structs.replace(job(prompt), tier=tier)


async def submit_at_once(worker: Worker, *jobs: Job) -> None:
    """Queue `jobs` in one transaction, in this order, each on its tier's stream."""
    pipe = worker.redis.pipeline(transaction=True)
    for one in jobs:
        write_record(pipe, one)
        pipe.xadd(keys.job_stream(one.model, one.tier), {keys.JOB_FIELD: encode(one)})
        note_demand(pipe, one.model, one.id)
    await pipe.execute()


async def end(worker: Worker, one: Job) -> None:
    """Cancel a hanging job and wait for its end."""
    await worker.redis.set(keys.cancel_mark(one.id), b"1", ex=60)
    assert (await result(worker.redis, one.id))[-1].finish_reason == "abort"


def started(worker: Worker, jobs: list[Job]) -> list[Job]:
    return [one for one in jobs if one.id in worker.engine.requests]


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def idle_worker(worker: Worker) -> None:
    await until(lambda: worker.consumer.running == 0, 10, "the previous test's jobs have ended")


async def test_jobs_of_one_model_start_priority_then_default_then_flex(worker: Worker) -> None:
    holders = [tiered("hang", "default") for _ in range(4)]
    await submit_at_once(worker, *holders)
    await until(lambda: len(started(worker, holders)) == 4, 5, "four jobs hold every slot")
    flex, default, priority = tiered("hang", "flex"), tiered("hang", "default"), tiered("hang", "priority")
    await submit_at_once(worker, flex, default, priority)  # arriving in the opposite order
    order: list[Job] = []
    for holder in holders[:3]:
        await end(worker, holder)
        await until(
            lambda: len(started(worker, [flex, default, priority])) > len(order), 5, "a slot is taken"
        )
        (new,) = [one for one in started(worker, [flex, default, priority]) if one not in order]
        order.append(new)
    assert [one.tier for one in order] == ["priority", "default", "flex"]
    for one in [holders[3], *order]:
        await end(worker, one)


async def test_batch_lines_take_at_most_their_bound_and_leave_a_slot_for_interactive_jobs(
    worker: Worker,
) -> None:
    lines = [tiered("hang", "batch") for _ in range(5)]
    await submit_at_once(worker, *lines)
    await until(lambda: len(started(worker, lines)) == 2, 5, "two batch lines run")
    await asyncio.sleep(0.5)  # reads go on: no third line is taken
    assert len(started(worker, lines)) == 2
    interactive = job("fast 3")
    await submit_at_once(worker, interactive)
    assert (await result(worker.redis, interactive.id, timeout_s=5))[-1].finish_reason == "length"
    # The rest run as those running end, never more than two at once.
    ended: list[Job] = []
    while len(ended) < len(lines):
        await until(lambda: len(started(worker, lines)) > len(ended), 5, "the next batch line runs")
        running = [line for line in started(worker, lines) if line not in ended]
        assert len(running) <= 2
        await end(worker, running[0])
        ended.append(running[0])


async def test_no_batch_line_is_taken_while_interactive_jobs_wait(worker: Worker) -> None:
    holders = [tiered("hang", "default") for _ in range(4)]
    await submit_at_once(worker, *holders)
    await until(lambda: len(started(worker, holders)) == 4, 5, "four jobs hold every slot")
    line = tiered("hang", "batch")
    waiting = [tiered("hang", "flex") for _ in range(2)]
    await submit_at_once(worker, line, *waiting)
    for holder in holders[:2]:
        await end(worker, holder)
    await until(lambda: len(started(worker, waiting)) == 2, 5, "the interactive jobs take the freed slots")
    await asyncio.sleep(0.5)
    assert line.id not in worker.engine.requests  # no slot to spare: every one is taken
    for one in [*holders[2:], *waiting]:
        await end(worker, one)
    await until(lambda: line.id in worker.engine.requests, 5, "the batch line runs once slots are spare")
    await end(worker, line)


async def test_while_interactive_jobs_run_fewer_batch_lines_start(worker: Worker) -> None:
    # 2 batch lines at most, 1 beside interactive jobs (an eighth of 2, at least 1).
    interactive = job("hang")
    await submit_at_once(worker, interactive)
    await until(lambda: interactive.id in worker.engine.requests, 5, "the interactive job runs")
    lines = [tiered("hang", "batch") for _ in range(3)]
    await submit_at_once(worker, *lines)
    await until(lambda: len(started(worker, lines)) == 1, 5, "one batch line runs")
    await asyncio.sleep(0.5)
    assert len(started(worker, lines)) == 1
    await end(worker, interactive)
    await until(
        lambda: len(started(worker, lines)) == 2, 5, "a second line runs once the worker is the batch's"
    )
    ended: list[Job] = []
    while len(ended) < len(lines):
        await until(lambda: len(started(worker, lines)) > len(ended), 5, "the next batch line runs")
        running = [line for line in started(worker, lines) if line not in ended]
        await end(worker, running[0])
        ended.append(running[0])


def test_the_batch_budget_is_split_among_the_models_that_may_take_lines() -> None:
    demands = [shares.ModelDemand(name=name, running=0, room=64) for name in ("a", "b")]
    # Each model allotted 32 slots, 32 batch lines in all: both get their half, neither waits.
    assert batch_shares(demands, {"a": 32, "b": 32}, 32) == {"a": 16, "b": 16}
    # The remainder goes to each in turn; what one cannot take goes to the other.
    assert batch_shares(demands, {"a": 32, "b": 32}, 3, turn=1) == {"b": 2, "a": 1}
    assert batch_shares(demands, {"a": 2, "b": 32}, 32) == {"a": 2, "b": 30}
