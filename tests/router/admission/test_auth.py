"""API keys at the front door: 401, 403, filtered models, admin endpoints, keys read from Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import pytest
import redis.asyncio as aioredis

from router.admission.auth import Caller, KeyTable, auth_always_on, bearer_token, check_exposure
from router.openai.errors import AuthenticationError
from switchboard import api_keys, keys
from switchboard.config import ApiKey, ConfigError, ModelConfig, Settings
from switchboard.local.redis_server import PrivateRedis
from switchboard.ports import free_port
from tests.support.front_door_harness import (
    BODY,
    MODEL,
    answer_ok,
    next_job,
    serving,
    settings_for,
)
from tests.support.network import accepts
from tests.support.waits import eventually

OTHER = "other"
MODELS = [ModelConfig(name=MODEL, path="/nonexistent"), ModelConfig(name=OTHER, path="/nonexistent")]
USER_SECRET = api_keys.new_secret()
ADMIN_SECRET = api_keys.new_secret()


def keyed_settings(redis_url: str, **overrides: object) -> Settings:
    settings = settings_for(redis_url, timeout_s=5.0, models=MODELS)
    settings.auth.keys = [
        ApiKey(name="user", sha256=api_keys.digest(USER_SECRET), models=[MODEL]),
        ApiKey(name="ops", sha256=api_keys.digest(ADMIN_SECRET), admin=True),
    ]
    for name, value in overrides.items():
        setattr(settings.auth, name, value)
    return settings


def bearer(secret: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {secret}"}


@pytest.fixture
async def front_door(redis: aioredis.Redis, redis_server: PrivateRedis) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(keyed_settings(redis_server.url)) as client:
        yield client


@pytest.fixture
def restore_prefix() -> Iterator[None]:
    yield
    keys.set_prefix("sb")


async def test_without_any_key_a_loopback_front_door_is_open(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    async with serving(settings_for(redis_server.url, models=MODELS)) as client:
        listed = await client.get("/v1/models", headers=bearer("anything"))
        assert [m["id"] for m in listed.json()["data"]] == [MODEL, OTHER]
        assert (await client.get("/admin/models")).status_code == 200


async def test_a_request_without_a_key_or_with_an_unknown_one_is_a_401(front_door: httpx.AsyncClient) -> None:
    missing = await front_door.post("/v1/chat/completions", json=BODY)
    assert missing.status_code == 401
    assert missing.json()["error"]["code"] == "missing_api_key"
    assert missing.json()["error"]["type"] == "invalid_request_error"
    wrong_secret = api_keys.new_secret()
    wrong = await front_door.get("/v1/models", headers=bearer(wrong_secret))
    assert wrong.status_code == 401
    error = wrong.json()["error"]
    assert error["code"] == "invalid_api_key"
    assert api_keys.mask(wrong_secret) in error["message"]
    assert wrong_secret not in error["message"]
    basic = await front_door.get("/v1/models", headers={"Authorization": f"Basic {USER_SECRET}"})
    assert basic.status_code == 401


async def test_health_checks_need_no_key(front_door: httpx.AsyncClient) -> None:
    assert (await front_door.get("/healthz")).status_code == 200
    assert (await front_door.get("/readyz")).json()["error"]["code"] != "missing_api_key"


async def test_a_key_sees_and_uses_only_its_models(
    front_door: httpx.AsyncClient, redis: aioredis.Redis
) -> None:
    listed = await front_door.get("/v1/models", headers=bearer(USER_SECRET))
    assert [m["id"] for m in listed.json()["data"]] == [MODEL]
    forbidden = await front_door.post(
        "/v1/chat/completions", json={**BODY, "model": OTHER}, headers=bearer(USER_SECRET)
    )
    assert forbidden.status_code == 403
    assert forbidden.json()["error"]["code"] == "model_not_allowed"
    assert forbidden.json()["error"]["param"] == "model"
    assert not await redis.exists(keys.job_stream(OTHER))
    # An allowed model: the job carries the key's name as its tenant.
    request = asyncio.create_task(
        front_door.post("/v1/chat/completions", json=BODY, headers=bearer(USER_SECRET))
    )
    job = await next_job(redis)
    assert job.tenant == "user"
    await answer_ok(redis, job.id)
    assert (await request).status_code == 200
    # Its slot is back: nothing is in flight (a key without a parallel limit has its answer without
    # waiting for the release, which follows within moments).

    async def nothing_in_flight() -> bool:
        return not await redis.zcard(keys.in_flight())

    await eventually(nothing_in_flight, timeout_s=5, what="the request's slot given back")


async def test_admin_endpoints_need_an_admin_key(front_door: httpx.AsyncClient) -> None:
    assert (await front_door.get("/admin/models")).status_code == 401
    refused = await front_door.get("/admin/models", headers=bearer(USER_SECRET))
    assert refused.status_code == 403
    assert refused.json()["error"]["code"] == "admin_key_required"
    refused_post = await front_door.post(f"/admin/models/{MODEL}/load", headers=bearer(USER_SECRET))
    assert refused_post.status_code == 403
    assert (await front_door.get("/admin/models", headers=bearer(ADMIN_SECRET))).status_code == 200
    # An admin key may use every model too.
    listed = await front_door.get("/v1/models", headers=bearer(ADMIN_SECRET))
    assert [m["id"] for m in listed.json()["data"]] == [MODEL, OTHER]


async def test_an_admin_key_can_come_as_a_hash_from_the_environment(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, models=MODELS)
    settings.auth.admin_key_sha256 = api_keys.digest(ADMIN_SECRET)
    async with serving(settings) as client:
        assert (await client.get("/admin/models")).status_code == 401
        assert (await client.get("/admin/models", headers=bearer(ADMIN_SECRET))).status_code == 200


async def test_keys_added_to_or_removed_from_redis_apply_within_the_cache_time(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, models=MODELS)
    settings.auth.cache_s = 0.2
    secret, record = api_keys.make_key("late", models=[OTHER], rpm=10)
    async with serving(settings) as client:
        assert (await client.get("/v1/models")).status_code == 200  # no key anywhere: open
        await redis.hset(keys.api_keys(), record.sha256, api_keys.encode_record(record))
        await asyncio.sleep(0.3)
        assert (await client.get("/v1/models")).status_code == 401
        listed = await client.get("/v1/models", headers=bearer(secret))
        assert [m["id"] for m in listed.json()["data"]] == [OTHER]
        await redis.hdel(keys.api_keys(), record.sha256)
        await asyncio.sleep(0.3)
        assert (await client.get("/v1/models", headers=bearer(secret))).status_code == 200  # open again


async def test_finding_a_key_takes_the_same_work_however_many_keys_exist(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    """A wrong key costs one lookup, not a comparison with every stored key: 20,000 keys take no
    longer to refuse it than one (compared one by one, they took thousands of times longer)."""
    settings = settings_for(redis_server.url, models=MODELS)
    secret, record = api_keys.make_key("only")
    await redis.hset(keys.api_keys(), record.sha256, api_keys.encode_record(record))
    few = await _fastest_refusal(KeyTable(redis, settings))
    many = {
        api_keys.digest(str(index)): api_keys.encode_record(
            ApiKey(name=f"k{index}", sha256=api_keys.digest(str(index)))
        )
        for index in range(20_000)
    }
    await redis.hset(keys.api_keys(), mapping=many)  # type: ignore[arg-type]
    table = KeyTable(redis, settings)
    assert (await table.resolve(f"Bearer {secret}")).name == "only"
    assert table.stored_count == 20_001
    # The fastest of many tries: a busy machine only ever adds time.
    assert await _fastest_refusal(table) < 3 * few + 0.000_2


async def _fastest_refusal(table: KeyTable) -> float:
    """The shortest time `table` took to refuse a wrong key, of 50 tries (its copy read first)."""
    await table.load()
    fastest = float("inf")
    for _ in range(50):
        started = time.perf_counter()
        with pytest.raises(AuthenticationError):
            await table.resolve(f"Bearer {api_keys.new_secret()}")
        fastest = min(fastest, time.perf_counter() - started)
    return fastest


async def test_auth_required_refuses_everyone_while_no_key_exists(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    settings = settings_for(redis_server.url, models=MODELS)
    settings.auth.required = True
    async with serving(settings) as client:
        assert (await client.get("/v1/models", headers=bearer(USER_SECRET))).status_code == 401


async def test_a_full_redis_is_a_503_with_retry_after() -> None:
    with PrivateRedis(maxmemory="3mb") as server:
        client = aioredis.Redis.from_url(server.url)
        try:
            async with serving(settings_for(server.url)) as front_door:
                for index in range(1000):
                    try:
                        await client.set(f"filler:{index}", b"x" * 100_000)
                    except aioredis.ResponseError:
                        break
                response = await front_door.post("/v1/chat/completions", json=BODY)
        finally:
            await client.aclose()
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "redis_full"
    assert int(response.headers["Retry-After"]) >= 1


async def test_the_key_prefix_moves_every_key(
    redis: aioredis.Redis, redis_server: PrivateRedis, restore_prefix: None
) -> None:
    settings = settings_for(redis_server.url, timeout_s=0.3)
    settings.redis.key_prefix = "tenant-b"
    keys.set_prefix(settings.redis.key_prefix)  # what the CLI does at a process's start
    async with serving(settings) as client:
        await client.post("/v1/chat/completions", json=BODY)
    written = {k.decode() async for k in redis.scan_iter(match="*")}
    assert "tenant-b:model:{tiny}:jobs" in written
    assert all(k.startswith("tenant-b:") for k in written), written


def test_bearer_tokens_are_read_from_the_header() -> None:
    assert bearer_token("Bearer sb-abc") == "sb-abc"
    assert bearer_token("bearer   sb-abc ") == "sb-abc"
    assert bearer_token("Basic sb-abc") is None
    assert bearer_token("Bearer ") is None
    assert bearer_token(None) is None


def test_exposure_beyond_loopback_needs_a_key_or_an_explicit_choice(caplog: pytest.LogCaptureFixture) -> None:
    settings = settings_for("redis://unused")
    check_exposure(settings, stored_keys=0)  # 127.0.0.1 by default
    assert not auth_always_on(settings)
    settings.router.host = "0.0.0.0"
    with pytest.raises(ConfigError, match="switchboard keys add"):
        check_exposure(settings, stored_keys=0)
    check_exposure(settings, stored_keys=1)
    # Beyond loopback a key is asked for even once the last key is gone.
    assert auth_always_on(settings)
    settings.router.allow_open_access = True
    with caplog.at_level(logging.WARNING, logger="router.admission.auth"):
        check_exposure(settings, stored_keys=0)
    assert "without API keys" in caplog.text
    assert not auth_always_on(settings)


def test_a_router_process_beyond_loopback_needs_a_key_or_open_access(redis_server: PrivateRedis) -> None:
    port = free_port()
    argv = [sys.executable, "-m", "switchboard", "router", "--host", "0.0.0.0", "--port", str(port)]
    env = {**os.environ, "REDIS_URL": redis_server.url}
    refused = subprocess.run(argv, env=env, capture_output=True, timeout=120)
    assert refused.returncode == 2
    assert b"switchboard keys add" in refused.stderr
    assert b"allow_open_access" in refused.stderr
    env["SWITCHBOARD_ROUTER__ALLOW_OPEN_ACCESS"] = "true"
    with subprocess.Popen(argv, env=env, stderr=subprocess.PIPE) as serving_everyone:
        try:
            for _ in range(600):
                if accepts("127.0.0.1", port):
                    break
                assert serving_everyone.poll() is None, serving_everyone.stderr
                time.sleep(0.1)
            else:
                pytest.fail("the front door did not start with allow_open_access")
        finally:
            serving_everyone.terminate()
            _, stderr = serving_everyone.communicate(timeout=30)
    assert b"serving without API keys" in stderr


def test_a_key_may_be_given_a_prefix_of_models() -> None:
    caller = Caller(name="acme", key_sha256="x", models=frozenset({"acme/*", "shared"}))
    assert caller.may_use("acme/support-v3") and caller.may_use("acme/") and caller.may_use("shared")
    assert (
        not caller.may_use("other/support") and not caller.may_use("acme") and not caller.may_use("shared-2")
    )
