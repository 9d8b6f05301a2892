"""A rollout is judged by callers, not requests, at a real front door with real Redis: one key that
floods the route with requests the canary fails (from session ids of its choosing) is one failing
caller among the healthy ones, and the healthy canary is promoted; and with keys on, a session id
places a caller within its own key only, so one key cannot choose another key's bucket.

Before, the flood was most of the canary's requests: its failure rate rolled the canary back at the
first check, however healthy it was for everyone else.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

import httpx
import msgspec
import pytest
import redis.asyncio as aioredis

from router.routing.rollouts import judge
from router.telemetry import rollout_observations as observations
from switchboard import keys
from switchboard.config import ApiKey
from switchboard.local.redis_server import PrivateRedis
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, JobError, SlotStatus, Usage, job_decoder
from tests.router.scenarios.test_rollouts import until, weights
from tests.router.scenarios.test_routes import CANARY, ROUTE, STABLE, both_targets_answered, routed_settings
from tests.support.front_door_harness import advertise, serving, worker_record, write_chunks

POISON = "poison"
HONEST_KEYS = 10
# Judged once 5 callers reached the canary; the flooding key is then at most 1 in 5 (20 %), under
# the allowance of 25 points; a single failed check rolls back.
EXCESS = 0.25
PLAN = {
    "canary": CANARY,
    "steps": [50, 100],
    "interval_s": 0.5,
    "min_requests": 5,
    "min_callers": 5,
    "max_failure_excess": EXCESS,
    "failed_checks_to_roll_back": 1,
    "max_ttft_p95_ratio": 50.0,
    "max_itl_p95_ratio": 50.0,
}


@pytest.fixture(autouse=True)
def quick_judge(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(judge, "TICK_S", 0.1)
    monkeypatch.setattr(judge, "LEASE_MS", 1000)
    monkeypatch.setattr(observations, "FLUSH_S", 0.1)


def secret_digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer(secret: str) -> dict[str, str]:
    return {"authorization": f"Bearer {secret}"}


@contextlib.asynccontextmanager
async def canary_fails_poison(redis: aioredis.Redis) -> AsyncIterator[None]:
    """A live worker holding both targets warm: the canary's engine fails every job asking for
    POISON, and answers every other job as stable does."""
    streams: dict[Any, Any] = {keys.job_stream(STABLE): "0", keys.job_stream(CANARY): "0"}
    done = Chunk(text="ok", finish_reason="stop", usage=Usage(prompt_tokens=1, completion_tokens=1))
    broken = Chunk(error=JobError(code="engine_error", message="the canary broke"))

    async def take() -> None:
        beat = 0.0
        while True:
            if time.monotonic() - beat > 1.0:
                slots = [SlotStatus(model=model, state="warm") for model in (CANARY, STABLE)]
                record = msgspec.structs.replace(worker_record("w1", *slots), allowed=(CANARY, STABLE))
                await advertise(redis, record)
                beat = time.monotonic()
            response: Any = await redis.xread(streams, block=50)
            for stream, entries in response or ():
                canary = stream.decode() == keys.job_stream(CANARY)
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                    poisoned = job.messages is not None and job.messages[-1].content == POISON
                    await write_chunks(redis, job.id, broken if canary and poisoned else done)
                    await redis.xdel(stream, entry_id)

    task = asyncio.create_task(take())
    try:
        yield
    finally:
        await cancel_and_wait(task)


@contextlib.asynccontextmanager
async def callers(client: httpx.AsyncClient, *loops: tuple[str, str]) -> AsyncIterator[None]:
    """Each (secret, content) sends requests to the route with that content, each from a session id
    of its own, one after another, until the block ends."""

    async def send(secret: str, content: str) -> None:
        body = {"model": ROUTE, "messages": [{"role": "user", "content": content}], "max_tokens": 1}
        while True:
            with contextlib.suppress(httpx.HTTPError):
                headers = {**bearer(secret), "x-session-id": uuid.uuid4().hex}
                await client.post("/v1/chat/completions", json=body, headers=headers)

    tasks = [asyncio.create_task(send(secret, content)) for secret, content in loops]
    try:
        yield
    finally:
        for task in tasks:
            await cancel_and_wait(task)


async def test_one_key_flooding_the_canary_with_failures_is_one_caller_and_a_healthy_canary_is_promoted(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = routed_settings(redis_server.url, stable=100, canary=0)
    honest = [f"sb-honest-{n}" for n in range(HONEST_KEYS)]
    settings.auth.keys = [
        ApiKey(name="ops", sha256=secret_digest("sb-ops"), admin=True),
        ApiKey(name="mallory", sha256=secret_digest("sb-mallory")),
        *(ApiKey(name=f"honest-{n}", sha256=secret_digest(secret)) for n, secret in enumerate(honest)),
    ]
    async with canary_fails_poison(redis), serving(settings) as client:
        client.headers.update(bearer("sb-ops"))
        started = await client.post(f"/admin/routes/{ROUTE}/rollout", json=PLAN)
        assert started.status_code == 201, started.text
        # Eight requests at a time from the flooding key, one at a time from each honest key.
        flood = [("sb-mallory", POISON)] * 8
        async with callers(client, *flood, *((secret, "Hi") for secret in honest)):
            ended = await until(client, lambda r: r["phase"] in ("promoted", "rolled_back"), 20)
        route = (await client.get(f"/admin/routes/{ROUTE}")).json()
    assert ended["phase"] == "promoted", ended.get("reason")
    assert ended["checks_failed"] == 0
    check = ended["last_check"]["canary"]
    # Judged by requests, the flood's failures would have failed the check; one caller of many failed.
    assert check["failures"] / check["requests"] > EXCESS, check
    assert check["failing_callers"] == 1 and check["callers"] >= PLAN["min_callers"], check
    assert weights(route) == [0, 100]


async def test_with_keys_on_a_session_id_places_a_caller_within_its_own_key(
    redis_server: PrivateRedis, redis: aioredis.Redis
) -> None:
    settings = routed_settings(redis_server.url, stable=50, canary=50)
    settings.auth.keys = [
        ApiKey(name="alice", sha256=secret_digest("sb-alice")),
        ApiKey(name="bob", sha256=secret_digest("sb-bob")),
    ]
    sessions = [f"s{n}" for n in range(20)]

    async def placed(secret: str, session: str) -> str:
        body = {"model": ROUTE, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        headers = {**bearer(secret), "x-session-id": session}
        answer = await client.post("/v1/chat/completions", json=body, headers=headers)
        assert answer.status_code == 200, answer.text
        return str(answer.json()["model"])

    async with both_targets_answered(redis), serving(settings) as client:
        alice = [await placed("sb-alice", session) for session in sessions]
        bob = [await placed("sb-bob", session) for session in sessions]
        # Sticky within a key...
        assert [await placed("sb-alice", session) for session in sessions] == alice
    # ...but bob naming alice's session ids does not follow her: each key is placed by its own
    # buckets (the same 20 ids placing both keys alike has a chance of 2^-20 at 50/50).
    assert bob != alice
    assert set(alice) == set(bob) == {STABLE, CANARY}
