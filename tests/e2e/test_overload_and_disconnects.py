"""Clients that leave at random moments, and a flood beyond the limits, against the real stack.

Both run on the shared stack; the flood goes through a front door of its own whose limits are tight
(limits are the front door's settings), stopped after it.

Each test reports its figures (requests, outcomes, time to recover) on stdout: `pytest -s` shows them.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import Counter

import httpx
import psutil
import pytest
import redis

from switchboard import keys
from tests.support.stack import MODEL, Stack

pytestmark = pytest.mark.e2e

MESSAGES = [{"role": "user", "content": "Tell me a long story about the sea."}]
# The flood's limits: 8 requests in flight across the front doors, 8 jobs waiting per model.
LIMITS = {"SWITCHBOARD_LIMITS__MAX_IN_FLIGHT": "8", "SWITCHBOARD_LIMITS__MAX_QUEUE_DEPTH": "8"}


def in_flight(stack: Stack) -> int:
    status = httpx.get(f"{stack.base_url}/admin/models/{MODEL}", timeout=10).json()
    return int(status["in_flight"])


def test_fifty_streaming_and_fifty_plain_clients_leaving_at_random_free_the_engine(
    stack: Stack,
) -> None:
    body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 400, "min_tokens": 400}
    rng = random.Random(17)

    async def leave_after(client: httpx.AsyncClient, stream: bool, after_s: float) -> str:
        async def call() -> None:
            if stream:
                async with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as r:
                    async for _ in r.aiter_bytes():
                        pass
            else:
                await client.post("/v1/chat/completions", json=body)

        try:
            await asyncio.wait_for(call(), timeout=after_s)
        except TimeoutError:
            return "left"
        return "finished"

    async def hundred_clients() -> list[str]:
        async with httpx.AsyncClient(base_url=stack.base_url, timeout=60) as client:
            return await asyncio.gather(
                *(leave_after(client, stream, rng.uniform(0.05, 3.0)) for stream in [True, False] * 50)
            )

    outcomes = asyncio.run(hundred_clients())
    left_at = time.monotonic()
    stack.wait_until(lambda: in_flight(stack) == 0, timeout_s=20, what="every abandoned job to end")
    recovered_s = time.monotonic() - left_at
    store = redis.Redis.from_url(stack.redis_url)
    # Nothing leaks: what a job left behind (its result stream, record, cancel mark) expires by itself.
    # A key kept only a short while after its job ended may be gone between the scan and its TTL's
    # read (TTL -2), or be in its last second (TTL 0): none stays for good (TTL -1) or past the longest lifetime.
    for key in store.scan_iter(match=keys.job_record("*")):  # every key of every job
        ttl = store.ttl(key)
        assert ttl == -2 or 0 <= ttl <= max(keys.RESULT_TTL_S, keys.CANCEL_TTL_S), (key, ttl)
    pending = store.xpending(keys.job_stream(MODEL), keys.JOB_GROUP)["pending"]
    print(f"\n100 clients: {Counter(outcomes)}; engine idle {recovered_s:.1f} s after the last left")
    assert Counter(outcomes)["left"] >= 90  # 400 tokens each take far longer than 3 s here
    assert pending == 0
    # Still serving after all that.
    answer = httpx.post(
        f"{stack.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": MESSAGES, "max_tokens": 4},
        timeout=60,
    )
    assert answer.status_code == 200


def test_a_flood_beyond_the_limits_is_refused_politely_and_memory_stays_flat(stack: Stack) -> None:
    limited = stack.spawn_front_door(env=LIMITS)
    try:
        front_door = psutil.Process(limited.component.pid)
        store = redis.Redis.from_url(stack.redis_url)

        async def flood(count: int) -> list[httpx.Response]:
            body = {"model": MODEL, "messages": MESSAGES, "max_tokens": 16}
            async with httpx.AsyncClient(base_url=limited.base_url, timeout=120) as client:
                return await asyncio.gather(
                    *(client.post("/v1/chat/completions", json=body) for _ in range(count))
                )

        asyncio.run(flood(50))  # warm up: the first flood allocates what every later one reuses
        rss_before = front_door.memory_info().rss
        redis_before = int(store.info("memory")["used_memory"])
        started = time.monotonic()
        responses = asyncio.run(flood(400))
        seconds = time.monotonic() - started
        statuses = Counter(response.status_code for response in responses)
        refused = [response for response in responses if response.status_code == 429]
        rss_growth = front_door.memory_info().rss - rss_before
        redis_growth = int(store.info("memory")["used_memory"]) - redis_before
        print(
            f"\n400 requests at once on limits of 8 in flight: {dict(statuses)} in {seconds:.1f} s; "
            f"front door RSS {rss_growth / 2**20:+.1f} MiB, Redis {redis_growth / 2**20:+.2f} MiB"
        )
        assert set(statuses) <= {200, 429}, statuses
        assert statuses[200] >= 8 and statuses[429] >= 100
        for response in refused:
            error = response.json()["error"]
            assert error["code"] in ("server_busy", "queue_full", "rate_limit_exceeded")
            assert int(response.headers["Retry-After"]) >= 1
        for response in responses:
            if response.status_code == 200:
                assert response.json()["choices"][0]["message"]["content"]
        assert rss_growth < 64 * 2**20
        assert redis_growth < 8 * 2**20
    finally:
        stack.stop_front_door(limited)
