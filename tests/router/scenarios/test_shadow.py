"""Shadow traffic at the front door (`router.routing.rollouts.shadow`), against a real Redis and real front
doors: copies reach the shadow model's queue at about the route's percent, carry no tenant, cost the
caller's key nothing, are dropped while the shadow model's queue is long, while no worker holds it
warm (unless it may load) and when the worker has no slot to spare, never delay or change the real
answers (even when the shadow never answers), and with `keep_answers` the pairs land in their stream.

The test plays the worker: it answers every job queued for the route's targets with its model's name,
and the shadow's jobs as each test says (answered, dropped by a busy worker, or never).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from collections.abc import AsyncIterator
from typing import Any, Literal

import httpx
import msgspec
import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.api_keys import digest
from switchboard.cli import main as cli
from switchboard.config import ApiKey, ModelConfig, RouteConfig, Settings, ShadowConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, Job, JobError, SlotStatus, Usage, job_decoder
from tests.support.front_door_harness import advertise, serving, settings_for, worker_record, write_chunks
from tests.support.metric_samples import counter

STABLE, CANARY, SHADOW, ROUTE = "chat-v1", "chat-v2", "chat-v3", "chat"
SECRET = "sb-one-at-a-time"
OUTCOMES = ("answered", "failed", "dropped_queue", "dropped_cold", "dropped_busy")
ShadowMode = Literal["answers", "busy", "never"]


def shadowed_settings(redis_url: str, shadow: ShadowConfig) -> Settings:
    models = [ModelConfig(name=name, path="/nonexistent") for name in (STABLE, CANARY, SHADOW)]
    settings = settings_for(redis_url, models=models)
    settings.routes = {ROUTE: RouteConfig(targets={STABLE: 50, CANARY: 50}, shadow=shadow)}
    # One request at a time for this key and for the server: a copy that held one of their places
    # would get the next request refused.
    settings.auth.keys = [
        ApiKey(name="app", sha256=digest(SECRET), models=[ROUTE], max_parallel=1, rpm=10_000)
    ]
    settings.limits.max_in_flight = 1
    return settings


async def workers_hold(redis: aioredis.Redis, *warm: str) -> None:
    await advertise(redis, worker_record("w1", *(SlotStatus(model=model, state="warm") for model in warm)))


def outcomes() -> dict[str, float]:
    return {o: counter("switchboard:shadow_requests", route=ROUTE, model=SHADOW, outcome=o) for o in OUTCOMES}


def since(before: dict[str, float]) -> dict[str, float]:
    return {o: value - before[o] for o, value in outcomes().items() if value - before[o]}


@contextlib.asynccontextmanager
async def scripted_worker(redis: aioredis.Redis, shadow: ShadowMode) -> AsyncIterator[dict[str, list[Job]]]:
    """Answer the targets' jobs with their model's name at once; the shadow's as `shadow` says."""
    seen: dict[str, list[Job]] = {STABLE: [], CANARY: [], SHADOW: []}
    models = [STABLE, CANARY] if shadow == "never" else [STABLE, CANARY, SHADOW]
    streams: dict[Any, Any] = {keys.job_stream(model): "0" for model in models}
    usage = Usage(prompt_tokens=1, completion_tokens=2)

    async def answer() -> None:
        while True:
            response: Any = await redis.xread(streams, block=50)
            for stream, entries in response or ():
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                    seen[job.model].append(job)
                    if job.model != SHADOW:
                        await write_chunks(
                            redis, job.id, Chunk(text=job.model, finish_reason="stop", usage=usage)
                        )
                    elif shadow == "busy":
                        await write_chunks(
                            redis, job.id, Chunk(error=JobError(code="shadow_dropped", message="busy"))
                        )
                    else:
                        await write_chunks(
                            redis,
                            job.id,
                            Chunk(text="shadow "),
                            Chunk(text="says hi", finish_reason="stop", usage=usage),
                        )
                    # As a worker's ack frees the job's place in its queue.
                    await redis.xdel(stream, entry_id)

    task = asyncio.create_task(answer())
    try:
        yield seen
    finally:
        await cancel_and_wait(task)


