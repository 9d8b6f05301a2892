"""Operator endpoints for the tokens keys and teams used (`switchboard.quotas`): this UTC day's and
month's, with their quotas and when each resets, as `switchboard keys usage` prints them.

- `GET /admin/usage`: every key with a quota or a team, by name, then every team;
- `GET /admin/keys/{name}/usage`: one key, any key (one without quota or team reads `used: null`:
  nothing is counted for it);
- `GET /admin/teams/{name}/usage`: one team, configured (`[auth.teams.NAME]`) or named by a key.

The keys are read at each call, the config's and Redis's (one HGETALL, not the front door's copy,
which may be `auth.cache_s` old), and the counters in one MGET. A counter holds what requests used
plus what those in flight reserved, so the numbers are those admission decides on.
"""

from __future__ import annotations

import time
from typing import cast

import redis.asyncio as aioredis
from litestar import Response, get

from router.http.answers import json_response
from router.openai.errors import OpenAIError
from switchboard import api_keys, keys
from switchboard.config import ApiKey, Settings
from switchboard.quotas import (
    Counted,
    Periods,
    QuotaUsage,
    UsageList,
    counted_key,
    counted_team,
    counter_keys,
    everyone_counted,
    usage_of,
)


class UsageNotFoundError(OpenAIError):
    """No key, or no team, of that name (404)."""

    status_code = 404
    error_type = "invalid_request_error"
    default_code = "not_found"


@get("/usage")
async def list_usage(redis: aioredis.Redis, settings: Settings) -> Response[bytes]:
    """Every counted key's and every team's tokens this day and month."""
    counted = everyone_counted(await _all_keys(redis, settings), settings.auth.teams)
    return json_response(UsageList(data=await _usage(redis, counted)))


@get("/keys/{name:str}/usage")
async def key_usage(name: str, redis: aioredis.Redis, settings: Settings) -> Response[bytes]:
    """One key's tokens this day and month, or a 404."""
    key = next((k for k in await _all_keys(redis, settings) if k.name == name), None)
    if key is None:
        raise UsageNotFoundError(f"No key named `{name}` (in the config or in Redis).", code="key_not_found")
    (usage,) = await _usage(redis, [counted_key(key)])
    return json_response(usage)


@get("/teams/{name:str}/usage")
async def team_usage(name: str, redis: aioredis.Redis, settings: Settings) -> Response[bytes]:
    """One team's tokens this day and month, or a 404."""
    named = {k.team for k in await _all_keys(redis, settings)} | set(settings.auth.teams)
    if name not in named:
        raise UsageNotFoundError(
            f"No team named `{name}`: none is configured ([auth.teams.{name}]), and no key names it.",
            code="team_not_found",
        )
    (usage,) = await _usage(redis, [counted_team(name, settings.auth.teams)])
    return json_response(usage)


USAGE_HANDLERS = [list_usage, key_usage, team_usage]


async def _all_keys(redis: aioredis.Redis, settings: Settings) -> list[ApiKey]:
    """The keys of the config, then Redis's."""
    stored = cast(dict[bytes, bytes], await redis.hgetall(keys.api_keys()))
    return [*settings.auth.keys, *api_keys.decode_stored(stored)]


async def _usage(redis: aioredis.Redis, counted: list[Counted]) -> list[QuotaUsage]:
    """The usage of `counted` now, its counters read in one round trip."""
    periods = Periods.at(time.time())
    names = counter_keys(counted, periods)
    values = await redis.mget(names) if names else []
    return usage_of(counted, periods, values)
