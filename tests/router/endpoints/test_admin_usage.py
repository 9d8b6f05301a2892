"""`/admin/usage`, `/admin/keys/{name}/usage`, `/admin/teams/{name}/usage`: the tokens keys and
teams used this UTC day and month, with their quotas and resets; for admin keys only."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
import redis as sync_redis
import redis.asyncio as aioredis

from switchboard import api_keys, keys
from switchboard.config import TeamConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.quotas import Periods, iso_time
from tests.support.front_door_harness import serving, settings_for


@dataclass
class Door:
    """A front door's client, and the secrets of its keys."""

    client: httpx.AsyncClient
    secrets: dict[str, str]

    async def get(self, path: str, key: str | None) -> httpx.Response:
        """GET `path` with key `key` (None: none)."""
        headers = {"Authorization": f"Bearer {self.secrets[key]}"} if key else {}
        return await self.client.get(path, headers=headers)


@pytest.fixture
async def admin(redis: aioredis.Redis, redis_server: PrivateRedis) -> AsyncIterator[Door]:
    """A front door whose config has an admin key, alice (a quota and a team) and bob (neither), and
    team `acme`; carol, of team `beta` (no table), is kept in Redis."""
    settings = settings_for(redis_server.url)
    made = {
        "ops": api_keys.make_key("ops", admin=True),
        "alice": api_keys.make_key("alice", tokens_per_day=1000, team="acme"),
        "bob": api_keys.make_key("bob"),
    }
    settings.auth.keys = [record for _, record in made.values()]
    settings.auth.teams = {"acme": TeamConfig(tokens_per_month=50_000)}
    secrets = {name: secret for name, (secret, _) in made.items()}
    with sync_redis.Redis.from_url(redis_server.url) as client:
        secrets["carol"], _ = api_keys.KeyStore(client).add("carol", team="beta")
    async with serving(settings) as client:
        yield Door(client, secrets)


async def test_every_counted_key_and_team_with_quotas_and_resets(admin: Door, redis: aioredis.Redis) -> None:
    periods = Periods.at(time.time())
    await redis.set(keys.key_tokens(api_keys.digest(admin.secrets["alice"]), periods.day), 120)
    await redis.set(keys.team_tokens("acme", periods.month), 900)
    response = await admin.get("/admin/usage", "ops")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "list"
    assert [(u["kind"], u["name"]) for u in body["data"]] == [
        ("key", "alice"),
        ("key", "carol"),
        ("team", "acme"),
        ("team", "beta"),
    ]
    alice, _, acme, _ = body["data"]
    assert alice == {
        "name": "alice",
        "kind": "key",
        "team": "acme",
        "day": {
            "period": periods.day.removeprefix("day:"),
            "used": 120,
            "limit": 1000,
            "resets_at": iso_time(periods.day_ends),
        },
        "month": {
            "period": periods.month.removeprefix("month:"),
            "used": 0,
            "limit": None,
            "resets_at": iso_time(periods.month_ends),
        },
        "object": "usage",
    }
    assert (acme["day"]["used"], acme["month"]["used"], acme["month"]["limit"]) == (0, 900, 50_000)


async def test_one_key_or_team_and_unknown_names(admin: Door) -> None:
    bob = (await admin.get("/admin/keys/bob/usage", "ops")).json()
    assert (bob["day"]["used"], bob["month"]["used"]) == (None, None)  # nothing is counted for bob
    carol = (await admin.get("/admin/keys/carol/usage", "ops")).json()
    assert (carol["team"], carol["day"]["used"]) == ("beta", 0)
    assert (await admin.get("/admin/teams/beta/usage", "ops")).json()["kind"] == "team"
    missing = await admin.get("/admin/keys/nobody/usage", "ops")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "key_not_found")
    missing = await admin.get("/admin/teams/nobody/usage", "ops")
    assert (missing.status_code, missing.json()["error"]["code"]) == (404, "team_not_found")


async def test_a_key_that_is_no_admin_key_reads_no_usage(admin: Door) -> None:
    for path in ("/admin/usage", "/admin/keys/alice/usage", "/admin/teams/acme/usage"):
        refused = await admin.get(path, "alice")
        assert (refused.status_code, refused.json()["error"]["code"]) == (403, "admin_key_required")
        assert (await admin.get(path, None)).status_code == 401