async def ask(client: httpx.AsyncClient, session: int) -> httpx.Response:
    body = {"model": ROUTE, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    headers = {"authorization": f"Bearer {SECRET}", "x-session-id": f"s{session}"}
    return await client.post("/v1/chat/completions", json=body, headers=headers)


async def ask_in_turn(client: httpx.AsyncClient, count: int) -> list[float]:
    """`count` requests one after the other (the key allows one at a time), each answered by the
    version that served it; the seconds each took."""
    took = []
    for session in range(count):
        started = time.monotonic()
        response = await ask(client, session)
        took.append(time.monotonic() - started)
        assert response.status_code == 200, response.text
        answer = response.json()
        assert (
            answer["model"]
            == answer["choices"][0]["message"]["content"]
            == response.headers["x-switchboard-model"]
        )
    return took


async def settled(check: Any, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, "the copies did not settle"
        await asyncio.sleep(0.02)


async def test_copies_go_at_the_routes_percent_without_tenant_or_cost_and_their_pairs_are_kept(
    redis_server: PrivateRedis,
    redis: aioredis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    requests, percent = 300, 30.0
    shadow = ShadowConfig(model=SHADOW, percent=percent, max_waiting=1000, keep_answers=True)
    before = outcomes()
    await workers_hold(redis, STABLE, CANARY, SHADOW)
    async with (
        scripted_worker(redis, "answers") as seen,
        serving(shadowed_settings(redis_server.url, shadow)) as client,
    ):
        await ask_in_turn(client, requests)
        await settled(lambda: since(before).get("answered", 0) == len(seen[SHADOW]))
    copies = seen[SHADOW]
    share = percent / 100
    assert abs(len(copies) - requests * share) <= 4 * math.sqrt(requests * share * (1 - share)), len(copies)
    assert since(before) == {"answered": len(copies)}
    real = {job.id: job for job in seen[STABLE] + seen[CANARY]}
    assert len(real) == requests  # the copies took no real request's place, nor was any refused
    assert all(job.tenant is None and job.shadow and job.route == ROUTE for job in copies)
    assert not any(job.shadow for job in real.values()) and all(job.tenant == "app" for job in real.values())

    # As `switchboard shadow-answers chat` prints them, one JSON object a line.
    monkeypatch.setattr(cli, "configure_logging", lambda *_, **__: None)
    monkeypatch.setenv("REDIS_URL", redis_server.url)
    capsys.readouterr()
    assert cli.main(["shadow-answers", ROUTE, "--count", str(requests)]) == 0
    kept = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(kept) == len(copies)
    for pair in kept:
        served = real[str(pair["request_id"])]
        assert (pair["served_model"], pair["served_text"], pair["served_finish_reason"]) == (
            served.model,
            served.model,
            "stop",
        )
        assert (pair["shadow_model"], pair["shadow_text"], pair["shadow_finish_reason"]) == (
            SHADOW,
            "shadow says hi",
            "stop",
        )
        assert isinstance(pair["served_ttft_s"], float) and isinstance(pair["shadow_ttft_s"], float)
    assert 0 < await redis.ttl(keys.shadow_answers(ROUTE)) <= keys.SHADOW_ANSWERS_TTL_S
    # Every copy's results were deleted once read.
    assert not [job for job in copies if await redis.exists(keys.result_stream(job.id))]


async def test_a_shadow_that_never_answers_delays_nothing_costs_the_key_nothing_and_its_queue_caps_copies(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    shadow = ShadowConfig(model=SHADOW, percent=100, max_waiting=3)
    before = outcomes()
    await workers_hold(redis, STABLE, CANARY, SHADOW)
    async with (
        scripted_worker(redis, "never"),
        serving(shadowed_settings(redis_server.url, shadow)) as client,
    ):
        # Every request is copied, and no copy is ever answered: they stay in flight, but the key
        # that allows one request at a time is never refused, and no answer waits for them.
        took = await ask_in_turn(client, 12)
        await settled(lambda: sum(since(before).values()) == 9)
        assert await redis.xlen(keys.job_stream(SHADOW)) == 3
    assert since(before) == {"dropped_queue": 9}
    # Waiting for a copy would take its whole deadline (30 s): no answer comes near that.
    assert max(took) < 5.0, took


async def test_no_copy_goes_while_no_worker_holds_the_shadow_warm_unless_it_may_load_nor_runs_on_a_busy_worker(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    await workers_hold(redis, STABLE, CANARY)  # the shadow model is cold everywhere
    cold = ShadowConfig(model=SHADOW, percent=100, max_waiting=10)
    before = outcomes()
    async with scripted_worker(redis, "never"), serving(shadowed_settings(redis_server.url, cold)) as client:
        await ask_in_turn(client, 4)
        await settled(lambda: sum(since(before).values()) == 4)
    assert since(before) == {"dropped_cold": 4}
    assert await redis.xlen(keys.job_stream(SHADOW)) == 0

    # Allowed to load it, copies are queued for the cold model; a worker with no slot to spare drops them.
    may_load = msgspec.structs.replace(cold, may_load=True)
    before = outcomes()
    async with (
        scripted_worker(redis, "busy") as seen,
        serving(shadowed_settings(redis_server.url, may_load)) as client,
    ):
        await ask_in_turn(client, 4)
        await settled(lambda: sum(since(before).values()) == 4)
    assert len(seen[SHADOW]) == 4
    assert since(before) == {"dropped_busy": 4}
