"""`/admin/models`: status read from what workers advertise in Redis, and load/unload requests."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import httpx
import pytest
import redis.asyncio as aioredis

from switchboard import keys
from switchboard.config import ModelConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.ports import free_port
from switchboard.wire import LoadFailure, SlotStatus, desired_state_decoder, encode
from tests.support.front_door_harness import (
    BODY,
    MODEL,
    advertise,
    record_load_times,
    serving,
    settings_for,
    worker_record,
)

OTHER = "org/other-model"
MODELS = [
    ModelConfig(name=MODEL, path="/nonexistent", keep_alive_s=-1),
    ModelConfig(name=OTHER, path="/nonexistent"),
]


@pytest.fixture
async def admin(redis: aioredis.Redis, redis_server: PrivateRedis) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(settings_for(redis_server.url, timeout_s=0.2, models=MODELS)) as client:
        yield client


async def test_models_nobody_holds_are_listed_cold(admin: httpx.AsyncClient) -> None:
    response = await admin.get("/admin/models")
    assert response.status_code == 200
    body = response.json()
    assert body["object"] == "list"
    assert [m["name"] for m in body["data"]] == [MODEL, OTHER]
    assert body["data"][0] == {
        "name": MODEL,
        "state": "cold",
        "replicas": [],
        "waiting": 0,
        "in_flight": 0,
        "load_seconds": {},
        "idle_s": None,
        "leaves_in_s": None,
        "never_leaves": False,
        "failure": None,
        "cached_on": [],
        "base": None,
        "object": "model.status",
    }


async def test_status_gathers_replicas_queue_costs_and_failures(
    admin: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    now = time.time()
    warm = SlotStatus(model=MODEL, state="warm", replica=0, in_flight=2, idle_since=now - 100, warm_since=now)
    loading = SlotStatus(model=MODEL, state="loading", replica=1, load_started=now - 12, expected_load_s=50)
    idle_other = SlotStatus(model=OTHER, state="warm", replica=0, idle_since=now - 30, leaves_at=now + 270)
    await advertise(
        redis,
        worker_record("w1", warm, idle_other, host="gpu-a", kind="H100"),
        worker_record("w2", loading, host="gpu-b", kind="H100"),
    )
    await record_load_times(redis, MODEL, "H100", 40.0, 52.0, 44.0)
    await record_load_times(redis, MODEL, "cpu", 99.0)  # no live cpu worker: not read
    # Three jobs wait for MODEL, one of them taken (pending) by a worker.
    for _ in range(3):
        await admin.post("/v1/chat/completions", json=BODY)
    await redis.xgroup_create(keys.job_stream(MODEL), keys.JOB_GROUP, id="0")
    await redis.xreadgroup(keys.JOB_GROUP, "w1", {keys.job_stream(MODEL): ">"}, count=1)
    failure = LoadFailure(model=OTHER, worker_id="w2", reason="disk full", failed_at=now, retry_at=now + 20)
    await redis.set(keys.load_failure(OTHER), encode(failure), ex=20)

    tiny, other = (await admin.get("/admin/models")).json()["data"]
    # Every duration is as of the answer: the state's own plus what passed since it was written
    # (seconds on a loaded machine), give or take the answer's rounding.
    passed = time.time() - now + 0.1

    assert tiny["state"] == "warm"
    assert tiny["waiting"] == 2
    assert tiny["in_flight"] == 2
    assert tiny["load_seconds"] == {"H100": {"last": 44.0, "typical": 44.0, "samples": 3}}
    assert tiny["idle_s"] == 0.0  # busy
    assert tiny["leaves_in_s"] is None
    assert tiny["never_leaves"] is True  # keep_alive_s = -1
    first, second = tiny["replicas"]
    assert (first["worker_id"], first["host"], first["state"], first["replica"]) == ("w1", "gpu-a", "warm", 0)
    assert first["loading_elapsed_s"] is None
    assert (second["worker_id"], second["state"], second["replica"]) == ("w2", "loading", 1)
    assert 12 <= second["loading_elapsed_s"] <= 12 + passed
    assert second["loading_expected_s"] == 50

    assert other["state"] == "warm"
    assert 30 <= other["idle_s"] <= 30 + passed
    assert 270 - passed <= other["leaves_in_s"] <= 270
    assert other["never_leaves"] is False
    assert other["failure"]["reason"] == "disk full"
    assert other["failure"]["worker_id"] == "w2"
    assert 20 - passed <= other["failure"]["retry_in_s"] <= 20


async def test_one_model_and_unknown_models(admin: httpx.AsyncClient) -> None:
    one = await admin.get(f"/admin/models/{OTHER}")
    assert one.status_code == 200
    assert one.json()["name"] == OTHER
    missing = await admin.get("/admin/models/nope")
    assert missing.status_code == 404
    assert missing.json()["error"]["code"] == "model_not_found"


@pytest.mark.parametrize("action", ["load", "unload"])
@pytest.mark.parametrize("name", [MODEL, OTHER])
async def test_load_and_unload_leave_a_desired_state_note_the_model_and_poke_the_controllers(
    admin: httpx.AsyncClient, redis: aioredis.Redis, action: str, name: str
) -> None:
    before = time.time()
    response = await admin.post(f"/admin/models/{name}/{action}", json={})
    assert response.status_code == 202
    assert response.json()["name"] == name
    desired = desired_state_decoder.decode(await redis.get(keys.desired_state(name)))
    assert desired.action == action
    assert before <= desired.at <= time.time()
    assert 0 < await redis.ttl(keys.desired_state(name)) <= keys.DESIRED_TTL_S
    ((_, fields),) = await redis.xrange(keys.demand_stream())
    assert fields == {b"m": name.encode()}
    assert 0 < await redis.ttl(keys.demand_stream()) <= keys.DEMAND_TTL_S
    # Controllers read desired states again (the version); a load also has every worker that may
    # hold the model look at it (the demand index), an unload only its holders, which always do.
    assert await redis.get(keys.catalogue_version()) == b"1"
    noted = await redis.hkeys(keys.demand_index())  # type: ignore[misc]
    assert noted == ([name.encode()] if action == "load" else [])


async def test_requests_for_unknown_models_or_actions_are_refused(
    admin: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    unknown = await admin.post("/admin/models/nope/load", json={})
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "model_not_found"
    wrong = await admin.post(f"/admin/models/{MODEL}/explode", json={})
    assert wrong.status_code == 404
    assert wrong.json()["error"]["code"] == "not_found"
    assert not await redis.exists(keys.demand_stream())
    assert not [k async for k in redis.scan_iter(match=keys.desired_state("*"))]


async def test_a_prefetch_of_a_local_folder_is_refused_with_nothing_asked(
    admin: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    refused = await admin.post(f"/admin/models/{MODEL}/prefetch", json={})
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "model"
    assert "local folder" in refused.json()["error"]["message"]
    assert not await redis.exists(keys.prefetch_request(MODEL))
    assert not await redis.exists(keys.demand_stream())


async def test_redis_down_is_a_503(redis_server: PrivateRedis) -> None:
    settings = settings_for(f"redis://127.0.0.1:{free_port()}", models=MODELS)
    async with serving(settings) as client:
        response = await client.get("/admin/models")
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "redis_unavailable"
    assert response.headers["Retry-After"] == "1"
    assert "Redis is unavailable" in response.json()["error"]["message"]
