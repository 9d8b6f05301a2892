"""`/readyz` is open to anyone: it names models only to a key that may use them, and a flood of
probes shares one read of the worker records a second."""

from __future__ import annotations

import asyncio
import time

import msgspec
import redis.asyncio as aioredis

from switchboard import api_keys
from switchboard.config import ApiKey, ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.readiness import ENGINES_PREPARING
from tests.support.front_door_harness import MODEL, advertise, serving, settings_for, worker_record

OTHER = "secret-project"
MODELS = [ModelConfig(name=MODEL, path="/nonexistent"), ModelConfig(name=OTHER, path="/nonexistent")]
USER_SECRET = api_keys.new_secret()


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


async def test_readyz_names_models_only_to_a_key_that_may_use_them(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, models=MODELS)
    settings.auth.keys = [ApiKey(name="user", sha256=api_keys.digest(USER_SECRET), models=[MODEL])]
    await advertise(redis, worker_record("w1"))
    async with serving(settings) as client:
        anonymous = await client.get("/readyz")
        assert anonymous.status_code == 200
        assert anonymous.json()["workers"] == 1
        assert anonymous.json()["models"] is None
        assert OTHER not in anonymous.text and MODEL not in anonymous.text
        wrong_key = await client.get("/readyz", headers={"Authorization": "Bearer nope"})
        assert wrong_key.status_code == 200 and wrong_key.json()["models"] is None
        user = await client.get("/readyz", headers={"Authorization": f"Bearer {USER_SECRET}"})
        assert user.json()["models"] == {MODEL: True}
        # A missing model, asked for with a key, lists only the models the key may use.
        unknown = await client.get("/readyz", params={"model": "nope"}, headers=bearer(USER_SECRET))
        assert unknown.status_code == 404
        assert OTHER not in unknown.text


async def test_readyz_for_one_model_tells_nobody_without_a_key_whether_it_exists(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """Without a key, `?model=` answered 200 (or 503) for a configured model and 404 for any other
    name: anyone could list the models by trying names."""
    settings = settings_for(redis_server.url, models=MODELS)
    settings.auth.keys = [ApiKey(name="user", sha256=api_keys.digest(USER_SECRET), models=[MODEL])]
    await advertise(redis, worker_record("w1"))
    async with serving(settings) as client:
        for headers in ({}, bearer(api_keys.new_secret())):
            answers = [
                await client.get("/readyz", params={"model": name}, headers=headers)
                for name in (MODEL, OTHER, "nope")
            ]
            assert [answer.status_code for answer in answers] == [401, 401, 401]
            assert answers[0].json() == answers[1].json() == answers[2].json()
        # The plain probe stays open; a key that may use the model gets its answer, and one that may
        # not is told so, as a request to it would be.
        assert (await client.get("/readyz")).status_code == 200
        assert (
            await client.get("/readyz", params={"model": MODEL}, headers=bearer(USER_SECRET))
        ).status_code == 200
        forbidden = await client.get("/readyz", params={"model": OTHER}, headers=bearer(USER_SECRET))
        assert forbidden.status_code == 403


async def test_a_flood_of_probes_shares_one_read_a_second(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    await advertise(redis, worker_record("w1"))
    async with serving(settings_for(redis_server.url)) as client:
        assert (await client.get("/readyz")).status_code == 200
        assert (await client.get("/metrics")).status_code == 200
        before = await redis.info("commandstats")
        answers = await asyncio.gather(
            *(client.get(path) for _ in range(50) for path in ("/readyz", "/metrics"))
        )
        after = await redis.info("commandstats")
    assert all(answer.status_code == 200 for answer in answers)
    calls = {
        name: after.get(name, {}).get("calls", 0) - before.get(name, {}).get("calls", 0)
        for name in ("cmdstat_zrangebyscore", "cmdstat_hgetall", "cmdstat_evalsha", "cmdstat_mget")
    }
    # A read or two of each (a copy may grow old while the flood lasts, and the key table's copy is
    # renewed every 2 s), not one per probe (50 each).
    assert all(count <= 3 for count in calls.values()), calls


async def test_readyz_waits_for_a_worker_whose_engines_are_prepared(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """Until one is, a first request would wait tens of seconds for Triton and the engine's import."""
    await advertise(redis, msgspec.structs.replace(worker_record("w1"), engines_ready=False))
    async with serving(settings_for(redis_server.url)) as client:
        preparing = await client.get("/readyz")
        assert preparing.status_code == 503
        assert preparing.json()["error"]["code"] == ENGINES_PREPARING
        await advertise(redis, worker_record("w1"))
        await advertise(redis, msgspec.structs.replace(worker_record("w2"), engines_ready=False))
        deadline = time.monotonic() + 5  # probes share a read of the records up to a second old
        while (ready := await client.get("/readyz")).status_code != 200:
            assert time.monotonic() < deadline, "not ready once the worker's engines were"
            await asyncio.sleep(0.1)
        # One prepared is enough to serve; the count lets `switchboard up` wait for every worker.
        assert (ready.json()["workers"], ready.json()["workers_prepared"]) == (2, 1)
    # Front doors that are ready without workers stay ready while the first one prepares.
    await advertise(redis, msgspec.structs.replace(worker_record("w1"), engines_ready=False))
    settings = settings_for(redis_server.url)
    settings.router.ready_without_workers = True
    async with serving(settings) as client:
        assert (await client.get("/readyz")).status_code == 200
