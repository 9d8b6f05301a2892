"""Token quotas hold exactly with two front doors on one Redis.

Real parts: a redis-server, two front doors (each its own app, Redis clients and admission) serving
on real ports, and keys of the config with a day quota and a team's month quota. A stand-in worker
takes every job with the real consumer group and answers it at once with a usage of at most its
estimate, as an engine held to `max_tokens` does. Many requests of two keys of one team arrive at
both front doors at once: the tokens charged never pass a quota, every refusal is a 429 naming the
quota it met, and the admin API of either front door reads what was charged.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any, cast

import httpx
import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from switchboard import api_keys, keys
from switchboard.config import TeamConfig
from switchboard.local.redis_server import PrivateRedis
from switchboard.quotas import Periods
from switchboard.tasks import cancel_and_wait
from switchboard.wire import Chunk, Usage, job_decoder
from tests.support.front_door_harness import MODEL, serving, settings_for, write_chunks
from tests.support.waits import eventually

# Each request is estimated at 11 tokens: "Hi" (1) and max_tokens 10.
MAX_TOKENS = 10
ESTIMATE = 11
ALICE_PER_DAY = 40  # alice alone: 3 requests at their estimate
TEAM_PER_MONTH = 150  # alice and bob together: 13 at their estimate
REQUESTS_PER_KEY_AND_DOOR = 12

# What XREADGROUP answers: per stream, its entries' ids and fields.
StreamEntries = list[tuple[bytes, list[tuple[bytes, dict[bytes, bytes]]]]] | None


@contextlib.asynccontextmanager
async def stand_in_worker(redis: aioredis.Redis) -> AsyncIterator[Counter[str]]:
    """Answer every job of MODEL at once, each with a usage of 2 to ESTIMATE tokens; yields the
    tokens answered per key."""
    stream = keys.job_stream(MODEL)
    with contextlib.suppress(ResponseError):
        await redis.xgroup_create(stream, keys.JOB_GROUP, id="0", mkstream=True)
    answered: Counter[str] = Counter()

    async def loop() -> None:
        while True:
            response = cast(
                StreamEntries, await redis.xreadgroup(keys.JOB_GROUP, "stand-in", {stream: ">"}, block=100)
            )
            for _, entries in response or ():
                for entry_id, fields in entries:
                    job = job_decoder.decode(fields[keys.JOB_FIELD.encode()])
                    usage = Usage(prompt_tokens=1, completion_tokens=random.randint(1, MAX_TOKENS))
                    answered[job.tenant or ""] += usage.prompt_tokens + usage.completion_tokens
                    await write_chunks(redis, job.id, Chunk(text="ok", finish_reason="stop", usage=usage))
                    await redis.xack(stream, keys.JOB_GROUP, entry_id)
                    await redis.xdel(stream, entry_id)

    task = asyncio.create_task(loop())
    try:
        yield answered
    finally:
        await cancel_and_wait(task)


async def chat(door: httpx.AsyncClient, secret: str) -> httpx.Response:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": MAX_TOKENS}
    return await door.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {secret}"})


async def counted(redis: aioredis.Redis, counter: str) -> int:
    return int(await redis.get(counter) or 0)


async def test_quotas_hold_exactly_with_two_front_doors(
    redis: aioredis.Redis, redis_server: PrivateRedis
) -> None:
    made = {
        "alice": api_keys.make_key("alice", tokens_per_day=ALICE_PER_DAY, team="acme"),
        "bob": api_keys.make_key("bob", team="acme"),
        "ops": api_keys.make_key("ops", admin=True),
    }
    secrets = {name: secret for name, (secret, _) in made.items()}
    settings = settings_for(redis_server.url)
    settings.auth.keys = [record for _, record in made.values()]
    settings.auth.teams = {"acme": TeamConfig(tokens_per_month=TEAM_PER_MONTH)}
    async with serving(settings) as first, serving(settings) as second, stand_in_worker(redis) as answered:
        sent = [
            (name, asyncio.ensure_future(chat(door, secrets[name])))
            for _ in range(REQUESTS_PER_KEY_AND_DOOR)
            for door in (first, second)
            for name in ("alice", "bob")
        ]
        await asyncio.wait_for(asyncio.gather(*(request for _, request in sent)), 60)
        outcomes = Counter((name, request.result().status_code) for name, request in sent)
        for name, request in sent:
            if request.result().status_code == 429:
                _check_quota_refusal(name, request.result())
        assert set(outcomes) <= {(name, status) for name in ("alice", "bob") for status in (200, 429)}
        # At least as many as the quotas' estimates allow were admitted; more only for usage settled
        # below the estimate.
        assert outcomes["alice", 200] + outcomes["bob", 200] >= TEAM_PER_MONTH // ESTIMATE
        assert outcomes["alice", 429] + outcomes["bob", 429] > 0

        periods = Periods.at(time.time())
        alice_day = keys.key_tokens(api_keys.digest(secrets["alice"]), periods.day)
        team_month = keys.team_tokens("acme", periods.month)
        # Each answer's release settles its counters right after it (in the front door's next batch).
        charged = answered["alice"] + answered["bob"]

        async def settled() -> bool:
            return await counted(redis, team_month) == charged

        await eventually(settled, what="the team's counter holds what its keys were charged")
        assert await counted(redis, alice_day) == answered["alice"] <= ALICE_PER_DAY
        assert charged <= TEAM_PER_MONTH
        # Either front door's admin API reads what was charged.
        ops = {"Authorization": f"Bearer {secrets['ops']}"}
        for door in (first, second):
            month = (await door.get("/admin/teams/acme/usage", headers=ops)).json()["month"]
            assert (month["used"], month["limit"]) == (charged, TEAM_PER_MONTH)


def _check_quota_refusal(name: str, response: httpx.Response) -> None:
    """A refusal is a 429 naming the quota it met (alice's own, or the team's), with Retry-After to its reset."""
    error: dict[str, Any] = response.json()["error"]
    assert (error["code"], error["type"]) == ("quota_exceeded", "tokens"), error
    # bob has no quota of his own: only the team's can refuse him.
    quotas = ["team `acme`"] if name == "bob" else ["key `alice`", "team `acme`"]
    assert any(quota in error["message"] for quota in quotas), error
    assert "resets at" in error["message"]
    assert int(response.headers["Retry-After"]) > 0
