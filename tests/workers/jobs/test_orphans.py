"""Jobs whose front door died are cancelled after a grace; those resumed elsewhere run on (real Redis)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import redis.asyncio as aioredis

from switchboard import keys
from switchboard.wire import Job, SamplingParams
from workers.jobs.orphans import OrphanWatch


def job(job_id: str, router_id: str | None) -> Job:
    now = time.time()
    return Job(
        id=job_id,
        model="m",
        sampling=SamplingParams(),
        prompts=("p",),
        created=now,
        deadline=now + 60,
        router_id=router_id,
    )


async def test_jobs_of_a_dead_front_door_are_cancelled_after_the_grace_unless_resumed(
    redis: aioredis.Redis,
) -> None:
    await redis.set(keys.router_alive("alive"), b"1", ex=keys.ROUTER_TTL_S)
    watch = OrphanWatch(redis, grace_s=0.3)
    for one in (job("kept", "alive"), job("orphan", "dead"), job("resumed", "dead"), job("old", None)):
        watch.track(one)
    await redis.hset(keys.job_record("resumed"), "resumes", 1)

    assert await watch.check() == []  # gone, but not yet for the grace: its clients may still resume
    await asyncio.sleep(0.35)
    assert await watch.check() == ["orphan"]

    assert await redis.exists(keys.cancel_mark("orphan"))
    assert 0 < await redis.ttl(keys.cancel_mark("orphan")) <= keys.CANCEL_TTL_S
    for untouched in ("kept", "resumed", "old"):
        assert not await redis.exists(keys.cancel_mark(untouched))


async def test_a_front_door_that_comes_back_within_the_grace_keeps_its_jobs(redis: aioredis.Redis) -> None:
    watch = OrphanWatch(redis, grace_s=0.3)
    watch.track(job("j", "blip"))
    assert await watch.check() == []
    await redis.set(keys.router_alive("blip"), b"1", ex=keys.ROUTER_TTL_S)  # back again
    await asyncio.sleep(0.35)
    assert await watch.check() == []
    await redis.delete(keys.router_alive("blip"))
    assert await watch.check() == []  # its grace starts again from now
    watch.untrack("j")
    await asyncio.sleep(0.35)
    assert await watch.check() == []  # finished jobs are not watched
    assert not await redis.exists(keys.cancel_mark("j"))


async def test_marked_jobs_are_aborted_once_and_orphans_in_the_same_pass(redis: aioredis.Redis) -> None:
    aborted: list[str] = []

    def abort(job_id: str) -> Callable[[], Awaitable[None]]:
        async def run() -> None:
            aborted.append(job_id)

        return run

    watch = OrphanWatch(redis, grace_s=0.0)
    await redis.set(keys.router_alive("alive"), b"1", ex=keys.ROUTER_TTL_S)
    for one in (job("left", "alive"), job("reading", "alive"), job("orphan", "dead"), job("old", None)):
        watch.track(one, abort=abort(one.id))
    await redis.set(keys.cancel_mark("left"), b"1", ex=keys.CANCEL_TTL_S)
    await redis.set(keys.cancel_mark("old"), b"1", ex=keys.CANCEL_TTL_S)

    assert await watch.check() == ["orphan"]
    assert sorted(aborted) == ["left", "old", "orphan"], "the orphan in the pass that marked it"
    assert await watch.check() == [], "marked once"
    assert sorted(aborted) == ["left", "old", "orphan"], "each once"
