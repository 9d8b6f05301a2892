"""The primary Redis is killed and Sentinel promotes its replica: the front door follows by itself.

A real primary, replica and three sentinels (tests/support/sentinel.py); the test plays the worker's
part through its own Sentinel client. Replicated jobs go on, a job the old primary acknowledged but
never passed to its replica is failed at once, and new requests are served.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterator

import pytest
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import keys
from switchboard.redis_conn import pooled_client, stream_entries
from switchboard.wire import Chunk, Job, Usage, job_decoder
from tests.support.front_door_harness import (
    BODY,
    MODEL,
    advertise,
    serving,
    settings_for,
    worker_record,
    write_chunks,
)
from tests.support.sentinel import SentinelTopology

LAST = Chunk(finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=2))
# A lost job is failed this soon after the new primary answers (README: "within seconds").
LOST_JOB_FAILED_WITHIN_S = 5.0


@pytest.fixture
def topology() -> Iterator[SentinelTopology]:
    with SentinelTopology() as started:
        yield started


class Jobs:
    """The jobs the front door enqueues, read in order without taking them (as no worker ran yet)."""

    def __init__(self, redis: aioredis.Redis) -> None:
        self.redis = redis
        self.last_id = b"0-0"

    async def next(self, timeout_s: float = 10.0) -> Job:
        async with asyncio.timeout(timeout_s):
            while True:
                response = await self.redis.xread({keys.job_stream(MODEL): self.last_id}, block=100, count=1)
                for _, entries in stream_entries(response):
                    self.last_id, fields = entries[0]
                    return job_decoder.decode(fields[keys.JOB_FIELD.encode()])


async def replicated(redis: aioredis.Redis) -> None:
    assert await redis.execute_command("WAIT", 1, 2000) == 1


async def once_served(write: Callable[[], Awaitable[None]], timeout_s: float = 15.0) -> None:
    """Run the worker's write as soon as the new primary takes it (a worker's retries do the same)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            await write()
            return
        except RedisError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


def texts(lines: list[str]) -> str:
    return "".join(
        json.loads(line[len("data: ") :])["choices"][0]["delta"].get("content") or ""
        for line in lines
        if line.startswith("data: {") and "choices" in line
    )


async def test_a_killed_primary_is_followed_and_only_unreplicated_jobs_fail(
    topology: SentinelTopology,
) -> None:
    settings = settings_for(topology.url, timeout_s=120, first_byte_budget_s=0.1)
    worker = pooled_client(topology.url)
    jobs = Jobs(worker)
    async with serving(settings) as client, asyncio.timeout(60):
        await advertise(worker, worker_record("w1"))
        # A: queued, replicated.
        queued = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
        job_a = await jobs.next()
        # B: streaming, its first text sent and replicated.
        async with client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as streamed:
            job_b = await jobs.next()
            await write_chunks(worker, job_b.id, Chunk(text="Hel"))
            lines = streamed.aiter_lines()
            first = [await anext(lines)]
            while not first[-1].startswith("data: "):
                first.append(await anext(lines))
            await replicated(worker)
            # C: the primary acknowledges it while its replica is stopped, then dies: C is lost.
            with topology.replication_cut():
                lost = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
                job_c = await jobs.next()
                old = topology.kill_primary()
                killed_at = time.monotonic()
            promoted_at = await asyncio.to_thread(topology.wait_promoted, old.port)

            # The premise: the new primary never had C.
            entries = stream_entries([(b"", await worker.xrange(keys.job_stream(MODEL)))])[0][1]
            queued_ids = [job_decoder.decode(fields[keys.JOB_FIELD.encode()]).id for _, fields in entries]
            assert job_a.id in queued_ids and job_c.id not in queued_ids

            # The worker answers A and finishes B on the new primary, as soon as it can write there.
            await once_served(lambda: write_chunks(worker, job_a.id, Chunk(text="ok"), LAST))
            served = await queued
            served_at = time.monotonic()
            await write_chunks(worker, job_b.id, Chunk(text="lo"), LAST)
            rest = [line async for line in lines if line]

        print(
            f"\nkill -> promoted {promoted_at - killed_at:.1f} s; "
            f"kill -> first request served {served_at - killed_at:.1f} s"
        )
        assert served.status_code == 200, served.text
        assert served.json()["choices"][0]["message"]["content"] == "ok"
        assert texts(first) + texts(rest) == "Hello"  # nothing sent twice, nothing skipped
        assert rest[-1] == "data: [DONE]"

        # New requests are served by the new primary.
        fresh = asyncio.create_task(client.post("/v1/chat/completions", json=BODY))
        job_d = await jobs.next()
        await write_chunks(worker, job_d.id, Chunk(text="ok"), LAST)
        assert (await fresh).status_code == 200

        # C: acknowledged by the old primary, never replicated: failed, not left to its deadline.
        try:
            async with asyncio.timeout(max(0.1, promoted_at + LOST_JOB_FAILED_WITHIN_S - time.monotonic())):
                response = await lost
        except TimeoutError:
            lost.cancel()
            pytest.fail(f"a job lost in the failover was not failed within {LOST_JOB_FAILED_WITHIN_S} s")
        assert response.status_code == 503, response.text
        assert response.json()["error"]["code"] == "redis_restarted"
    await worker.aclose()
