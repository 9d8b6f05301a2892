"""A key's limits are its secret's, not its name's: renaming a key keeps its budget, a new key that
takes an old name starts with its own, and the config refuses the names the product gives itself.
Real Redis, the front door on a real port; the test plays the worker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
import redis.asyncio as aioredis

from switchboard import api_keys, keys
from switchboard.config import ApiKey, ConfigError, load_settings
from switchboard.local.redis_server import PrivateRedis
from tests.support.front_door_harness import BODY, MODEL, answer_ok, next_job, serving, settings_for

FIRST_SECRET, SECOND_SECRET = api_keys.new_secret(), api_keys.new_secret()


async def ask(client: httpx.AsyncClient, secret: str) -> httpx.Response:
    return await client.post("/v1/chat/completions", json=BODY, headers={"Authorization": f"Bearer {secret}"})


async def answered(client: httpx.AsyncClient, redis: aioredis.Redis, secret: str) -> httpx.Response:
    """A request that is admitted, answered by the test as the worker (its job then taken off the
    stream, where the next one is looked for)."""
    request = asyncio.ensure_future(ask(client, secret))
    job = await next_job(redis)
    await answer_ok(redis, job.id)
    response = await request
    await redis.delete(keys.job_stream(MODEL))
    return response


async def test_a_keys_budget_follows_its_secret_not_its_name(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    # An admitted request nobody answers ends within seconds.
    settings = settings_for(redis_server.url, timeout_s=2.0)
    settings.auth.keys = [ApiKey(name="team", sha256=api_keys.digest(FIRST_SECRET), rpm=1)]
    async with serving(settings) as client:
        assert (await answered(client, redis, FIRST_SECRET)).status_code == 200
        assert (await ask(client, FIRST_SECRET)).status_code == 429
    # The operator renames the key: its budget is spent all the same.
    settings.auth.keys = [ApiKey(name="renamed", sha256=api_keys.digest(FIRST_SECRET), rpm=1)]
    async with serving(settings) as client:
        refused = await ask(client, FIRST_SECRET)
        assert refused.status_code == 429
        assert "`renamed`" in refused.json()["error"]["message"]
    # Another key takes the old name: its budget is its own.
    settings.auth.keys = [ApiKey(name="team", sha256=api_keys.digest(SECOND_SECRET), rpm=1)]
    async with serving(settings) as client:
        assert (await answered(client, redis, SECOND_SECRET)).status_code == 200


def config_with_key(tmp_path: Path, name: str) -> Path:
    path = tmp_path / "switchboard.toml"
    path.write_text(
        '[[models]]\nname = "tiny"\npath = "/nonexistent"\n\n'
        f'[[auth.keys]]\nname = "{name}"\nsha256 = "{api_keys.digest(FIRST_SECRET)}"\n'
    )
    return path


@pytest.mark.parametrize("name", ["admin", "anonymous", "Admin", "ANONYMOUS"])
def test_the_config_refuses_a_key_named_as_the_admin_key_or_the_keyless_caller(
    tmp_path: Path, name: str
) -> None:
    with pytest.raises(ConfigError, match=f"auth.keys: the key name '{name}' is reserved"):
        load_settings(config_with_key(tmp_path, name), environ={})


@pytest.mark.parametrize("name", ["admins", "anonymous-team", "ops-admin", "team@example.com"])
def test_names_beside_the_reserved_ones_are_kept(tmp_path: Path, name: str) -> None:
    settings = load_settings(config_with_key(tmp_path, name), environ={})
    assert [key.name for key in settings.auth.keys] == [name]
